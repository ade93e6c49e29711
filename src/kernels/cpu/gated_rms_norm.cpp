// Owns the CPU gated RMSNorm (see gated_rms_norm.h).
#include "kernels/cpu/gated_rms_norm.h"

#include <cmath>

#include "kernels/cpu/activations.h"

namespace ssmserve::cpu {

void gated_rms_norm(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                    float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, float* out) {
#pragma omp parallel for schedule(static) if (T > 4)
  for (int64_t t = 0; t < T; ++t) {
    const float* yt = y + t * y_stride;
    const float* zt = z + t * z_stride;
    float* ot = out + t * D;
    for (int64_t g0 = 0; g0 < D; g0 += group_size) {
      // 1. The normalized quantity: y * silu(z) (gate first) or y (norm first).
      float ss = 0.0f;
      for (int64_t d = g0; d < g0 + group_size; ++d) {
        const float h = norm_before_gate ? yt[d] : yt[d] * silu(zt[d]);
        ot[d] = h;
        ss += h * h;
      }
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(group_size) + eps);
      // 2. Scale, weight, and the gate when it comes after the norm.
      for (int64_t d = g0; d < g0 + group_size; ++d) {
        float v = ot[d] * inv * weight[d];
        if (norm_before_gate) v *= silu(zt[d]);
        ot[d] = v;
      }
    }
  }
}

}  // namespace ssmserve::cpu
