// Owns ForwardBatch: the packed, per-step input a model's forward pass consumes (vLLM's model-runner inputs
// plus the recurrent-layer metadata of vllm-ssm-design.md §2.2, in the same names).
#pragma once
#include <cstdint>
#include <vector>

namespace ssmserve {

/// One step's packed batch, decodes first. Request r owns token rows
/// [query_start_loc[r], query_start_loc[r+1]) and the state block state_indices[r] (0 = null block: padding,
/// skipped by every kernel). Requests [0, num_decodes) have exactly one token and an initial state; the rest
/// are prefills (possibly continuing from a state: has_initial_states[r]).
struct ForwardBatch {
  std::vector<int32_t> input_ids;           ///< [num_tokens]
  std::vector<int32_t> query_start_loc;     ///< [num_reqs + 1], query_start_loc[0] = 0
  std::vector<int32_t> state_indices;       ///< [num_reqs] block ids
  std::vector<uint8_t> has_initial_states;  ///< [num_reqs]
  int num_decodes = 0;                      ///< leading requests that are one-token decodes
  std::vector<int32_t> logits_indices;      ///< token rows whose logits the caller wants, in output order

  int num_reqs() const { return static_cast<int>(state_indices.size()); }
  int num_tokens() const { return static_cast<int>(input_ids.size()); }
  /// Throws Error if the fields are inconsistent (sizes, monotone query_start_loc, decode rows of length 1,
  /// logits rows in range).
  void validate() const;
};

}  // namespace ssmserve
