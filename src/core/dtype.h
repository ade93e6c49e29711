// Owns the element types ssmserve stores (F32, BF16, F16) and scalar conversions between them.
#pragma once
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ssmserve {

/// Element type of a stored tensor (weights, states). Names follow safetensors ("F32", "BF16", "F16").
enum class DType : uint8_t { F32, BF16, F16 };

/// Bytes per element.
constexpr size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

/// "F32" / "BF16" / "F16".
constexpr std::string_view dtype_name(DType t) {
  return t == DType::F32 ? "F32" : (t == DType::BF16 ? "BF16" : "F16");
}

/// bfloat16 bits -> float (exact).
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

/// float -> bfloat16 bits, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// IEEE half bits -> float (exact, handles subnormals, inf, NaN).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

/// float -> IEEE half bits, round to nearest even; overflow (|f| >= 65520) gives inf, NaN stays NaN (quiet),
/// values below 2^-14 become subnormals or zero.
inline uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);                          // inf / overflow
  if (a >= 0x38800000u) {  // normal half: rebias the exponent 127 -> 15, round the 13 dropped bits to even
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal half (unit 2^-24): adding 0.5 leaves the value in float's mantissa with ulp 2^-24, so the FPU's
  // round-to-nearest-even does the rounding; a carry to 0x400 is the smallest normal, as it should be.
  const float v = std::bit_cast<float>(a) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(v) - 0x3f000000u));
}

/// float8 e4m3fn bits (safetensors "F8_E4M3", torch.float8_e4m3fn: 1 sign, 4 exponent bits with bias 7, 3 mantissa
/// bits, no infinities, S.1111.111 = NaN) -> float, exact. Largest finite value 448, smallest subnormal 2^-9.
inline float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t man = b & 0x7u;
  if (exp == 0xfu && man == 0x7u) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exp == 0) {  // subnormal: man x 2^-9
    const float v = static_cast<float>(man) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 120u) << 23) | (man << 20));
}

/// float -> float8 e4m3fn bits, round to nearest even, saturating: |f| beyond 448 gives +-448 (as quantizers clamp
/// before the cast); NaN gives NaN. For writing FP8 checkpoints in tests and tools.
inline uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  if (a >= 0x3c800000u) {  // normal fp8 (>= 2^-6): rebias 127 -> 7, round the 20 dropped bits to even
    uint32_t r = a - (120u << 23);
    r += 0x7ffffu + ((r >> 20) & 1u);
    const uint32_t bits = r >> 20;
    return static_cast<uint8_t>(sign | (bits > 0x7eu ? 0x7eu : bits));
  }
  // Subnormal fp8: the value in units of 2^-9 (exact: a power-of-two scale), rounded to nearest even by nearbyint in
  // the default rounding mode; 8 units is 2^-6, the smallest normal, whose bits are 0x08 as they should be.
  const float q = std::nearbyint(std::bit_cast<float>(a) * 512.0f);
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
}

/// Converts n elements of type `t` at `src` to float at `dst`.
inline void to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
  }
}

}  // namespace ssmserve
