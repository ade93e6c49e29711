// Owns the one batch builder: a step's scheduled sequences -> the complete ForwardBatch a model runs (packed token ids
// decodes first, the recurrent-layer metadata, and the linear-attention / paged-attention metadata when the model has
// such layers), and the one rule that classifies a row as a decode. The engine and the tests build batches here.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/attention_metadata.h"
#include "model/forward_batch.h"

namespace ssmserve {

/// The one decode rule (vLLM's split_decodes_and_prefills with treat_short_extends_as_decodes=False, and its
/// is_prefilling = computed < prompt length): a request is a decode row iff it is past its prompt (num_computed_tokens
/// >= prompt_len) and its state holds every token but the last one it knows (num_tokens - num_computed_tokens == 1),
/// so it schedules exactly that one token. A prompt's last one-token chunk is a (one-token) prefill row: the chunked
/// forms (SSD, lightning, the gated delta rule) then round it as an uncut prompt does, which prefix-cache hits and
/// chunk cuts on the chunk grid rely on for bit-identical results. The scheduler orders its running requests by it and
/// the engine marks ScheduledSeq::is_prefilling with it.
inline bool is_decode_row(int32_t num_computed_tokens, int32_t num_tokens, int32_t prompt_len) {
  return num_computed_tokens >= prompt_len && num_computed_tokens > 0 && num_tokens - num_computed_tokens == 1;
}

/// What the builder builds besides the recurrent-layer metadata (from the model: CausalLM::kv_block_size and
/// CausalLM::has_linear_attention).
struct BatchBuilderOptions {
  MetadataOptions meta;            ///< chunk size, 'all'-mode block size, decode padding
  int kv_block_size = 0;           ///< softmax layers' KV block size (0: none, no paged-attention metadata)
  bool linear_attention = false;   ///< lightning / softmax layers: build the LinearAttentionMetadata
};

/// Builds one step's batch: seqs[i] schedules tokens[i] (its num_scheduled_tokens new ids); block_tables[i] is its KV
/// block table (read only when opt.kv_block_size > 0; may then not be empty). logits_indices is left to the caller.
/// Throws Error as make_forward_batch / build_attention_metadata do (mismatched sizes, invalid sequences, short block
/// tables).
ForwardBatch build_forward_batch(std::span<const ScheduledSeq> seqs, std::span<const std::vector<int32_t>> tokens,
                                 std::span<const std::vector<int32_t>> block_tables, const BatchBuilderOptions& opt);

}  // namespace ssmserve
