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

/// tests/data/tiny-hybrids/tiny-qwen3_next-fp8/config.json with `quantization` as its quantization_config.
inline nlohmann::json fp8_config_with(const nlohmann::json& quantization) {
  nlohmann::json c = read_json(source_dir() / "tests/data/tiny-hybrids/tiny-qwen3_next-fp8/config.json");
  c["quantization_config"] = quantization;
  return c;
}

/// The same with quant_method "fp8" and `block` as its weight_block_size (null: one scale per matrix).
inline nlohmann::json fp8_config(const nlohmann::json& block) {
  return fp8_config_with({{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", block}});
}

/// A compressed-tensors float-quantized config (llm-compressor's FP8_DYNAMIC with `strategy`; FP8_BLOCK with block).
inline nlohmann::json compressed_tensors_config(const std::string& strategy, const nlohmann::json& block = nullptr) {
  nlohmann::json weights = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", strategy},
                            {"dynamic", false}, {"block_structure", block}};
  nlohmann::json acts = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "token"}, {"dynamic", true}};
  return fp8_config_with({{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
                          {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}}},
                          {"ignore", {"lm_head"}}});
}

/// An NVIDIA Model Optimizer FP8 config (one scale per matrix).
inline nlohmann::json modelopt_config() {
  return fp8_config_with({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"kv_cache_quant_algo", nullptr}});
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
  const Fp8Quantization quant = *ModelConfig::load(fp8_dir).fp8;
  config.erase("quantization_config");
  write_file(out_dir / "config.json", config.dump());
  const Checkpoint ck = Checkpoint::open(fp8_dir);
  std::vector<FixtureTensor> tensors;
  int quantized = 0;
  const std::string& suffix = quant.scale_suffix;
  for (const std::string& name : ck.names()) {
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) continue;
    if (const TensorRef* raw = ck.find_raw(name)) {
      const TensorRef& s = *ck.find(name + suffix);
      const int64_t K = raw->shape.back(), N = raw->shape[raw->shape.size() - 2];
      const int64_t bn = quant.block_n ? quant.block_n : N, bk = quant.block_k ? quant.block_k : K;  // 0: whole dimension
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
