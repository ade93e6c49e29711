// FP8 checkpoints (quantization_config quant_method "fp8": F8_E4M3 matrices with weight_scale_inv): the e4m3
// conversions against an independent formula, the block dequantization against a naive one (partial blocks, 3-D
// expert tensors, per-tensor and BF16 scales), a whole model loaded from an FP8 checkpoint against the same model
// from a checkpoint of its dequantized weights (bit for bit, F32 and BF16), and the errors. The golden against
// transformers is tests/model/test_golden.cpp's tiny-qwen3_next-fp8.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "checkpoint_fixtures.h"
#include "cli_runner.h"
#include "engine/engine_config.h"
#include "fp8_fixtures.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/checkpoint.h"
#include "model/dummy_checkpoint.h"
#include "model/decoder/decoder_lm.h"
#include "model/fp8_weights.h"
#include "model/weight_source.h"
#include "quantized_outputs.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::FixtureTensor;
using testing::TempDir;
using testing::expect_identical;
using testing::greedy_outputs;
using testing::load_error;
using testing::e4m3_reference;
using testing::fp8_config;
using testing::write_dequantized_copy;
using testing::write_fp8_model;
using ::testing::HasSubstr;

TEST(Fp8, E4m3DecodesEveryCodeAsItsDefinition) {
  for (int b = 0; b < 256; ++b) {
    const double want = e4m3_reference(b);
    const float got = fp8_e4m3_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << b;
      EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << b;  // -0 stays -0
    }
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8, E4m3EncodesToTheNearestCodeTiesToEven) {
  // Every finite code round-trips; the midpoint between two neighbours goes to the even code; just off the midpoint
  // goes to the nearer one.
  std::vector<std::pair<double, int>> codes;
  for (int b = 0; b < 127; ++b) codes.push_back({e4m3_reference(b), b});  // 0 .. 448, ascending
  for (const auto& [v, b] : codes) {
    EXPECT_EQ(f32_to_fp8_e4m3(static_cast<float>(v)), b) << v;
    EXPECT_EQ(f32_to_fp8_e4m3(static_cast<float>(-v)), b | 0x80) << -v;
  }
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    const double lo = codes[i].first, hi = codes[i + 1].first, mid = (lo + hi) / 2;
    const int even = codes[i].second % 2 == 0 ? codes[i].second : codes[i + 1].second;
    EXPECT_EQ(f32_to_fp8_e4m3(static_cast<float>(mid)), even) << mid;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(static_cast<float>(mid), 0.0f)), codes[i].second) << mid;
    EXPECT_EQ(f32_to_fp8_e4m3(std::nextafter(static_cast<float>(mid), 1e9f)), codes[i + 1].second) << mid;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f), 0x7e);  // saturates at 448
  EXPECT_EQ(f32_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0);  // below half the smallest subnormal
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(f32_to_fp8_e4m3(NAN))));
}

/// A TensorRef over `bytes` (kept alive by the caller).
TensorRef view(const std::string& name, const std::string& dtype_name, DType dtype, std::vector<int64_t> shape,
               const std::vector<uint8_t>& bytes) {
  TensorRef t;
  t.name = name, t.file = "test.safetensors", t.dtype_name = dtype_name, t.dtype = dtype, t.shape = std::move(shape);
  t.data = reinterpret_cast<const std::byte*>(bytes.data()), t.nbytes = bytes.size();
  return t;
}

// dequantize_fp8 against the naive formula: a 3-D [2, 100, 90] tensor with 48 x 40 blocks (partial blocks at both
// edges), F32 and BF16 scales, F32 and BF16 output; a per-tensor scale.
TEST(Fp8, DequantizesPartialBlocksOfStackedMatrices) {
  const int64_t E = 2, N = 100, K = 90;
  const Fp8Quantization quant{"fp8", 48, 40};
  const std::vector<int64_t> grid = fp8_scale_shape({E, N, K}, quant);
  ASSERT_EQ(grid, (std::vector<int64_t>{E, 3, 3}));
  std::mt19937 rng(7);
  std::vector<uint8_t> q(static_cast<size_t>(E * N * K));
  for (auto& b : q) {
    b = static_cast<uint8_t>(rng() & 0xff);
    if ((b & 0x7f) == 0x7f) b = 0x3c;  // no NaN codes
  }
  std::vector<float> scales(static_cast<size_t>(E * 9));
  for (auto& s : scales) s = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, static_cast<int>(rng() % 12) - 14);
  std::vector<uint8_t> s32(scales.size() * 4), s16(scales.size() * 2);
  std::memcpy(s32.data(), scales.data(), s32.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    const uint16_t h = f32_to_bf16(scales[i]);
    std::memcpy(s16.data() + 2 * i, &h, 2);
  }
  const TensorRef tq = view("experts.gate_up_proj", "F8_E4M3", DType::F32, {E, N, K}, q);
  for (const bool bf16_scales : {false, true}) {
    const TensorRef ts = bf16_scales ? view("experts.gate_up_proj_scale_inv", "BF16", DType::BF16, grid, s16)
                                     : view("experts.gate_up_proj_scale_inv", "F32", DType::F32, grid, s32);
    for (const DType out : {DType::F32, DType::BF16}) {
      const Weight w = dequantize_fp8(tq, ts, quant, out);
      ASSERT_EQ(w.rows, E);
      ASSERT_EQ(w.cols, N * K);
      ASSERT_EQ(w.dtype, out);
      int64_t mismatches = 0;
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < N; ++r)
          for (int64_t c = 0; c < K; ++c) {
            const size_t si = static_cast<size_t>((e * 3 + r / 48) * 3 + c / 40);
            const float scale = bf16_scales ? bf16_to_f32(f32_to_bf16(scales[si])) : scales[si];
            const float want32 = static_cast<float>(e4m3_reference(q[(e * N + r) * K + c])) * scale;
            const float want = out == DType::F32 ? want32 : bf16_to_f32(f32_to_bf16(want32));
            mismatches += w.at(e, r * K + c) != want;
          }
      EXPECT_EQ(mismatches, 0) << "bf16 scales " << bf16_scales << ", out " << dtype_name(out);
    }
  }
  // One scale per matrix (a null weight_block_size, compressed-tensors' "tensor" strategy), stored as [2]; one per
  // output channel ("channel": [2, 100, 1]).
  const std::vector<float> two = {0.25f, 0.5f};
  std::vector<uint8_t> two_bytes(8);
  std::memcpy(two_bytes.data(), two.data(), 8);
  const Weight w = dequantize_fp8(tq, view("s", "F32", DType::F32, {2}, two_bytes), Fp8Quantization{}, DType::F32);
  EXPECT_EQ(w.at(0, 5 * K + 7), static_cast<float>(e4m3_reference(q[5 * K + 7])) * 0.25f);
  EXPECT_EQ(w.at(1, 5 * K + 7), static_cast<float>(e4m3_reference(q[(N + 5) * K + 7])) * 0.5f);
  std::vector<float> per_row(static_cast<size_t>(E * N));
  for (size_t i = 0; i < per_row.size(); ++i) per_row[i] = std::ldexp(1.0f, static_cast<int>(i % 7) - 3);
  std::vector<uint8_t> row_bytes(per_row.size() * 4);
  std::memcpy(row_bytes.data(), per_row.data(), row_bytes.size());
  const Weight wc = dequantize_fp8(tq, view("s", "F32", DType::F32, {E, N, 1}, row_bytes), Fp8Quantization{"compressed-tensors", 1, 0, "_scale"}, DType::F32);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < N; r += 7)
      EXPECT_EQ(wc.at(e, r * K + 3), static_cast<float>(e4m3_reference(q[(e * N + r) * K + 3])) * per_row[e * N + r]) << e << " " << r;
  // A scale grid of the wrong size is named.
  try {
    (void)dequantize_fp8(tq, view("experts.gate_up_proj_scale_inv", "F32", DType::F32, {E, 3, 2}, s32), quant, DType::F32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"experts.gate_up_proj_scale_inv\" has shape [2, 3, 2]"));
    EXPECT_THAT(e.what(), HasSubstr("scale blocks [48, 40] (0: the whole dimension) needs [2, 3, 3]"));
  }
}

// A whole model (Qwen3-Next layout: DeltaNet, gated attention, 8 experts + shared expert) from an FP8 checkpoint
// equals the same model from a checkpoint of its dequantized weights, bit for bit: with --dtype float32 (fp32
// dequantization) and auto (bf16), in every format: "fp8" at blocks that do not divide the matrices (48 x 40) and with
// one scale per matrix, compressed-tensors per channel and per block, modelopt per matrix.
TEST(Fp8, ModelEqualsItsDequantizedCheckpoint) {
  for (const nlohmann::json& config : {fp8_config({48, 40}), fp8_config(nullptr), testing::compressed_tensors_config("channel"),
                                       testing::compressed_tensors_config("block", {32, 64}), testing::modelopt_config()}) {
    SCOPED_TRACE("quantization_config " + config["quantization_config"].dump());
    TempDir fp8("fp8"), ref32("fp8ref32"), ref16("fp8ref16");
    write_fp8_model(fp8.path(), config);
    write_dequantized_copy(fp8.path(), ref32.path(), "F32");
    write_dequantized_copy(fp8.path(), ref16.path(), "BF16");
    const auto a = greedy_outputs(fp8.path(), "float32");
    expect_identical(a, greedy_outputs(ref32.path(), "float32"));
    const auto b = greedy_outputs(fp8.path(), "auto");
    expect_identical(b, greedy_outputs(ref16.path(), "auto"));
    // The two roundings differ somewhere, so the comparisons above can tell them apart.
    bool differs = false;
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t s = 0; s < a[i].outputs[0].logprobs.size(); ++s)
        differs |= a[i].outputs[0].logprobs[s][0].logprob != b[i].outputs[0].logprobs[s][0].logprob;
    EXPECT_TRUE(differs);
  }
}

TEST(Fp8, BadQuantizationConfigsAreNamed) {
  const std::pair<nlohmann::json, std::string> cases[] = {
      {{{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}, "quant_method \"bitsandbytes\") is not supported"},
      {{{"quant_method", "fp8"}, {"fmt", "e5m2"}}, "quantization_config.fmt \"e5m2\" is not supported (only \"e4m3\")"},
      {{{"quant_method", "fp8"}, {"activation_scheme", "per_group"}}, "activation_scheme \"per_group\" is not supported"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128}}}, "weight_block_size must be [rows, columns]"},
      {{{"quant_method", "fp8"}, {"weight_block_size", {0, 128}}}, "weight_block_size must be [rows, columns]"},
      {"fp8", "\"quantization_config\" must be an object"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "int-quantized"})"),
       "quantization_config.format \"int-quantized\" is not supported"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups":
          {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}}})"),
       "quantization_config.config_groups.g.weights {num_bits: 4, type: \"int\"} is not supported"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups":
          {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "group"}}}})"),
       "weights.strategy \"group\" is not supported"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups":
          {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}})"),
       "weights.block_structure is required"},
      {nlohmann::json::parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})"),
       "quantization_config.quant_algo \"NVFP4\" is not supported"},
  };
  TempDir tmp("fp8cfg");
  for (const auto& [q, want] : cases) {
    nlohmann::json c = fp8_config({32, 32});
    c["quantization_config"] = q;
    testing::write_file(tmp / "config.json", c.dump());
    try {
      (void)ModelConfig::load(tmp.path());
      ADD_FAILURE() << q.dump() << ": no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(want)) << q.dump();
    }
  }
}

TEST(Fp8, BadCheckpointsAreNamed) {
  TempDir good("fp8good");
  write_fp8_model(good.path(), fp8_config({32, 32}));
  const Checkpoint ck = Checkpoint::open(good.path());
  const std::string victim = "model.layers.3.self_attn.o_proj.weight";
  ASSERT_NE(ck.find_raw(victim), nullptr);
  // Rewrites the checkpoint with `edit` applied to its tensor list and `config` as config.json.
  auto variant = [&](const TempDir& dir, const nlohmann::json& config, const std::function<void(std::vector<FixtureTensor>&)>& edit) {
    std::vector<FixtureTensor> tensors;
    for (const std::string& name : ck.names()) {
      const TensorRef* t = ck.find(name);
      if (t == nullptr) t = ck.find_raw(name);
      tensors.push_back({name, t->dtype_name, t->shape, std::string(reinterpret_cast<const char*>(t->data), t->nbytes)});
    }
    edit(tensors);
    testing::write_safetensors(dir / "model.safetensors", tensors);
    testing::write_file(dir / "config.json", config.dump());
  };
  {  // FP8 tensors but no quantization_config
    TempDir d("fp8noq");
    nlohmann::json c = fp8_config({32, 32});
    c.erase("quantization_config");
    variant(d, c, [](auto&) {});
    EXPECT_THAT(load_error(d.path()), HasSubstr("is FP8 (F8_E4M3), but config.json has no quantization_config"));
  }
  {  // a missing scale
    TempDir d("fp8nos");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      std::erase_if(ts, [&](const FixtureTensor& t) { return t.name == victim + "_scale_inv"; });
    });
    EXPECT_THAT(load_error(d.path()), HasSubstr("FP8 tensor \"" + victim + "\" has no scale tensor \"" + victim + "_scale_inv\""));
  }
  {  // scales for another block size
    TempDir d("fp8blk");
    variant(d, fp8_config({64, 64}), [](auto&) {});
    EXPECT_THAT(load_error(d.path()), HasSubstr("with scale blocks [64, 64] (0: the whole dimension) needs"));
  }
  {  // a quantized matrix of the wrong shape
    TempDir d("fp8shape");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      for (auto& t : ts)
        if (t.name == victim) t.shape = {256, 128}, t.bytes.resize(256 * 128);
    });
    EXPECT_THAT(load_error(d.path()), HasSubstr("\"" + victim + "\" has shape [256, 128] but the model config expects [128, 256]"));
  }
  {  // a scale of a dtype scales never have
    TempDir d("fp8sdt");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      for (auto& t : ts)
        if (t.name == victim + "_scale_inv") t.dtype = "I32";
    });
    EXPECT_THAT(load_error(d.path()), HasSubstr("scale tensor \"" + victim + "_scale_inv\" has dtype I32"));
  }
  {  // as many scales as the grid, transposed: refused, not applied to the wrong blocks
    TempDir d("fp8tr");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      for (auto& t : ts)
        if (t.name == victim + "_scale_inv") t.shape = {8, 4};  // o_proj [128, 256] in 32 x 32 blocks: [4, 8]
    });
    EXPECT_THAT(load_error(d.path()), HasSubstr("\"" + victim + "_scale_inv\" has shape [8, 4], but FP8 matrix"));
  }
  {  // a NaN code in an FP8 matrix: it loads (as a NaN in a bf16 checkpoint does), and a warning names the matrix
    TempDir d("fp8nan");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      for (auto& t : ts)
        if (t.name == victim) t.bytes[300] = static_cast<char>(0x7f);
    });
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(testing::model_dir("tiny-mamba") / f, d / f);
    const testing::CliRun r = testing::run_cli("generate --model " + d.path().string() + " --prompt The --max-tokens 2");
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("tensor \"" + victim + "\" holds 1 NaN / Inf value(s) (first at flat index 300)"));
  }
  {  // a NaN scale: the warning names the scale tensor (it named only the matrix it spoils)
    TempDir d("fp8nanscale");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      for (auto& t : ts)
        if (t.name == victim + "_scale_inv") {
          ASSERT_TRUE(t.dtype == "F32" || t.dtype == "BF16") << t.dtype;
          if (t.dtype == "F32") t.bytes[2] = static_cast<char>(0xc0), t.bytes[3] = static_cast<char>(0x7f);
          else t.bytes[0] = static_cast<char>(0xc0), t.bytes[1] = static_cast<char>(0x7f);
        }
    });
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(testing::model_dir("tiny-mamba") / f, d / f);
    const testing::CliRun r = testing::run_cli("generate --model " + d.path().string() + " --prompt The --max-tokens 2");
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("tensor \"" + victim + "_scale_inv\" holds 1 NaN / Inf value(s) (first at flat index 0)"));
  }
  EXPECT_EQ(load_error(good.path()), "");
  {  // vLLM's own FP8 serialization names the scales X.weight_scale: the same model
    TempDir d("fp8vllm");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      for (auto& t : ts)
        if (t.name.size() > 10 && t.name.compare(t.name.size() - 10, 10, "_scale_inv") == 0) t.name.resize(t.name.size() - 4);
    });
    expect_identical(greedy_outputs(d.path(), "auto"), greedy_outputs(good.path(), "auto"));
  }
  {  // Model Optimizer's hf_quant_config.json instead of config.json's quantization_config: the same model
    TempDir a("fp8mo"), b("fp8mohf");
    write_fp8_model(a.path(), testing::modelopt_config());
    std::filesystem::copy_file(a / "model.safetensors", b / "model.safetensors");
    nlohmann::json c = testing::read_json(a / "config.json");
    c.erase("quantization_config");
    testing::write_file(b / "config.json", c.dump());
    testing::write_file(b / "hf_quant_config.json",
                        R"({"producer": {"name": "modelopt", "version": "0.19.0"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": null, "exclude_modules": ["lm_head"]}})");
    expect_identical(greedy_outputs(b.path(), "auto"), greedy_outputs(a.path(), "auto"));
    testing::write_file(b / "hf_quant_config.json", R"({"quantization": {"quant_algo": "W4A16_AWQ"}})");
    EXPECT_THAT(load_error(b.path()), HasSubstr("hf_quant_config.json: quantization_config.quant_algo \"W4A16_AWQ\" is not supported"));
  }
  {  // activation and KV-cache scales (static activations, an FP8 KV cache) are known, not "unused" weights
    TempDir d("fp8extra");
    variant(d, fp8_config({32, 32}), [&](auto& ts) {
      ts.push_back(testing::f32_tensor("model.layers.3.self_attn.o_proj.input_scale", {1}, {0.5f}));
      ts.push_back(testing::f32_tensor("model.layers.3.self_attn.k_scale", {1}, {0.5f}));
    });
    const ModelConfig cfg = ModelConfig::load(d.path());
    std::shared_ptr<const Checkpoint> held;
    WeightSource src = WeightSource::open(cfg, false, &held);
    (void)load_decoder_from(cfg, architecture_spec(cfg), src, held);
    EXPECT_EQ(src.unused_tensors(), std::vector<std::string>{});
  }
}

/// check_quantization's message ("" when it passes).
std::string quantization_error(const std::string& q, const ModelConfig& m) {
  try {
    check_quantization(q, m);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// --quantization (vLLM's -q) names the checkpoint's own method or nothing; the engine checks it before loading.
TEST(Fp8, QuantizationFlagMatchesTheCheckpoint) {
  TempDir fp8("fp8q");
  write_fp8_model(fp8.path(), fp8_config({32, 32}));
  const ModelConfig q = ModelConfig::load(fp8.path());
  const ModelConfig plain = ModelConfig::load(testing::model_dir("tiny-mamba"));
  EXPECT_EQ(quantization_error("", q), "");
  EXPECT_EQ(quantization_error("", plain), "");
  EXPECT_EQ(quantization_error("fp8", q), "");
  EXPECT_THAT(quantization_error("modelopt", q), HasSubstr("--quantization modelopt does not match the checkpoint's "
                                                           "quantization_config (quant_method \"fp8\")"));
  EXPECT_THAT(quantization_error("fp8", plain), HasSubstr("is not quantized, and ssmserve does not quantize weights at load"));
  EXPECT_THAT(quantization_error("gguf", q), HasSubstr("--quantization must be fp8, compressed-tensors, modelopt, gptq"));
  EXPECT_THAT(quantization_error("gptq", q), HasSubstr("--quantization gptq does not match"));
  EngineConfig cfg;
  cfg.model = fp8.path();
  cfg.tokenizer = testing::model_dir("tiny-mamba");
  cfg.quantization = "compressed-tensors";
  try {
    LLM llm(cfg);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--quantization compressed-tensors does not match"));
  }
}

}  // namespace
}  // namespace ssmserve
