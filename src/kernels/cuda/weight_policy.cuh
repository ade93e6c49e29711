// Owns the L2 eviction policy of the decode kernels' weight streams (KernelTuning::weight_evict_first): weights are
// read once per step, so with evict_first they leave the L2 to what the step reads again soon (activations, states,
// norm weights, biases) instead of pushing it out to HBM. A cache hint only: never a result.
#pragma once
#include <cstdint>

namespace ssmserve::cuda::detail {

/// The L2 policy for ld ... L2::cache_hint: evict_first, else evict_unchanged (a plain load's priority).
__device__ __forceinline__ uint64_t weight_l2_policy(bool evict_first) {
  uint64_t p;
  if (evict_first) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  else asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(p));
  return p;
}

}  // namespace ssmserve::cuda::detail
