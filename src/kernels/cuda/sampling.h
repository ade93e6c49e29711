// Owns greedy token selection on the GPU (issue 7: LM head + sampling on the device, only ids and log-probabilities
// back to the host): per logits row the argmax (lowest id on ties), its raw log-probability and the k most
// probable tokens, i.e. what engine/sampler.h's sample_token returns for a greedy request with no penalties and
// no min_tokens masking in effect (vLLM's greedy sampling with raw logprobs). log-sum-exp: float exp, double
// accumulation (as the CPU sampler). Framework-free: device pointers, sizes, a stream; returns the launch status
// (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssmserve::cuda {

/// Most top log-probabilities greedy_sample returns per row (vLLM's default max_logprobs).
inline constexpr int kMaxDeviceTopLogprobs = 20;

/// One row's result: token id and its log-probability, then num_top (id, logprob) pairs sorted by logprob
/// descending (ties: lower id first). A row whose logits hold a NaN or +inf, or are all -inf, gets token = -1
/// (the host then reports the error).
struct GreedyRow {
  int32_t token;
  float logprob;
  int32_t top_ids[kMaxDeviceTopLogprobs];
  float top_logprobs[kMaxDeviceTopLogprobs];
};

/// For each of n rows of logits [n, V] fp32 (row stride ld >= V), writes out[i] (device, [n]).
/// num_top in [0, kMaxDeviceTopLogprobs], clamped to V.
cudaError_t greedy_sample(const float* logits, int64_t ld, int n, int64_t V, int num_top, GreedyRow* out,
                          cudaStream_t stream);

}  // namespace ssmserve::cuda
