// Owns the per-step metadata of the hybrid model's two layer groups, built from the same reordered batch as the
// Mamba metadata (decodes first): vLLM's LinearAttentionMetadata for lightning layers (vllm-ssm-design.md §2.4)
// and paged-attention metadata (block tables, slot mapping, seq_lens) for the softmax layers. Pure: no engine state.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/batch_metadata.h"

namespace ssmserve {

/// Metadata of the linear-attention (lightning) layers over the reordered batch (rows as in
/// MambaBatchMetadata: decodes, padded decodes, prefills).
struct LinearAttentionMetadata {
  int num_prefills = 0;
  int num_prefill_tokens = 0;
  int num_decodes = 0;        ///< decode rows incl. padded ones (padded rows hold state index 0)
  int num_decode_tokens = 0;  ///< tokens of the decode rows (== num_decodes without speculative verify rows)
  std::vector<int32_t> query_start_loc;       ///< [B + 1] token offsets of every row
  std::vector<int32_t> seq_lens;              ///< [B] tokens in the sequence after this step (0 for padded rows)
  std::vector<int32_t> state_indices_tensor;  ///< [B] state block of every row (0 = null block, skipped)
  std::vector<int32_t> num_computed_tokens;   ///< [B] seq_lens - query length (tokens already in the state)
};

/// Metadata of the softmax-attention layers (paged KV cache, vLLM's block tables + slot mapping).
struct PagedAttentionMetadata {
  int block_size = 0;              ///< tokens per KV block
  int max_num_blocks_per_seq = 0;  ///< columns of block_tables
  std::vector<int32_t> block_tables;     ///< [B, max_num_blocks_per_seq] KV block ids, 0-padded
  std::vector<int32_t> seq_lens;         ///< [B] context length incl. this step's tokens (0 for padded rows)
  std::vector<int32_t> query_start_loc;  ///< [B + 1]
  std::vector<int32_t> slot_mapping;     ///< [T] block * block_size + offset of each new token; -1 on padded rows
  std::vector<int32_t> positions;        ///< [T] sequence position of each token (RoPE)
};

/// Builds both from the step's scheduled sequences (input order), each sequence's KV block table (block ids
/// covering at least num_computed_tokens + num_scheduled_tokens tokens) and the already-built Mamba metadata
/// `meta` (its row order and padding). kv_block_size 0 = no softmax layers: `paged` is left empty.
/// Throws Error when a block table is too short or holds a block id < 1, or sizes disagree.
void build_attention_metadata(std::span<const ScheduledSeq> seqs, std::span<const std::vector<int32_t>> block_tables,
                              int kv_block_size, const MambaBatchMetadata& meta, LinearAttentionMetadata& linear,
                              PagedAttentionMetadata& paged);

}  // namespace ssmserve
