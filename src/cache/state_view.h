// Owns the typed, block-strided view through which kernels read and write one layer's recurrent state in the
// state cache, and the storage element types (fp32, bf16, fp16) with their fp32 load/store conversions
// (vllm-ssm-design.md §3.1: each state is a strided view with block stride = page size in its own dtype).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace ssmserve {

/// Storage element of a bf16 state (a distinct type so kernels can template on it).
struct bf16_t {
  uint16_t bits;
};
/// Storage element of an IEEE fp16 state.
struct f16_t {
  uint16_t bits;
};

/// Element -> fp32 (exact for every type).
inline float load_f32(float v) { return v; }
inline float load_f32(bf16_t v) { return bf16_to_f32(v.bits); }
inline float load_f32(f16_t v) { return f16_to_f32(v.bits); }
/// fp32 -> element, round to nearest even (f32_to_bf16 / f32_to_f16 in core/dtype.h).
inline void store_f32(float& dst, float v) { dst = v; }
inline void store_f32(bf16_t& dst, float v) { dst.bits = f32_to_bf16(v); }
inline void store_f32(f16_t& dst, float v) { dst.bits = f32_to_f16(v); }

/// One state tensor of one layer across all blocks: block b's state is the `block_stride` elements' worth of
/// dtype starting at data + b * block_stride (elements, not bytes). Within a block the layout is the state's own
/// ([d_conv-1, channels] for a conv window, [d_inner, d_state] for a Mamba-1 SSM state).
struct StateView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t block_stride = 0;  ///< elements of `dtype` between consecutive blocks (= page bytes / dtype size)

  /// Pointer to block b's state as storage element T (float, bf16_t or f16_t, matching dtype).
  template <class T>
  T* block(int64_t b) const {
    return static_cast<T*>(data) + b * block_stride;
  }
};

/// Calls f(T{}) with T the storage element type of `t`: float, bf16_t or f16_t.
template <class F>
decltype(auto) visit_state_dtype(DType t, F&& f) {
  switch (t) {
    case DType::BF16: return std::forward<F>(f)(bf16_t{});
    case DType::F16: return std::forward<F>(f)(f16_t{});
    case DType::F32: break;
  }
  return std::forward<F>(f)(float{});
}

/// Copies the first n elements of block `b` of `v` out as fp32 (tests, debugging).
inline std::vector<float> state_to_f32(const StateView& v, int64_t b, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  visit_state_dtype(v.dtype, [&](auto tag) {
    const auto* src = v.block<decltype(tag)>(b);
    for (int64_t i = 0; i < n; ++i) out[i] = load_f32(src[i]);
  });
  return out;
}

/// Writes n fp32 values into block `b` of `v`, converting to its dtype (tests, debugging).
inline void state_from_f32(const StateView& v, int64_t b, const float* src, int64_t n) {
  visit_state_dtype(v.dtype, [&](auto tag) {
    auto* dst = v.block<decltype(tag)>(b);
    for (int64_t i = 0; i < n; ++i) store_f32(dst[i], src[i]);
  });
}

}  // namespace ssmserve
