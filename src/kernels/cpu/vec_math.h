// Owns branch-free float math the compiler can vectorize inside `#pragma omp simd` loops (glibc only exposes
// its vector exp under -ffast-math). exp_ps follows Cephes' expf: range reduction x = n ln2 + r, a degree-6
// polynomial for e^r, then scaling by 2^n through the exponent bits. Max error ~2 ulp on [-87, 88].
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace ssmserve::cpu {

#pragma omp declare simd
inline float exp_ps(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);  // plain selects vectorize; fmin/fmax become calls
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

#pragma omp declare simd
inline float silu_ps(float x) { return x / (1.0f + exp_ps(-x)); }

}  // namespace ssmserve::cpu
