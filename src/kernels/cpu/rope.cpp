// Owns the CPU rotary embedding (see rope.h).
#include "kernels/cpu/rope.h"

#include <cmath>

#include "core/error.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {

std::vector<float> rope_inv_freq(double theta, int rotary_dim) {
  SSM_CHECK(rotary_dim >= 2 && rotary_dim % 2 == 0, "rope: rotary dim must be even and >= 2 (got {})", rotary_dim);
  SSM_CHECK(theta > 0 && std::isfinite(theta), "rope: rope_theta must be positive (got {})", theta);
  std::vector<float> f(static_cast<size_t>(rotary_dim / 2));
  const float base = static_cast<float>(theta);
  for (int i = 0; i < rotary_dim / 2; ++i)
    f[i] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  return f;
}

void apply_rope(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, std::span<const int32_t> positions,
                std::span<const float> inv_freq) {
  const int half = static_cast<int>(inv_freq.size());
  SSM_CHECK(2 * half <= head_dim, "rope: rotary dim {} exceeds head_dim {}", 2 * half, head_dim);
  SSM_CHECK(static_cast<int64_t>(positions.size()) == T, "rope: {} positions for {} tokens", positions.size(), T);
#pragma omp parallel for schedule(static) if (T > 8)
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
      const float a = static_cast<float>(positions[t]) * inv_freq[i];
      c[i] = std::cos(a);
      s[i] = std::sin(a);
    }
    for (int h = 0; h < num_heads; ++h) {
      float* xh = x + t * x_stride + static_cast<int64_t>(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float x1 = xh[i], x2 = xh[i + half];
        xh[i] = x1 * c[i] - x2 * s[i];
        xh[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(std::vector<float>, rope_inv_freq, (double theta, int rotary_dim), (theta, rotary_dim))
SSM_CPU_DISPATCH(void, apply_rope, (float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim,
                 std::span<const int32_t> positions, std::span<const float> inv_freq),
                 (x, x_stride, T, num_heads, head_dim, positions, inv_freq))
