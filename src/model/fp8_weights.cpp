// Owns FP8 block-scaled weight dequantization (see fp8_weights.h).
#include "model/fp8_weights.h"

#include <algorithm>
#include <array>
#include <fmt/ranges.h>

#include "core/error.h"

namespace ssmserve {

std::string fp8_scale_name(const std::string& name, const Fp8Quantization& quant) { return name + quant.scale_suffix; }

std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape, const Fp8Quantization& quant) {
  if (shape.size() < 2) return {};
  const int64_t N = shape[shape.size() - 2], K = shape.back();
  const int64_t bn = quant.block_n ? quant.block_n : std::max<int64_t>(N, 1), bk = quant.block_k ? quant.block_k : std::max<int64_t>(K, 1);
  std::vector<int64_t> s(shape.begin(), shape.end() - 2);
  s.push_back((N + bn - 1) / bn);
  s.push_back((K + bk - 1) / bk);
  return s;
}

Weight dequantize_fp8(const TensorRef& q, const TensorRef& scale_inv, const Fp8Quantization& quant, DType out) {
  SSM_CHECK(q.dtype_name == "F8_E4M3", "{}: tensor \"{}\" has dtype {}; an FP8 checkpoint's matrices are F8_E4M3",
            q.file, q.name, q.dtype_name);
  SSM_CHECK(q.shape.size() >= 2, "{}: FP8 tensor \"{}\" has shape [{}]; a quantized matrix has at least 2 dimensions",
            q.file, q.name, fmt::join(q.shape, ", "));
  SSM_CHECK(out == DType::F32 || out == DType::BF16, "dequantize_fp8: the output dtype must be F32 or BF16");
  const std::vector<int64_t> grid = fp8_scale_shape(q.shape, quant);
  // The same grid, in its order: [..., gn, gk] up to dimensions of size 1 ([] or [1] for one scale, [N] or [N, 1]
  // per channel), never another arrangement of as many values (a transposed [gk, gn] grid would load silently).
  const auto squeezed = [](const std::vector<int64_t>& d) {
    std::vector<int64_t> out;
    for (int64_t x : d)
      if (x != 1) out.push_back(x);
    return out;
  };
  SSM_CHECK(squeezed(scale_inv.shape) == squeezed(grid), "{}: tensor \"{}\" has shape [{}], but FP8 matrix \"{}\" [{}] "
            "with scale blocks [{}, {}] (0: the whole dimension) needs [{}] (dimensions of size 1 aside)", scale_inv.file,
            scale_inv.name, fmt::join(scale_inv.shape, ", "), q.name, fmt::join(q.shape, ", "), quant.block_n, quant.block_k,
            fmt::join(grid, ", "));
  std::vector<float> s(static_cast<size_t>(scale_inv.numel()));
  to_f32(scale_inv.dtype, scale_inv.data, s.data(), s.size());

  const int64_t K = q.shape.back(), N = q.shape[q.shape.size() - 2];
  if (q.numel() == 0) return Weight::allocate(out, q.shape[0], 0);
  const int64_t mats = q.numel() / (N * K);
  const int64_t bn = quant.block_n ? quant.block_n : N, bk = quant.block_k ? quant.block_k : K;
  const int64_t grid_n = (N + bn - 1) / bn, grid_k = (K + bk - 1) / bk;
  Weight w = Weight::allocate(out, q.shape[0], q.numel() / q.shape[0]);
  const auto* src = reinterpret_cast<const uint8_t*>(q.data);
  std::array<float, 256> lut;  // every e4m3 code, exact
  for (int b = 0; b < 256; ++b) lut[static_cast<size_t>(b)] = fp8_e4m3_to_f32(static_cast<uint8_t>(b));
#pragma omp parallel for schedule(static) if (q.numel() > (int64_t{1} << 16))
  for (int64_t row = 0; row < mats * N; ++row) {
    const int64_t m = row / N, r = row % N;
    const float* srow = s.data() + (m * grid_n + r / bn) * grid_k;
    const uint8_t* in = src + row * K;
    if (out == DType::F32) {
      float* o = reinterpret_cast<float*>(w.owned->data()) + row * K;
      for (int64_t c = 0; c < K; ++c) o[c] = lut[in[c]] * srow[c / bk];
    } else {
      uint16_t* o = reinterpret_cast<uint16_t*>(w.owned->data()) + row * K;
      for (int64_t c = 0; c < K; ++c) o[c] = f32_to_bf16(lut[in[c]] * srow[c / bk]);
    }
  }
  return w;
}

}  // namespace ssmserve
