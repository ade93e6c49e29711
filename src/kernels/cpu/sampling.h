// Owns the vectorized reductions of the host sampler (engine/sampler.cpp: vLLM v1 Sampler semantics for one row):
// max, sums of exponentials and of weights, the min-p floor and the top-k candidate scan over a vocabulary of logits.
// GCC/Clang vector extensions of a fixed kW lanes (8 floats, widened to doubles for sums), the tail padded, so every
// element goes through the same code and each result depends only on the values; one source per instruction-set
// variant (kernels/cpu/isa/variant.h), which picks how wide the registers carrying those 8 lanes are.
#pragma once
#include <vector>

namespace ssmserve::cpu {

/// Max of x[0..n) (NaN entries ignored; -inf if n == 0); *nan_count (if given) receives the NaN count.
float lane_max(const float* x, int n, int* nan_count = nullptr);

/// The sum over i < n of exp((x[i] - m) / t), in double in a fixed lane order; the terms (fp32, exp by a Cephes
/// polynomial, ~1-2 ulp; exactly 1 at x[i] == m, 0 below m - 87 t) are stored in out[0..n) when out is given.
double sum_exp(const float* x, int n, float m, float t, float* out);

/// Sum of w[i] over i in [lo, hi), in double in a fixed lane order.
double sum_range(const float* w, int lo, int hi);

/// Sum of w[i] over the i < n with l[i] >= t, in double in a fixed lane order.
double mass_at_or_above(const float* l, const float* w, int n, float t);

/// w[i] = 0 where w[i] < floor, for i < n (min-p's cut of unnormalized weights).
void zero_below(float* w, int n, float floor);

/// Ids of the k largest l[0..n) (ties: the lower id), sorted (l desc, id asc), into `heap`: a bounded heap, O(n log
/// k); chunks of kW values with none above the current k-th best are skipped with one vector compare.
void top_k_ids(const float* l, int n, int k, std::vector<int>& heap);

}  // namespace ssmserve::cpu
