// Owns the GPTQ / AWQ checkpoint fixtures of the tests (tests/model/test_int_checkpoint.cpp,
// tests/cuda/test_cuda_int_checkpoint.cpp): the tiny Qwen3-Next dummy model quantized and packed as AutoGPTQ and
// AutoAWQ write it, beside a checkpoint of its dequantized weights.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"
#include "model/checkpoint.h"
#include "model/dummy_checkpoint.h"
#include "test_util.h"

namespace ssmserve::testing {

/// How this test quantizes: the config's fields and the fixture's choices.
struct Scheme {
  nlohmann::json config;  ///< quantization_config
  int bits = 4;
  int group = 32;          ///< 0: one group over all input rows
  bool sym = false;        ///< zero 2^(bits - 1)
  bool act_order = false;  ///< GPTQ g_idx: rows grouped in a shuffled order
  bool awq = false;
  bool v1 = true;          ///< GPTQ v1: zero - 1 stored
  bool pack_quantized = false;  ///< compressed-tensors pack-quantized (BF16 scales)
  /// GPTQModel's dynamic overrides: the routed experts' matrices with these bits / group size (0: as the rest), the
  /// shared experts left unquantized.
  int expert_bits = 0, expert_group = 0;
  bool skip_shared_experts = false;
};

inline Scheme gptq(int bits, int group, bool sym, bool act_order, bool v1) {
  Scheme s;
  s.config = {{"quant_method", "gptq"}, {"bits", bits}, {"group_size", group > 0 ? group : -1}, {"desc_act", act_order},
              {"sym", sym}, {"damp_percent", 0.01}, {"true_sequential", true}};
  if (!v1) s.config["checkpoint_format"] = "gptq_v2";
  s.bits = bits, s.group = group, s.sym = sym, s.act_order = act_order, s.v1 = v1;
  return s;
}

inline Scheme awq(int group) {
  Scheme s;
  s.config = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", group > 0 ? group : -1}, {"zero_point", true}, {"version", "gemm"},
              {"modules_to_not_convert", nullptr}};
  s.group = group, s.awq = true, s.v1 = false;
  return s;
}

/// GPTQ 4-bit with GPTQModel's per-module `dynamic` rules: experts 8-bit in groups of 64, shared experts unquantized.
inline Scheme gptq_dynamic() {
  Scheme s = gptq(4, 32, false, false, true);
  s.config["dynamic"] = {{"+:.*\\.mlp\\.experts\\..*", {{"bits", 8}, {"group_size", 64}}},
                         {"-:.*shared_expert\\.", nlohmann::json::object()}};
  s.expert_bits = 8, s.expert_group = 64, s.skip_shared_experts = true;
  return s;
}

/// compressed-tensors pack-quantized (llm-compressor's W4A16 / W8A16): `group` 0 is strategy "channel".
inline Scheme pack_quantized(int bits, int group, bool sym, bool act_order) {
  Scheme s;
  nlohmann::json weights = {{"num_bits", bits}, {"type", "int"}, {"symmetric", sym},
                            {"strategy", group > 0 ? "group" : "channel"}, {"group_size", group > 0 ? nlohmann::json(group) : nlohmann::json(nullptr)},
                            {"actorder", act_order ? nlohmann::json("group") : nlohmann::json(nullptr)}, {"dynamic", false}};
  s.config = {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}, {"quantization_status", "compressed"},
              {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", nullptr}}}}},
              {"ignore", {"lm_head"}}};
  s.bits = bits, s.group = group, s.sym = sym, s.act_order = act_order, s.v1 = false, s.pack_quantized = true;
  return s;
}

/// Whether the fixture quantizes this tensor: the layers' projection matrices whose rows and columns fill whole words
/// of `pack` codes.
inline bool quantized(const std::string& name, const std::vector<int64_t>& shape, int pack) {
  return shape.size() == 2 && name.find("layers.") != std::string::npos && name.size() > 7 &&
         name.compare(name.size() - 7, 7, ".weight") == 0 && name.find("norm") == std::string::npos &&
         shape[0] % pack == 0 && shape[1] % pack == 0;
}

inline FixtureTensor i32_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<uint32_t>& words) {
  std::string b(words.size() * 4, '\0');
  std::memcpy(b.data(), words.data(), b.size());
  return {name, "I32", std::move(shape), std::move(b)};
}

/// Writes the tiny Qwen3-Next dummy model quantized by `s` to `qdir` and its dequantized weights (F32, no
/// quantization_config) to `ref`. Returns how many matrices it quantized.
inline int write_quantized_pair(const Scheme& s, const std::filesystem::path& qdir, const std::filesystem::path& ref) {
  TempDir plain("intplain");
  nlohmann::json config = read_json(source_dir() / "tests/data/tiny-hybrids/tiny-qwen3_next/config.json");
  write_file(plain.path() / "config.json", config.dump());
  save_dummy_checkpoint(ModelConfig::load(plain.path()), plain.path() / "model.safetensors");
  write_file(ref / "config.json", config.dump());
  config["quantization_config"] = s.config;
  write_file(qdir / "config.json", config.dump());

  const Checkpoint ck = Checkpoint::open(plain.path());
  std::vector<FixtureTensor> qt, rt;
  std::mt19937 rng(7);
  int count = 0;
  for (const std::string& name : ck.names()) {
    const TensorRef& t = *ck.find(name);
    std::vector<float> w(static_cast<size_t>(t.numel()));
    to_f32(t.dtype, t.data, w.data(), w.size());
    const bool expert = s.expert_bits > 0 && name.find(".mlp.experts.") != std::string::npos;
    const int bits = expert ? s.expert_bits : s.bits;
    if (!quantized(name, t.shape, 32 / bits) || (s.skip_shared_experts && name.find("shared_expert.") != std::string::npos)) {
      const FixtureTensor copy{name, std::string(dtype_name(t.dtype)), t.shape,
                               std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
      qt.push_back(copy), rt.push_back(copy);
      continue;
    }
    ++count;
    const int64_t N = t.shape[0], K = t.shape[1];
    const int pack = 32 / bits, levels = (1 << bits) - 1;
    const int64_t group = expert && s.expert_group > 0 ? s.expert_group : s.group > 0 ? s.group : K;
    // Each input row's group: in order, or (act order) a shuffled assignment of the same group sizes.
    std::vector<int32_t> g_of(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) g_of[static_cast<size_t>(k)] = static_cast<int32_t>(k / group);
    if (s.act_order) std::shuffle(g_of.begin(), g_of.end(), rng);
    const int64_t G = (K + group - 1) / group;
    std::vector<uint16_t> scale_bits(static_cast<size_t>(G * N));
    std::vector<int32_t> zero(static_cast<size_t>(G * N)), code(static_cast<size_t>(K * N));
    std::vector<float> deq(static_cast<size_t>(N * K));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) {
        float lo = 0, hi = 0;
        for (int64_t k = 0; k < K; ++k)
          if (g_of[static_cast<size_t>(k)] == g) lo = std::min(lo, w[n * K + k]), hi = std::max(hi, w[n * K + k]);
        float scale;
        int32_t z;
        if (s.sym) {
          scale = std::max(std::abs(lo), std::abs(hi)) / static_cast<float>((levels - 1) / 2);
          z = 1 << (bits - 1);
        } else {
          scale = (hi - lo) / static_cast<float>(levels);
          z = static_cast<int32_t>(std::lround(-lo / (scale > 0 ? scale : 1.0f)));
          z = std::clamp(z, s.v1 ? 1 : 0, levels);  // v1 cannot store zero 0 (stored -1 reads back as 2^bits)
        }
        if (!(scale > 0)) scale = 1e-3f;
        const uint16_t sb = s.pack_quantized ? f32_to_bf16(scale) : f32_to_f16(scale);
        scale_bits[static_cast<size_t>(g * N + n)] = sb;
        zero[static_cast<size_t>(g * N + n)] = z;
        const float sf = s.pack_quantized ? bf16_to_f32(sb) : f16_to_f32(sb);
        for (int64_t k = 0; k < K; ++k) {
          if (g_of[static_cast<size_t>(k)] != g) continue;
          const int32_t q = std::clamp(static_cast<int32_t>(std::lround(w[n * K + k] / sf)) + z, 0, levels);
          code[static_cast<size_t>(k * N + n)] = q;
          deq[static_cast<size_t>(n * K + k)] = sf * static_cast<float>(q - z);
        }
      }
    const std::string base = name.substr(0, name.size() - 7);
    std::vector<uint32_t> zw(static_cast<size_t>(G * N / pack), 0);
    if (s.pack_quantized) {
      // compressed-tensors' pack_to_int32: each row's codes (signed value + 2^(bits - 1), here the code itself) packed
      // along the input dimension, code c at bits x (c % pack); asymmetric zero points likewise, packed along the
      // outputs; scales [N, groups].
      std::vector<uint32_t> qw(static_cast<size_t>(N * (K / pack)), 0), zp(static_cast<size_t>(N / pack * G), 0);
      std::vector<uint16_t> scale_ng(static_cast<size_t>(N * G));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          qw[static_cast<size_t>(n * (K / pack) + k / pack)] |= static_cast<uint32_t>(code[static_cast<size_t>(k * N + n)]) << (bits * (k % pack));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < G; ++g) {
          scale_ng[static_cast<size_t>(n * G + g)] = scale_bits[static_cast<size_t>(g * N + n)];
          zp[static_cast<size_t>((n / pack) * G + g)] |= static_cast<uint32_t>(zero[static_cast<size_t>(g * N + n)]) << (bits * (n % pack));
        }
      qt.push_back(i32_tensor(base + ".weight_packed", {N, K / pack}, qw));
      std::string sbytes(scale_ng.size() * 2, '\0');
      std::memcpy(sbytes.data(), scale_ng.data(), sbytes.size());
      qt.push_back({base + ".weight_scale", "BF16", {N, G}, sbytes});
      if (!s.sym) qt.push_back(i32_tensor(base + ".weight_zero_point", {N / pack, G}, zp));
      if (s.act_order) qt.push_back(i32_tensor(base + ".weight_g_idx", {K}, std::vector<uint32_t>(g_of.begin(), g_of.end())));
      const int64_t dims[2] = {N, K};
      qt.push_back({base + ".weight_shape", "I64", {2}, std::string(reinterpret_cast<const char*>(dims), 16)});
      rt.push_back(f32_tensor(name, {N, K}, deq));
      continue;
    }
    if (s.awq) {
      // AutoAWQ's packer: nibble i of word (k, j) holds column 8j + order[i].
      static constexpr int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
      std::vector<uint32_t> qw(static_cast<size_t>(K * N / 8), 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N / 8; ++j)
          for (int i = 0; i < 8; ++i)
            qw[static_cast<size_t>(k * (N / 8) + j)] |= static_cast<uint32_t>(code[static_cast<size_t>(k * N + 8 * j + order[i])]) << (4 * i);
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < N / 8; ++j)
          for (int i = 0; i < 8; ++i)
            zw[static_cast<size_t>(g * (N / 8) + j)] |= static_cast<uint32_t>(zero[static_cast<size_t>(g * N + 8 * j + order[i])]) << (4 * i);
      qt.push_back(i32_tensor(base + ".qweight", {K, N / 8}, qw));
    } else {
      // AutoGPTQ's packer: qweight packs `pack` input rows per word (row k at bits x (k % pack)), qzeros `pack`
      // output columns (column n at bits x (n % pack)), v1 storing zero - 1.
      std::vector<uint32_t> qw(static_cast<size_t>(K / pack * N), 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n)
          qw[static_cast<size_t>((k / pack) * N + n)] |= static_cast<uint32_t>(code[static_cast<size_t>(k * N + n)]) << (bits * (k % pack));
      for (int64_t g = 0; g < G; ++g)
        for (int64_t n = 0; n < N; ++n) {
          const uint32_t z = static_cast<uint32_t>(zero[static_cast<size_t>(g * N + n)] - (s.v1 ? 1 : 0)) & static_cast<uint32_t>(levels);
          zw[static_cast<size_t>(g * (N / pack) + n / pack)] |= z << (bits * (n % pack));
        }
      qt.push_back(i32_tensor(base + ".qweight", {K / pack, N}, qw));
      std::vector<uint32_t> gi(g_of.begin(), g_of.end());
      qt.push_back(i32_tensor(base + ".g_idx", {K}, gi));
    }
    qt.push_back(i32_tensor(base + ".qzeros", {G, N / pack}, zw));
    qt.push_back(f16_tensor(base + ".scales", {G, N}, scale_bits));
    rt.push_back(f32_tensor(name, {N, K}, deq));
  }
  write_safetensors(qdir / "model.safetensors", qt);
  write_safetensors(ref / "model.safetensors", rt);
  return count;
}

/// `ref`'s checkpoint (F32 matrices) copied to `out` with every F32 tensor rounded once to BF16.
inline void write_bf16_copy(const std::filesystem::path& ref, const std::filesystem::path& out) {
  write_file(out / "config.json", read_file(ref / "config.json"));
  const Checkpoint ck = Checkpoint::open(ref);
  std::vector<FixtureTensor> tensors;
  for (const std::string& name : ck.names()) {
    const TensorRef& t = *ck.find(name);
    if (t.dtype == DType::F32) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      to_f32(t.dtype, t.data, v.data(), v.size());
      tensors.push_back(bf16_tensor(name, t.shape, v));
    } else {
      tensors.push_back({name, std::string(dtype_name(t.dtype)), t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
    }
  }
  write_safetensors(out / "model.safetensors", tensors);
}

}  // namespace ssmserve::testing
