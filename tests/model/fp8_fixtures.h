// Owns the FP8 checkpoint fixtures of the tests (tests/model/test_fp8_checkpoint.cpp, tests/cuda/test_cuda_fp8_checkpoint.cpp):
// the e4m3 definition, an FP8 tiny model written to disk, and the same checkpoint dequantized by the naive formula.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"
#include "model/checkpoint.h"
#include "model/dummy_checkpoint.h"
#include "test_util.h"

namespace ssmserve::testing {

/// e4m3fn by its definition: (-1)^s x 2^(e - 7) x (1 + m / 8), subnormals 2^-6 x m / 8, S.1111.111 NaN.
inline double e4m3_reference(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

/// tests/data/tiny-hybrids/tiny-qwen3_next-fp8/config.json with `block` as its weight_block_size (null: per tensor).
inline nlohmann::json fp8_config(const nlohmann::json& block) {
  nlohmann::json c = read_json(source_dir() / "tests/data/tiny-hybrids/tiny-qwen3_next-fp8/config.json");
  c["quantization_config"]["weight_block_size"] = block;
  return c;
}

/// Writes `config` and its dummy weights (FP8 where save_dummy_checkpoint quantizes) to `dir`.
inline void write_fp8_model(const std::filesystem::path& dir, const nlohmann::json& config) {
  write_file(dir / "config.json", config.dump());
  save_dummy_checkpoint(ModelConfig::load(dir), dir / "model.safetensors");
}

/// The FP8 checkpoint in `fp8_dir` rewritten to `out_dir` without quantization: each F8_E4M3 matrix replaced by its
/// dequantization by the naive formula (e4m3_reference x its block's scale, in fp32) stored as `dtype` ("F32", or
/// "BF16" rounded once), the scales dropped, every other tensor copied.
inline void write_dequantized_copy(const std::filesystem::path& fp8_dir, const std::filesystem::path& out_dir, const std::string& dtype) {
  nlohmann::json config = testing::read_json(fp8_dir / "config.json");
  const nlohmann::json block = config["quantization_config"]["weight_block_size"];
  config.erase("quantization_config");
  write_file(out_dir / "config.json", config.dump());
  const Checkpoint ck = Checkpoint::open(fp8_dir);
  std::vector<FixtureTensor> tensors;
  int quantized = 0;
  for (const std::string& name : ck.names()) {
    if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0) continue;
    if (const TensorRef* raw = ck.find_raw(name)) {
      const TensorRef& s = *ck.find(name + "_scale_inv");
      const int64_t K = raw->shape.back(), N = raw->shape[raw->shape.size() - 2];
      const int64_t bn = block.is_null() ? N : block[0].get<int64_t>(), bk = block.is_null() ? K : block[1].get<int64_t>();
      const int64_t gk = (K + bk - 1) / bk, gn = (N + bn - 1) / bn;
      std::vector<float> v(static_cast<size_t>(raw->numel()));
      for (int64_t i = 0; i < raw->numel(); ++i) {
        const int64_t m = i / (N * K), r = i / K % N, c = i % K;
        float scale = 0;
        std::memcpy(&scale, s.data + 4 * ((m * gn + r / bn) * gk + c / bk), 4);
        v[static_cast<size_t>(i)] = static_cast<float>(e4m3_reference(std::to_integer<int>(raw->data[i]))) * scale;
      }
      tensors.push_back(dtype == "F32" ? f32_tensor(name, raw->shape, v) : bf16_tensor(name, raw->shape, v));
      ++quantized;
      continue;
    }
    const TensorRef& t = *ck.find(name);
    tensors.push_back({name, std::string(dtype_name(t.dtype)), t.shape,
                       std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  ASSERT_GT(quantized, 20);  // the projections of every layer, the experts' included
  write_safetensors(out_dir / "model.safetensors", tensors);
}

}  // namespace ssmserve::testing
