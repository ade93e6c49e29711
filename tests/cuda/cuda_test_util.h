// Owns the helpers of the GPU op tests: GPU presence (skip without one), named model shapes, random inputs,
// state pools mirrored on host and device, ragged batches and the relative-error check.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cache/state_view.h"
#include "core/dtype.h"
#include "device/device.h"
#include "kernels/cuda/kernel_tuning.h"

namespace ssmserve::cudatest {

/// Skips the test when no CUDA device is usable (CI has nvcc but no GPU).
#define REQUIRE_GPU()                                                           \
  do {                                                                          \
    if (!::ssmserve::cuda::gpu_available()) GTEST_SKIP() << "no CUDA device";   \
  } while (0)

/// SSMSERVE_CUDA_TEST_QUICK=1 (the compute-sanitizer runs): fewer tokens and only the small shapes.
/// A device buffer of n floats, every byte 0xFF (NaN): rows an op must not write stay that way.
inline cuda::DeviceBuffer poisoned(size_t n) {
  cuda::DeviceBuffer b(n * sizeof(float));
  b.fill_bytes(0xff);
  return b;
}

/// Installs a KernelTuning for the scope (restores the previous one on exit).
struct TuningScope {
  cuda::KernelTuning saved = cuda::kernel_tuning();
  explicit TuningScope(const cuda::KernelTuning& t) { cuda::set_kernel_tuning(t); }
  ~TuningScope() { cuda::set_kernel_tuning(saved); }
};

/// n random bf16 values (bits) in [-a, a) (xorshift: the real expert shapes are 10^8 values).
inline std::vector<uint16_t> fast_bf16(size_t n, float a, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = f32_to_bf16((static_cast<float>(x >> 40) * (1.0f / 8388608.0f) - 1.0f) * a);
  }
  return v;
}

/// A read-only span over a host vector (the ops take spans).
template <class T>
std::span<const T> sp(const std::vector<T>& v) { return std::span<const T>(v); }

inline bool quick() {
  const char* v = std::getenv("SSMSERVE_CUDA_TEST_QUICK");
  return v && *v && std::string(v) != "0";
}

/// A fresh seed per test (printed on failure through SCOPED_TRACE).
inline uint32_t fresh_seed() { return std::random_device{}(); }

/// Uniform values in [lo, hi).
inline std::vector<float> rand_vec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Rounds every value to bf16 (so host and device see the same operands).
inline void round_bf16(std::vector<float>& v) {
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
}
inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

/// ||got - ref|| / ||ref|| over the rows whose mask is set ([rows, cols] with row strides); NaN anywhere in
/// the selected rows gives +inf.
inline double rel_err(const float* got, int64_t got_stride, const float* ref, int64_t ref_stride, int64_t rows,
                      int64_t cols, const std::vector<uint8_t>* row_mask = nullptr) {
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (row_mask && !(*row_mask)[r]) continue;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got[r * got_stride + c], f = ref[r * ref_stride + c];
      if (std::isnan(g) || std::isnan(f)) return INFINITY;
      num += (g - f) * (g - f);
      den += f * f;
    }
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

/// True when every value of the masked-out rows still holds the poison pattern (all bytes 0xFF = NaN).
inline bool untouched(const float* got, int64_t stride, int64_t rows, int64_t cols, const std::vector<uint8_t>& mask) {
  for (int64_t r = 0; r < rows; ++r) {
    if (mask[r]) continue;
    for (int64_t c = 0; c < cols; ++c) {
      uint32_t u;
      std::memcpy(&u, got + r * stride + c, 4);
      if (u != 0xffffffffu) return false;
    }
  }
  return true;
}

/// A state pool of `num_blocks` blocks of `block_elems` elements in `dtype`, on the host and the device.
struct StatePool {
  DType dtype;
  int64_t block_elems;
  int num_blocks;
  std::vector<uint8_t> host;
  cuda::DeviceBuffer dev;

  StatePool(DType t, int64_t elems, int blocks, std::mt19937& rng, float scale = 1.0f)
      : dtype(t), block_elems(elems), num_blocks(blocks),
        host(static_cast<size_t>(elems) * blocks * dtype_size(t)) {
    for (int b = 0; b < blocks; ++b) {
      auto v = rand_vec(rng, static_cast<size_t>(elems), -scale, scale);
      state_from_f32(host_view(), b, v.data(), elems);
    }
    dev = cuda::DeviceBuffer(host.size());
    dev.upload(host.data(), host.size());
  }
  StateView host_view() { return StateView{host.data(), dtype, block_elems}; }
  StateView dev_view() { return StateView{dev.data(), dtype, block_elems}; }
  /// ||dev - host|| / ||host|| over the given blocks.
  double rel_err_blocks(const std::vector<int32_t>& blocks) const {
    std::vector<uint8_t> d(host.size());
    dev.download(d.data(), d.size());
    StateView hv{const_cast<uint8_t*>(host.data()), dtype, block_elems}, dv{d.data(), dtype, block_elems};
    double num = 0, den = 0;
    for (int32_t b : blocks) {
      if (b == 0) continue;
      auto h = state_to_f32(hv, b, block_elems), g = state_to_f32(dv, b, block_elems);
      for (int64_t i = 0; i < block_elems; ++i) {
        if (std::isnan(g[i])) return INFINITY;
        num += (double(g[i]) - h[i]) * (double(g[i]) - h[i]);
        den += double(h[i]) * h[i];
      }
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
  }
  /// True when block 0 (the null block) is bit-identical on host and device.
  bool null_block_intact() const {
    const size_t n = static_cast<size_t>(block_elems) * dtype_size(dtype);
    std::vector<uint8_t> d(n);
    dev.download(d.data(), n);
    return std::memcmp(d.data(), host.data(), n) == 0;
  }
};

/// A ragged batch: per sequence its length, state block (0 = null row) and has_initial_states.
struct Batch {
  std::vector<int32_t> query_start_loc{0};
  std::vector<int32_t> state_indices;
  std::vector<uint8_t> has_initial_states;
  int64_t num_tokens() const { return query_start_loc.back(); }
  int num_seqs() const { return static_cast<int>(state_indices.size()); }
  /// Row mask over tokens: 1 where the token's sequence has a nonzero block.
  std::vector<uint8_t> token_mask() const {
    std::vector<uint8_t> m(static_cast<size_t>(num_tokens()));
    for (int s = 0; s < num_seqs(); ++s)
      for (int32_t t = query_start_loc[s]; t < query_start_loc[s + 1]; ++t) m[t] = state_indices[s] != 0;
    return m;
  }
};

/// Sequences of the given lengths on blocks 1, 2, ... except where `null_at` marks a null row (block 0);
/// has_initial_states alternates 1, 0 starting with 1.
inline Batch make_batch(const std::vector<int>& lens, const std::vector<int>& null_at = {}) {
  Batch b;
  int next_block = 1;
  for (size_t s = 0; s < lens.size(); ++s) {
    b.query_start_loc.push_back(b.query_start_loc.back() + lens[s]);
    bool is_null = false;
    for (int n : null_at) is_null |= n == static_cast<int>(s);
    b.state_indices.push_back(is_null ? 0 : next_block++);
    b.has_initial_states.push_back(s % 2 == 0);
  }
  return b;
}

/// Named batch schedules: the edge cases of the issue (length 1, length < d_conv - 1, ragged
/// query_start_loc, null rows) and one long prefill.
struct Schedule {
  const char* name;
  std::vector<int> lens;
  std::vector<int> null_at;
};
inline std::vector<Schedule> schedules() {
  std::vector<Schedule> s = {
      {"len1", {1}, {}},
      {"len2_below_dconv", {2, 1, 2}, {}},
      {"ragged_with_null", {5, 1, 37, 2, 64, 3}, {1, 4}},
  };
  if (!quick()) s.push_back({"long_ragged", {300, 17, 513, 1}, {3}});
  return s;
}

/// Mamba-1 layer shapes.
struct Mamba1Shape {
  const char* name;
  int64_t d_model, d_inner;
  int d_state, d_conv, dt_rank;
};
inline std::vector<Mamba1Shape> mamba1_shapes() {
  std::vector<Mamba1Shape> s = {{"mamba-130m", 768, 1536, 16, 4, 48}};
  if (!quick()) s.push_back({"mamba-2.8b", 2560, 5120, 16, 4, 160});
  return s;
}

/// Mamba-2 layer shapes (conv over x, B, C: d_inner + 2 * G * N channels).
struct Mamba2Shape {
  const char* name;
  int64_t d_model;
  int heads, head_dim, n_groups, d_state, d_conv, chunk_size;
  int64_t d_inner() const { return static_cast<int64_t>(heads) * head_dim; }
  int64_t conv_dim() const { return d_inner() + 2LL * n_groups * d_state; }
};
inline std::vector<Mamba2Shape> mamba2_shapes() {
  std::vector<Mamba2Shape> s = {{"tiny-mamba2", 256, 8, 64, 1, 64, 4, 64}};
  if (!quick()) {
    s.push_back({"mamba2-2.7b", 2560, 80, 64, 1, 128, 4, 256});
    s.push_back({"codestral-7b", 4096, 128, 64, 8, 128, 4, 256});
  }
  return s;
}

}  // namespace ssmserve::cudatest
