// Owns RMSNorm on the CPU (see rms_norm.h).
#include "kernels/cpu/rms_norm.h"

#include <cmath>

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {

void rms_norm(const float* x, const float* weight, float eps, int64_t T, int64_t H, float* y) {
#pragma omp parallel for schedule(static) if (T > 4)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * H;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t h = 0; h < H; ++h) ss += xt[h] * xt[h];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
    float* yt = y + t * H;
    for (int64_t h = 0; h < H; ++h) yt[h] = xt[h] * inv * weight[h];
  }
}

void rms_norm_strided(float* x, int64_t stride, const float* weight, float eps, int64_t T, int64_t H) {
  for (int64_t t = 0; t < T; ++t) rms_norm(x + t * stride, weight, eps, 1, H, x + t * stride);
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, rms_norm, (const float* x, const float* weight, float eps, int64_t T, int64_t H, float* y),
                 (x, weight, eps, T, H, y))
SSM_CPU_DISPATCH(void, rms_norm_strided, (float* x, int64_t stride, const float* weight, float eps, int64_t T,
                 int64_t H), (x, stride, weight, eps, T, H))
