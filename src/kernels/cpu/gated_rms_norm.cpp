// Owns the CPU gated RMSNorm (see gated_rms_norm.h).
#include "kernels/cpu/gated_rms_norm.h"

#include <cmath>

#include "kernels/cpu/vec_math.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {

void gated_rms_norm(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                    float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, float* out) {
#pragma omp parallel for schedule(static) if (T > 4)
  for (int64_t t = 0; t < T; ++t) {
    const float* yt = y + t * y_stride;
    const float* zt = z + t * z_stride;
    float* ot = out + t * D;
    if (weight == nullptr) {  // no norm: the gate alone
      for (int64_t d = 0; d < D; ++d) ot[d] = yt[d] * silu_ps(zt[d]);
      continue;
    }
    for (int64_t g0 = 0; g0 < D; g0 += group_size) {
      // 1. The normalized quantity: y * silu(z) (gate first) or y (norm first).
      // (Vectorized; the reduction order is fixed by the code, not by the batch, so rows stay batch-invariant.)
      float ss = 0.0f;
      if (norm_before_gate) {
#pragma omp simd reduction(+ : ss)
        for (int64_t d = g0; d < g0 + group_size; ++d) {
          ot[d] = yt[d];
          ss += yt[d] * yt[d];
        }
      } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t d = g0; d < g0 + group_size; ++d) {
          const float h = yt[d] * silu_ps(zt[d]);
          ot[d] = h;
          ss += h * h;
        }
      }
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(group_size) + eps);
      // 2. Scale, weight, and the gate when it comes after the norm.
      if (norm_before_gate) {
#pragma omp simd
        for (int64_t d = g0; d < g0 + group_size; ++d) ot[d] = ot[d] * inv * weight[d] * silu_ps(zt[d]);
      } else {
#pragma omp simd
        for (int64_t d = g0; d < g0 + group_size; ++d) ot[d] = ot[d] * inv * weight[d];
      }
    }
  }
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, gated_rms_norm, (const float* y, int64_t y_stride, const float* z, int64_t z_stride,
                 const float* weight, float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate,
                 float* out), (y, y_stride, z, z_stride, weight, eps, T, D, group_size, norm_before_gate, out))
