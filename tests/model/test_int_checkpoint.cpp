// GPTQ and AWQ checkpoints (quantization_config quant_method "gptq" / "awq": integer codes packed in I32 words with
// per-group F16 scales and zero points): a whole model (Qwen3-Next layout: DeltaNet, gated attention, experts) loaded
// from a checkpoint this file quantizes and packs as the quantizers do (AutoGPTQ's and AutoAWQ's packing order, GPTQ
// v1's stored zero - 1, act-order g_idx, 2 / 4 / 8 bits, group sizes that do and do not divide the rows, one group)
// equals the same model from a checkpoint of the dequantized weights (W = scale x (q - zero), fp32), bit for bit with
// --dtype float32 and auto (bf16); and the errors for bad configs and checkpoints.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "checkpoint_fixtures.h"
#include "int_quant_fixtures.h"
#include "core/error.h"
#include "engine/engine_config.h"
#include "engine/llm_engine.h"
#include "model/checkpoint.h"
#include "model/decoder/decoder_lm.h"
#include "model/dummy_checkpoint.h"
#include "quantized_outputs.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::FixtureTensor;
using testing::TempDir;
using testing::expect_identical;
using testing::greedy_outputs;
using testing::load_error;
using testing::Scheme;
using testing::awq;
using testing::gptq;
using testing::pack_quantized;
using testing::write_quantized_pair;
using ::testing::HasSubstr;

TEST(IntQuantized, ModelEqualsItsDequantizedCheckpoint) {
  const Scheme schemes[] = {gptq(4, 32, false, false, true),  gptq(4, 48, false, true, true), gptq(8, 0, true, false, false),
                            gptq(2, 32, false, false, false), gptq(4, 128, true, false, true), awq(32), awq(0),
                            pack_quantized(4, 32, true, false), pack_quantized(4, 48, false, true), pack_quantized(8, 0, true, false),
                            testing::gptq_dynamic()};
  for (const Scheme& s : schemes) {
    SCOPED_TRACE("quantization_config " + s.config.dump());
    TempDir q("intq"), ref("intref");
    ASSERT_GT(write_quantized_pair(s, q.path(), ref.path()), 20);  // every layer's projections, the experts' included
    const auto a = greedy_outputs(q.path(), "float32");
    ASSERT_EQ(a[0].outputs[0].token_ids.size(), 12u);
    expect_identical(a, greedy_outputs(ref.path(), "float32"));
  }
}

// The bf16 dequantization (dtype auto) is the fp32 one rounded once: the same model as a BF16 copy of the reference.
TEST(IntQuantized, Bf16DequantizationIsTheF32OneRoundedOnce) {
  TempDir q("intq16"), ref("intref16"), ref16("intref16b");
  write_quantized_pair(gptq(4, 32, false, false, true), q.path(), ref.path());
  testing::write_bf16_copy(ref.path(), ref16.path());
  expect_identical(greedy_outputs(q.path(), "auto"), greedy_outputs(ref16.path(), "auto"));
}

TEST(IntQuantized, BadConfigsAreNamed) {
  const std::pair<nlohmann::json, std::string> cases[] = {
      {{{"quant_method", "gptq"}, {"bits", 3}}, "quantization_config.bits 3 is not supported for GPTQ"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 0}}, "group_size must be a positive integer or -1"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"desc_act", "yes"}}, "quantization_config.desc_act must be true or false"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "marlin"}}, "checkpoint_format \"marlin\" is not supported"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"version", "GEMV"}}, "quantization_config.version \"gemv\" is not supported"},
      {{{"quant_method", "awq"}, {"bits", 8}}, "quantization_config.bits 8 is not supported for AWQ"},
      {{{"quant_method", "bitsandbytes"}}, "quant_method \"bitsandbytes\") is not supported"},
      {{{"quant_method", "gptq"}, {"pack_dtype", "int16"}}, "quantization_config.pack_dtype \"int16\" is not supported"},
      {{{"quant_method", "gptq"}, {"dynamic", {{"+:(", {{"bits", 8}}}}}}, "the regex does not compile"},
      {{{"quant_method", "gptq"}, {"dynamic", {{"+:.*", {{"bits", 3}}}}}}, ".bits 3 is not supported for GPTQ"},
      {{{"quant_method", "gptq"}, {"dynamic", {{"+:.*", {{"damp", 3}}}}}}, ".damp is not supported"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g":
          {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32},
           "input_activations": {"num_bits": 8, "type": "int"}}}})"), "input_activations {\"num_bits\":8"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g":
          {"weights": {"num_bits": 4, "type": "int", "strategy": "tensor"}}}})"), "strategy \"tensor\" is not supported"},
      {nlohmann::json::parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g":
          {"weights": {"num_bits": 2, "type": "int", "strategy": "channel"}}}})"), "{num_bits: 2, type: \"int\"} is not supported"},
  };
  for (const auto& [q, needle] : cases) {
    nlohmann::json config = testing::read_json(testing::source_dir() / "tests/data/tiny-hybrids/tiny-qwen3_next/config.json");
    config["quantization_config"] = q;
    TempDir d("intbadcfg");
    testing::write_file(d.path() / "config.json", config.dump());
    try {
      (void)ModelConfig::load(d.path());
      ADD_FAILURE() << "no error for " << q.dump();
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(needle)) << q.dump();
    }
  }
}

/// `qdir`'s checkpoint rewritten with `edit` applied to its tensor list.
void rewrite(const std::filesystem::path& qdir, const std::function<void(std::vector<FixtureTensor>&)>& edit) {
  const Checkpoint ck = Checkpoint::open(qdir);
  std::vector<FixtureTensor> tensors;
  for (const std::string& name : ck.names()) {
    const TensorRef* t = ck.find(name);
    if (t == nullptr) t = ck.find_raw(name);
    tensors.push_back({name, t->dtype_name.empty() ? std::string(dtype_name(t->dtype)) : t->dtype_name, t->shape,
                       std::string(reinterpret_cast<const char*>(t->data), t->nbytes)});
  }
  edit(tensors);
  testing::write_safetensors(qdir / "model.safetensors.tmp", tensors);
  std::filesystem::rename(qdir / "model.safetensors.tmp", qdir / "model.safetensors");
}

TEST(IntQuantized, BadCheckpointsAreNamed) {
  const std::string x = "model.layers.0.linear_attn.out_proj";
  const std::pair<std::function<void(std::vector<FixtureTensor>&)>, std::string> cases[] = {
      {[&](auto& ts) { std::erase_if(ts, [&](const auto& t) { return t.name == x + ".scales"; }); },
       "has no tensor \"" + x + ".scales\""},
      {[&](auto& ts) { for (auto& t : ts) if (t.name == x + ".qweight") t.dtype = "F32"; },
       "tensor \"" + x + ".qweight\" has dtype F32; the packed codes of a quantized matrix are I32 words"},
      {[&](auto& ts) { for (auto& t : ts) if (t.name == x + ".scales") t.shape = {t.shape[0] * 2, t.shape[1] / 2}; },
       "tensor \"" + x + ".scales\" has shape"},
      {[&](auto& ts) { for (auto& t : ts) if (t.name == x + ".qzeros") t.shape = {t.shape[1], t.shape[0]}; },
       "tensor \"" + x + ".qzeros\" has shape"},
      {[&](auto& ts) {
         for (auto& t : ts)
           if (t.name == x + ".g_idx") std::memset(t.bytes.data(), 0x7f, 4);
       },
       "gives input row 0 group"},
  };
  for (const auto& [edit, needle] : cases) {
    TempDir q("intbad"), ref("intbadref");
    write_quantized_pair(gptq(4, 32, false, false, true), q.path(), ref.path());
    rewrite(q.path(), edit);
    EXPECT_THAT(load_error(q.path()), HasSubstr(needle));
  }
  // A GPTQ checkpoint whose config.json lost its quantization_config.
  TempDir q("intnocfg"), ref("intnocfgref");
  write_quantized_pair(gptq(4, 32, false, false, true), q.path(), ref.path());
  nlohmann::json config = testing::read_json(q.path() / "config.json");
  config.erase("quantization_config");
  testing::write_file(q.path() / "config.json", config.dump());
  EXPECT_THAT(load_error(q.path()), HasSubstr("is a GPTQ / AWQ / pack-quantized matrix, but config.json has no quantization_config"));
  // Zero points in a checkpoint whose config says there are none (AWQ zero_point false).
  TempDir z("intzp"), zref("intzpref");
  write_quantized_pair(awq(32), z.path(), zref.path());
  config = testing::read_json(z.path() / "config.json");
  config["quantization_config"]["zero_point"] = false;
  testing::write_file(z.path() / "config.json", config.dump());
  EXPECT_THAT(load_error(z.path()), HasSubstr("holds zero points, but config.json's quantization_config says there are none"));
  // Two dynamic rules for one module: which applies is not known (config.json's key order is not kept).
  TempDir d("intdyn"), dref("intdynref");
  testing::Scheme s = testing::gptq_dynamic();
  write_quantized_pair(s, d.path(), dref.path());
  config = testing::read_json(d.path() / "config.json");
  config["quantization_config"]["dynamic"]["+:.*experts"] = {{"bits", 8}};
  testing::write_file(d.path() / "config.json", config.dump());
  EXPECT_THAT(load_error(d.path()), HasSubstr("matches both"));
}

TEST(IntQuantized, QuantizationFlagMatchesTheCheckpoint) {
  TempDir q("intflag"), ref("intflagref"), a("intflagawq"), aref("intflagawqref");
  write_quantized_pair(gptq(4, 32, false, false, true), q.path(), ref.path());
  write_quantized_pair(awq(32), a.path(), aref.path());
  const auto error = [](const std::string& flag, const std::filesystem::path& dir) {
    try {
      check_quantization(flag, ModelConfig::load(dir));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("gptq", q.path()), "");
  nlohmann::json upper = testing::read_json(q.path() / "config.json");  // vLLM lower-cases quant_method
  upper["quantization_config"]["quant_method"] = "GPTQ";
  testing::write_file(q.path() / "config.json", upper.dump());
  EXPECT_EQ(error("gptq", q.path()), "");
  EXPECT_EQ(error("gptq_marlin", q.path()), "");
  EXPECT_EQ(error("awq", a.path()), "");
  EXPECT_EQ(error("awq_marlin", a.path()), "");
  EXPECT_THAT(error("awq", q.path()), HasSubstr("--quantization awq does not match the checkpoint's quantization_config "
                                                "(quant_method \"gptq\")"));
  EXPECT_THAT(error("fp8", a.path()), HasSubstr("(quant_method \"awq\")"));
  TempDir c("intflagct"), cref("intflagctref");
  write_quantized_pair(pack_quantized(4, 32, true, false), c.path(), cref.path());
  EXPECT_EQ(error("compressed-tensors", c.path()), "");
  EXPECT_THAT(error("gptq", c.path()), HasSubstr("(quant_method \"compressed-tensors\")"));
}

}  // namespace
}  // namespace ssmserve
