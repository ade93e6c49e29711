// Owns the per-step Mamba batch metadata builder: one step's scheduled requests -> the reordered, split and
// chunked index arrays the recurrent-layer kernels consume (vLLM's BaseMambaAttentionMetadata, Mamba2
// chunk metadata and decode CUDA-graph padding; vllm-ssm-design.md §2.1-§2.3, §6.2). Pure: no engine state.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/decode_rows.h"

namespace ssmserve {

/// Prefix caching's "all" mode (docs/architecture.md §3a): after the first `offset` tokens a prefill row schedules
/// this step (0 < offset < num_scheduled_tokens), the prefill copies every recurrent layer's state (conv window and
/// SSM state) into cached block `block` (>= 1, not the row's own state block). The scheduler allocated the block for
/// the block boundary at sequence position num_computed_tokens + offset.
struct StateStore {
  int32_t offset = 0;
  int32_t block = 0;
};

/// One scheduled request as the builder sees it. This step feeds sequence positions
/// [num_computed_tokens, num_computed_tokens + num_scheduled_tokens).
struct ScheduledSeq {
  int32_t state_block;           ///< the request's running-state block id (>= 1; 0 is the null block)
  int32_t num_computed_tokens;   ///< tokens already folded into the state before this step (>= 0)
  int32_t num_scheduled_tokens;  ///< tokens this step (>= 1)
  bool is_prefilling;            ///< num_computed_tokens < prompt length (vLLM's is_prefilling)
  /// Speculative decoding: a decode row (not prefilling) of 1 + k tokens (the last sampled token and k drafts, a
  /// verify row) leaves the state after token j in column j: column 0 is state_block, column j >= 1 is
  /// spec_state_blocks[j - 1] ([>= num_scheduled_tokens - 1] block ids >= 1; kernels/decode_rows.h).
  std::span<const int32_t> spec_state_blocks = {};
  /// Prefill rows only ("all" mode): states to store inside this row, offsets strictly increasing (not owned: the
  /// scheduler's ScheduledRequest outlives the build).
  std::span<const StateStore> state_stores = {};
};

/// Builder options (derived once from the model and engine config by the caller).
struct MetadataOptions {
  /// SSD chunk length in tokens (>= 1): the model's `chunk_size` / `mamba_chunk_size`. For Mamba1 in 'all'
  /// mode pass the mamba block size (chunk = block, §2.2).
  int chunk_size = 256;
  /// 'all'-mode state block size in tokens; 0 = don't compute the block_idx_* arrays. When > 0 it must be a
  /// multiple of chunk_size (§3.4; the §8 defect 4 guard), since states are captured at chunk ends.
  int mamba_block_size = 0;
  /// Decode CUDA-graph capture size: 0 = no padding; else a decode-only batch with 1..pad_decodes_to rows
  /// is padded up to exactly pad_decodes_to rows with null-block rows (§6.2). Batches with any prefill, or
  /// with more decodes than this, are not padded (they run eagerly).
  int pad_decodes_to = 0;
};

/// One step's metadata over the reordered batch: rows [0, num_decodes) are real decodes, then
/// [num_decodes, num_decodes + num_padded_decodes) are padded decode rows, then num_prefills prefill rows.
/// Padding only happens when num_prefills == 0, so the two never coexist.
///
/// Classification (vLLM's split_decodes_and_prefills with treat_short_extends_as_decodes=False, §2.1): a row
/// is a decode iff !is_prefilling and it has one token, or 1 + k tokens as a speculative verify row (with
/// spec_state_blocks: a state column per token, §6.1). A still-prefilling 1-token row stays a prefill, and so does a
/// row of several tokens without state columns. vLLM's #42430 exception (a 1-token prefill with prior state turned into a decode) is NOT
/// applied: it exists only because vLLM picks a full decode graph from the batch *shape*; here graph
/// padding is decided from this classification (num_prefills == 0), so a prefill row never lands in a
/// decode graph, and our prefill path (conv + scan from has_initial_states_p) handles 1-token chunks exactly.
///
/// Padded rows (§6.2): each owns exactly ONE dummy token (the runner feeds any valid token id there), state
/// block 0, num_accepted_tokens 1 and block indices 0. Without verify rows the decode part is uniform: decode
/// row r (real or padded) is token row r, and the token count the kernels see is query_start_loc.back()
/// = num_decode_tokens + num_padded_decodes. With verify rows (spec_cols > 1; never padded) decode row r owns
/// tokens [query_start_loc_d[r], query_start_loc_d[r + 1]). Decode-kernel contract: decode_rows()
/// (kernels/decode_rows.h); a row whose block id is 0 reads and writes no state (its output row is don't-care).
/// (vLLM instead gives padded rows 0 tokens; we keep 1 so token and row counts agree.)
///
/// All index arrays are int32 (has_initial_states_p: uint8 0/1), host memory.
struct MambaBatchMetadata {
  int num_prefills = 0;         ///< prefill rows
  int num_prefill_tokens = 0;   ///< tokens of the prefill rows
  int num_decodes = 0;          ///< real decode rows (1 token each)
  int num_decode_tokens = 0;    ///< tokens of the real decode rows (== num_decodes without verify rows; padding not counted)
  int num_reqs = 0;             ///< num_decodes + num_padded_decodes + num_prefills
  int num_padded_decodes = 0;   ///< null-block decode rows added beyond num_decodes

  std::vector<int32_t> order;            ///< [num_decodes + num_prefills] index into `seqs` of each real row;
                                         ///< decodes first, input order kept within each class
  std::vector<int32_t> query_start_loc;  ///< [num_reqs + 1] token offsets over the reordered batch incl. padded
                                         ///< rows (1 token each); query_start_loc[0] = 0
  std::vector<int32_t> query_start_loc_p;  ///< [num_prefills + 1] prefill part of query_start_loc minus
                                           ///< num_decode_tokens (starts at 0); empty if num_prefills == 0
  std::vector<int32_t> query_start_loc_d;  ///< [num_decode_rows() + 1] token offsets of the decode rows (0, 1, 2,
                                           ///< ... without verify rows)
  std::vector<uint8_t> has_initial_states_p;   ///< [num_prefills] num_computed_tokens > 0: load the state
  std::vector<int32_t> num_computed_tokens_p;  ///< [num_prefills]
  std::vector<int32_t> state_indices_tensor_p; ///< [num_prefills] running-state block ids
  std::vector<int32_t> state_indices_tensor_d; ///< [num_decode_rows()] block ids; padded rows = 0 (null block)
  std::vector<int32_t> num_accepted_tokens;    ///< [num_decode_rows()] all 1: the engine swaps the column of the
                                               ///< last accepted token into column 0 (§6.1), so every row continues
                                               ///< from column 0
  int spec_cols = 1;                           ///< state columns per decode row: the longest decode row's tokens
  std::vector<int32_t> state_indices_spec_d;   ///< [num_decode_rows(), spec_cols] when spec_cols > 1 (else empty):
                                               ///< column j of row r is the block of its token j's state (0 past
                                               ///< the row's tokens); column 0 = state_indices_tensor_d
  bool prep_initial_states = false;            ///< any(has_initial_states_p) (Mamba2: skip the state gather)

  // Chunk metadata over the prefill tokens, sequence-relative (§2.3): a chunk never spans two sequences and
  // every inner boundary of a sequence sits at a multiple of chunk_size counted from that sequence's start.
  int chunk_size = 0;                        ///< copy of MetadataOptions::chunk_size
  std::vector<int32_t> cu_chunk_seqlen_p;    ///< [nchunks + 1] chunk starts in prefill-token coordinates
                                             ///< (0-based like query_start_loc_p), then num_prefill_tokens
  std::vector<int32_t> seq_idx_p;            ///< [nchunks] prefill row (0..num_prefills-1) of each chunk
  std::vector<int32_t> last_chunk_indices_p; ///< [num_prefills] index of each prefill row's last chunk

  // 'all'-mode block indices (§2.2), empty unless MetadataOptions::mamba_block_size > 0. With bs = block size,
  // c = num_computed_tokens, s = c + num_scheduled_tokens; padded rows hold 0.
  std::vector<int32_t> block_idx_last_computed_token;      ///< [num_reqs] max(cdiv(c, bs) - 1, 0)
  std::vector<int32_t> block_idx_first_scheduled_token_p;  ///< [num_prefills] cdiv(c + 1, bs) - 1
  std::vector<int32_t> block_idx_last_scheduled_token;     ///< [num_reqs] max(cdiv(s, bs) - 1, 0)

  // "all"-mode state stores of the prefill rows (StateStore), in CSR form; all three empty when no row stores.
  // Kernels that take them split each prefill row at its store offsets and copy the state after each piece
  // (model/mixers/prefill_segments.h); the pieces start on the chunk grid (block sizes are multiples of the chunk).
  std::vector<int32_t> state_store_start_p;   ///< [num_prefills + 1] prefill row p's stores are [start[p], start[p+1])
  std::vector<int32_t> state_store_offset_p;  ///< [stores] tokens of the row before the store, in (0, row length)
  std::vector<int32_t> state_store_block_p;   ///< [stores] destination block ids

  /// Whether any prefill row stores states inside itself ("all" mode).
  bool has_state_stores() const { return !state_store_offset_p.empty(); }
  /// Decode rows the decode kernels run over, padding included.
  int num_decode_rows() const { return num_decodes + num_padded_decodes; }
  /// The decode rows as the recurrent decode kernels take them (kernels/decode_rows.h).
  DecodeRows decode_rows() const;
  /// Number of chunks over the prefill tokens.
  int num_chunks() const { return static_cast<int>(seq_idx_p.size()); }
};

/// Builds one step's metadata. seqs: [num_scheduled_requests] in scheduling order (any mix of decodes and
/// prefills; may be empty). Throws ssmserve::Error on a state_block < 1, num_computed_tokens < 0,
/// num_scheduled_tokens < 1, a decode row (not prefilling, 1 token) with num_computed_tokens == 0 (nothing
/// to continue from), state stores on a decode row or with offsets outside (0, num_scheduled_tokens), not increasing,
/// or a block < 1 or equal to the row's state block, a step whose token total or sequence end overflows int32, or invalid options
/// (chunk_size < 1, mamba_block_size < 0 or not a multiple of chunk_size, pad_decodes_to < 0).
MambaBatchMetadata build_mamba_metadata(std::span<const ScheduledSeq> seqs, const MetadataOptions& opt);

/// Same, refilling `out` in place so that a runner reusing one object per step stops allocating once the
/// vectors have grown to the largest batch seen. On error `out` is left in an unspecified but valid state.
void build_mamba_metadata(std::span<const ScheduledSeq> seqs, const MetadataOptions& opt, MambaBatchMetadata& out);

}  // namespace ssmserve
