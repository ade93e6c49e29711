// Config fields read loosely before (from a break test): a config with model_type but no architectures maps to the
// class transformers would pick; a mistyped hidden_act or rope_parameters is an error naming the field, not silently
// the default.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "config/model_config.h"
#include "core/error.h"
#include "model/decoder/decoder_spec.h"
#include "model/mixers/attention_mixer.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using ::testing::HasSubstr;

nlohmann::json tiny_minimax() {
  std::ifstream in(testing::source_dir() / "tests/cuda/configs/tiny-minimax/config.json");
  return nlohmann::json::parse(in);
}

std::string spec_error(const nlohmann::json& j) {
  try {
    (void)architecture_spec(ModelConfig::from_json(j));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigSpellings, ModelTypeStandsInForArchitectures) {
  nlohmann::json j = tiny_minimax();
  j.erase("architectures");
  EXPECT_EQ(ModelConfig::from_json(j).architecture, "MiniMaxForCausalLM");
  // The Mamba hybrids' model_type names (transformers' CONFIG_MAPPING keys).
  for (const auto& [type, arch] : std::vector<std::pair<std::string, std::string>>{
           {"granitemoehybrid", "GraniteMoeHybridForCausalLM"}, {"bamba", "BambaForCausalLM"},
           {"nemotron_h", "NemotronHForCausalLM"}, {"jamba", "JambaForCausalLM"}, {"falcon_h1", "FalconH1ForCausalLM"}}) {
    j["model_type"] = type;
    EXPECT_EQ(ModelConfig::from_json(j).architecture, arch) << type;
  }
  j["model_type"] = "llama";
  try {
    (void)ModelConfig::from_json(j);
    ADD_FAILURE() << "unknown model_type accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model_type \"llama\" names no supported architecture"));
  }
}

TEST(ConfigSpellings, MistypedFieldsAreErrors) {
  nlohmann::json j = tiny_minimax();
  EXPECT_EQ(spec_error(j), "");
  j["hidden_act"] = 3;
  EXPECT_THAT(spec_error(j), HasSubstr("field \"hidden_act\" must be a string"));
  j = tiny_minimax();
  j["rope_parameters"] = "default";
  EXPECT_THAT(spec_error(j), HasSubstr("field \"rope_parameters\" must be an object"));
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_EQ(spec_error(j), "");
}

nlohmann::json tiny_hybrid(const char* name) {
  std::ifstream in(testing::source_dir() / "tests/data/tiny-hybrids" / name / "config.json");
  return nlohmann::json::parse(in);
}

/// The error of building the model's attention layers' config (where RoPE is read), "" when it builds.
std::string attention_error(const nlohmann::json& j) {
  try {
    const ModelConfig cfg = ModelConfig::from_json(j);
    const DecoderSpec s = architecture_spec(cfg);
    (void)AttentionConfig::from_json(s.params("attention", cfg), cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string config_error(const nlohmann::json& j) {
  try {
    (void)ModelConfig::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// transformers 4.x configs (Qwen3-Next, Bamba, Falcon-H1 as published; Qwen's model cards tell users to add YaRN
// there) spell RoPE scaling "rope_scaling": a scaling ssmserve does not implement is refused, not silently dropped.
TEST(ConfigSpellings, RopeScalingOtherThanDefaultIsRefused) {
  for (const char* name : {"tiny-qwen3_next", "tiny-qwen3_5", "tiny-bamba", "tiny-falcon_h1"}) {
    nlohmann::json j = tiny_hybrid(name);
    ASSERT_EQ(attention_error(j), "") << name;
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
    EXPECT_THAT(attention_error(j), HasSubstr("rope_scaling.rope_type \"yarn\" is not supported")) << name;
    j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    EXPECT_THAT(attention_error(j), HasSubstr("rope_scaling.type \"linear\" is not supported")) << name;
    j["rope_scaling"] = "yarn";
    EXPECT_THAT(attention_error(j), HasSubstr("field \"rope_scaling\" must be an object")) << name;
    j["rope_scaling"] = nullptr;
    EXPECT_EQ(attention_error(j), "") << name;
    j["rope_scaling"] = {{"rope_type", "default"}};
    EXPECT_EQ(attention_error(j), "") << name;
    j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {3, 3, 2}}};  // Qwen2-VL's spelling of "default"
    EXPECT_EQ(attention_error(j), "") << name;
  }
  nlohmann::json j = tiny_hybrid("tiny-qwen3_5");
  j["rope_parameters"]["type"] = "yarn";  // the older key inside rope_parameters
  EXPECT_THAT(attention_error(j), HasSubstr("rope_parameters.type \"yarn\" is not supported"));
}

// Without num_hidden_layers (transformers 5.x drops it for Nemotron-H), a malformed hybrid_override_pattern is named,
// not reported as a missing num_hidden_layers.
TEST(ConfigSpellings, MalformedLayerPatternIsNamedWithoutNumHiddenLayers) {
  nlohmann::json j = tiny_hybrid("tiny-nemotron_h-pattern");
  j.erase("num_hidden_layers");
  EXPECT_EQ(ModelConfig::from_json(j).num_hidden_layers, 5);
  for (const nlohmann::json& bad : {nlohmann::json(""), nlohmann::json(5), nlohmann::json::array()}) {
    j["hybrid_override_pattern"] = bad;
    EXPECT_THAT(config_error(j), HasSubstr("field \"hybrid_override_pattern\" must be a non-empty string")) << bad;
  }
  j.erase("hybrid_override_pattern");
  j["layers_block_type"] = "mamba";
  EXPECT_THAT(config_error(j), HasSubstr("field \"layers_block_type\" must be a non-empty list of layer types"));
  j["layers_block_type"] = nlohmann::json::array();
  EXPECT_THAT(config_error(j), HasSubstr("field \"layers_block_type\" must be a non-empty list of layer types"));
  j.erase("layers_block_type");
  EXPECT_THAT(config_error(j), HasSubstr("required field \"num_hidden_layers\" is missing"));
}

// A quantized checkpoint's config (top level, or inside a multimodal wrapper's text_config) other than FP8 is refused
// up front (FP8 checkpoints: tests/model/test_fp8_checkpoint.cpp).
TEST(ConfigSpellings, QuantizationConfigsLoadOrAreRefused) {
  nlohmann::json j = tiny_hybrid("tiny-qwen3_5");
  j["quantization_config"] = nullptr;
  EXPECT_EQ(config_error(j), "");
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  EXPECT_EQ(config_error(j), "");
  EXPECT_EQ(ModelConfig::from_json(j).fp8->block_k, 128);
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  EXPECT_EQ(config_error(j), "");
  EXPECT_EQ(ModelConfig::from_json(j).int_quant->group_size, 128);
  j["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  EXPECT_THAT(config_error(j), HasSubstr("field \"quantization_config\" (quant_method \"bitsandbytes\") is not supported"));
  j["quantization_config"] = "gptq";
  EXPECT_THAT(config_error(j), HasSubstr("field \"quantization_config\" must be an object"));
  j["quantization_config"] = nlohmann::json::object();
  EXPECT_THAT(config_error(j), HasSubstr("quantization_config has no string \"quant_method\" (got none)"));
  nlohmann::json wrapper = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"},
                            {"text_config", tiny_hybrid("tiny-qwen3_5")}};
  wrapper["text_config"].erase("architectures");
  EXPECT_EQ(config_error(wrapper), "");
  wrapper["quantization_config"] = {{"quant_method", "awq"}};  // the wrapper's quantization_config is read
  EXPECT_EQ(ModelConfig::from_json(wrapper).int_quant->method, "awq");
  wrapper["quantization_config"] = {{"quant_method", "hqq"}};
  EXPECT_THAT(config_error(wrapper), HasSubstr("(quant_method \"hqq\") is not supported"));
}

/// Each layer's module kinds ("mamba2", "attention", "mlp", "moe"; mixer or FFN, whichever the layer has).
std::vector<std::string> layer_kinds(const nlohmann::json& j) {
  std::vector<std::string> out;
  for (const LayerSpec& l : architecture_spec(ModelConfig::from_json(j)).layers) out.push_back(l.mixer.kind.empty() ? l.ffn.kind : l.mixer.kind);
  return out;
}

// NVIDIA's remote-code NemotronHConfig saves hybrid_override_pattern plus a cache-only `layer_types` that tags MLP
// layers "moe": the pattern (or transformers 5.x's layers_block_type) decides; the two must agree when both are given.
TEST(ConfigSpellings, NemotronHPatternOutranksCacheLayerTypes) {
  nlohmann::json j = tiny_hybrid("tiny-nemotron_h-pattern");  // "ME*-M"
  const std::vector<std::string> want = {"mamba2", "moe", "attention", "mlp", "mamba2"};
  EXPECT_EQ(layer_kinds(j), want);
  j["layer_types"] = {"mamba", "moe", "attention", "moe", "mamba"};
  EXPECT_EQ(layer_kinds(j), want);
  j["layers_block_type"] = {"mamba", "moe", "attention", "mlp", "mamba"};
  EXPECT_EQ(layer_kinds(j), want);
  j["layers_block_type"] = {"mamba", "moe", "attention", "moe", "mamba"};
  EXPECT_THAT(spec_error(j), HasSubstr("\"layers_block_type\" and \"hybrid_override_pattern\" disagree at layer 3 (moe vs mlp)"));
  j.erase("hybrid_override_pattern");
  j["layers_block_type"] = {"linear_attention", "moe", "full_attention", "mlp", "linear_attention"};  // transformers 5.x
  EXPECT_EQ(layer_kinds(j), want);
  j.erase("layers_block_type");
  j["layer_types"] = {"mamba", "moe", "attention", "mlp", "mamba"};  // alone, layer_types is read
  EXPECT_EQ(layer_kinds(j), want);
}

// A number field of the wrong JSON type names config.json, as every other config error does.
TEST(ConfigSpellings, NonNumericFloatFieldsNameConfigJson) {
  nlohmann::json j = tiny_hybrid("tiny-granite-dense");
  j["embedding_multiplier"] = "12";
  EXPECT_THAT(spec_error(j), HasSubstr("config.json: field \"embedding_multiplier\" must be a number (got \"12\")"));
  j = tiny_hybrid("tiny-falcon_h1");
  j["ssm_multipliers"] = {1.0, "x", 1.0, 1.0, 1.0};
  EXPECT_THAT(spec_error(j), HasSubstr("config.json: field \"ssm_multipliers\" must be a number"));
  j = tiny_hybrid("tiny-qwen3_next");
  j["rope_theta"] = "1e7";
  EXPECT_THAT(attention_error(j), HasSubstr("config.json: field \"rope_theta\" must be a number"));
}

}  // namespace
}  // namespace ssmserve
