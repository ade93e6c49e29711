// Owns ForwardBatch: the packed, per-step input a model's forward pass consumes: token ids in the metadata's
// row order (decodes first), the recurrent-layer metadata (vllm-ssm-design.md §2.2) and the rows whose logits
// the caller wants.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/attention_metadata.h"
#include "model/batch_metadata.h"

namespace ssmserve {

/// One step's packed batch. Token rows [0, meta.query_start_loc[meta.num_decode_rows()]) are decode rows (one
/// token each; padded rows carry token 0 and the null block), the rest are the prefill rows of
/// meta.query_start_loc_p, shifted by that offset.
struct ForwardBatch {
  std::vector<int32_t> input_ids;        ///< [num_tokens] in row order
  MambaBatchMetadata meta;               ///< decodes first; see batch_metadata.h
  std::vector<int32_t> logits_indices;   ///< token rows whose logits the caller wants, in output order
  std::vector<int32_t> seq_first_token;  ///< [num input seqs] token row of each input sequence's first new token
  /// Hybrid models (lightning + softmax layers) only, filled by build_attention_metadata in the same step.
  LinearAttentionMetadata linear_meta;
  PagedAttentionMetadata attn_meta;

  int num_tokens() const { return static_cast<int>(input_ids.size()); }
  /// Token row where the prefill rows start (= number of decode rows incl. padding).
  int prefill_token_offset() const { return meta.query_start_loc.empty() ? 0 : meta.query_start_loc[meta.num_decode_rows()]; }
  /// Throws Error if the fields are inconsistent (token count vs metadata, logits rows out of range).
  void validate() const;
};

/// Packs one step: `seqs[i]` schedules `tokens[i]` (its num_scheduled_tokens new token ids). Builds the
/// metadata (reordering decodes first, padding per `opt`), input_ids in row order and seq_first_token.
/// logits_indices is left empty for the caller. Throws Error on mismatched sizes or invalid sequences.
ForwardBatch make_forward_batch(std::span<const ScheduledSeq> seqs, std::span<const std::vector<int32_t>> tokens,
                                const MetadataOptions& opt);

}  // namespace ssmserve
