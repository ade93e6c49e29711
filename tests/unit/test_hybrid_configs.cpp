// Bad input to the Mamba hybrids (Granite-4.0-H, Bamba, Nemotron-H, Jamba, Falcon-H1) and the Gated DeltaNet hybrids
// (Qwen3.5 / Qwen3.6, Qwen3-Next): every malformed config or checkpoint is an Error naming the field (or tensor) at
// fault, never a silent default or a crash, from the library and from `ssmserve generate`. The configs are the tiny
// checkpoints' (../shared/models, skipped when absent) and the dummy-weight ones of tests/data/tiny-hybrids, each with
// one field changed.
#include <unistd.h>

#include <fstream>
#include <functional>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "checkpoint_fixtures.h"
#include "cli_runner.h"
#include "config/hf_json.h"
#include "config/model_config.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_spec.h"
#include "model/decoder/param_estimate.h"
#include "model/ffns/moe_ffn.h"
#include "model/mixers/attention_mixer.h"
#include "model/mixers/gated_delta_mixer.h"
#include "model/mixers/mamba2_mixer.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using ::testing::HasSubstr;

nlohmann::json read_config(const std::filesystem::path& dir) {
  const auto p = dir / "config.json";
  return parse_hf_json(read_text_file(p), p.string());
}

// A tiny checkpoint's config.json, or null when the shared models folder lacks it.
nlohmann::json checkpoint_config(const std::string& name) {
  const auto dir = testing::model_dir(name);
  return std::filesystem::exists(dir / "config.json") ? read_config(dir) : nlohmann::json();
}

nlohmann::json dummy_config(const std::string& name) { return read_config(testing::source_dir() / "tests/data/tiny-hybrids" / name); }

// What mapping `j` onto a decoder says (empty: accepted).
std::string spec_error(const nlohmann::json& j) {
  try {
    (void)architecture_spec(ModelConfig::from_json(j));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// What the module of `kind` says of the parameters `j`'s mapping gives it (a module validates its own fields when
// built, before reading its weights; here without loading any).
std::string module_error(const nlohmann::json& j, const std::string& kind) {
  try {
    const ModelConfig cfg = ModelConfig::from_json(j);
    const DecoderSpec s = architecture_spec(cfg);
    const nlohmann::json& params = s.module_params.count(kind) ? s.module_params.at(kind) : cfg.raw;
    if (kind == "moe") (void)MoeConfig::from_json(params);
    else if (kind == "attention") (void)AttentionConfig::from_json(params, cfg);
    else ADD_FAILURE() << "no module " << kind;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define SKIP_IF_NULL(j, name) \
  if ((j).is_null()) GTEST_SKIP() << name << " not found under " << testing::shared_models_dir().string()

TEST(HybridConfigs, TheConfigsAsGivenAreAccepted) {
  for (const char* name : {"tiny-granitemoehybrid", "tiny-nemotron_h"}) {
    const nlohmann::json j = checkpoint_config(name);
    if (!j.is_null()) {
      EXPECT_EQ(spec_error(j), "") << name;
    }
  }
  for (const char* name : {"tiny-bamba", "tiny-jamba", "tiny-granite-dense", "tiny-nemotron_h-pattern", "tiny-falcon_h1"})
    EXPECT_EQ(spec_error(dummy_config(name)), "") << name;
}

TEST(HybridConfigs, UnknownLayerType) {
  nlohmann::json j = checkpoint_config("tiny-nemotron_h");
  SKIP_IF_NULL(j, "tiny-nemotron_h");
  j["layers_block_type"][2] = "mamba3";
  EXPECT_THAT(spec_error(j), HasSubstr("\"layers_block_type\" entry \"mamba3\" is not a known layer type"));
  j["layers_block_type"][2] = 7;
  EXPECT_THAT(spec_error(j), HasSubstr("\"layers_block_type\" entries must be strings (got 7)"));
  nlohmann::json g = checkpoint_config("tiny-granitemoehybrid");
  g["layer_types"][0] = "sliding_attention";
  EXPECT_THAT(spec_error(g), HasSubstr("\"layer_types\" entry \"sliding_attention\" is not a known layer type"));
  // hybrid_override_pattern: M, *, -, E only.
  nlohmann::json p = dummy_config("tiny-nemotron_h-pattern");
  ASSERT_EQ(p["hybrid_override_pattern"], "ME*-M");
  p["hybrid_override_pattern"] = "ME*XM";
  EXPECT_THAT(spec_error(p), HasSubstr("\"hybrid_override_pattern\" character 'X' is not one of M (mamba), * (attention)"));
  // A type the family has no layer of: a Nemotron 'moe' (or 'mlp') layer in a Granite config, where every layer
  // is a mixer and an FFN; a 'moe' layer type in Jamba (its experts come from expert_layer_period).
  g = checkpoint_config("tiny-granitemoehybrid");
  g["layer_types"][5] = "moe";
  EXPECT_THAT(spec_error(g), HasSubstr("config.json: layer 5 is a \"moe\" layer, which Granite-4.0-H does not have"));
  g["layer_types"][5] = "mlp";
  EXPECT_THAT(spec_error(g), HasSubstr("config.json: layer 5 is a \"mlp\" layer, which Granite-4.0-H does not have"));
  nlohmann::json jb = dummy_config("tiny-jamba");
  jb["layers_block_type"] = {"mamba", "mamba", "moe", "mamba"};
  EXPECT_THAT(spec_error(jb), HasSubstr("config.json: layer 2 is a \"moe\" layer, which Jamba does not have"));
}

TEST(HybridConfigs, LayerTypeListLengthDiffersFromNumHiddenLayers) {
  nlohmann::json g = checkpoint_config("tiny-granitemoehybrid");
  SKIP_IF_NULL(g, "tiny-granitemoehybrid");
  g["layer_types"].erase(g["layer_types"].size() - 1);  // 7 types, num_hidden_layers 8
  EXPECT_THAT(spec_error(g), HasSubstr("\"layer_types\" must list 8 layer types (num_hidden_layers)"));
  // Nemotron-H written by transformers 5.x has no num_hidden_layers (the list's length is the count); when both are
  // given they must agree.
  nlohmann::json n = checkpoint_config("tiny-nemotron_h");
  SKIP_IF_NULL(n, "tiny-nemotron_h");
  ASSERT_FALSE(n.contains("num_hidden_layers"));
  n["num_hidden_layers"] = 9;
  EXPECT_THAT(spec_error(n), HasSubstr("\"layers_block_type\" must list 9 layer types (num_hidden_layers)"));
  nlohmann::json p = dummy_config("tiny-nemotron_h-pattern");
  p["hybrid_override_pattern"] = "ME*-MM";
  EXPECT_THAT(spec_error(p), HasSubstr("\"hybrid_override_pattern\" has 6 characters, expected 5 (num_hidden_layers)"));
  nlohmann::json b = dummy_config("tiny-bamba");
  b["attn_layer_indices"] = {2, 4};
  EXPECT_THAT(spec_error(b), HasSubstr("\"attn_layer_indices\" entry 4 is not a layer index in [0, 4)"));
}

TEST(HybridConfigs, MambaHeadsTimesHeadDimMustEqualTheInnerSize) {
  nlohmann::json g = checkpoint_config("tiny-granitemoehybrid");
  SKIP_IF_NULL(g, "tiny-granitemoehybrid");
  g["mamba_d_head"] = 32;  // 8 x 32 = 256, mamba_expand 2 x hidden_size 256 = 512
  EXPECT_THAT(spec_error(g), HasSubstr("config.json: mamba_n_heads 8 x mamba_d_head 32 must equal the Mamba-2 inner size 512 "
                                       "(mamba_expand x hidden_size)"));
  g["mamba_d_head"] = "auto";  // 512 / 8
  EXPECT_EQ(spec_error(g), "");
  g["mamba_n_heads"] = 7;
  EXPECT_THAT(spec_error(g), HasSubstr("mamba_n_heads 7 must divide the Mamba-2 inner size 512"));
  g["mamba_d_head"] = "half";
  EXPECT_THAT(spec_error(g), HasSubstr("mamba_d_head must be an integer or \"auto\" (got \"half\")"));
  // Bamba spells it the same way; Falcon-H1 against mamba_d_ssm when given.
  nlohmann::json b = dummy_config("tiny-bamba");
  b["mamba_d_head"] = 2 * b["mamba_expand"].get<int>() * b["hidden_size"].get<int>() / b["mamba_n_heads"].get<int>();
  EXPECT_THAT(spec_error(b), HasSubstr("must equal the Mamba-2 inner size"));
  nlohmann::json f = dummy_config("tiny-falcon_h1");
  f["mamba_d_ssm"] = f["mamba_d_ssm"].get<int>() + f["mamba_n_heads"].get<int>();
  EXPECT_THAT(spec_error(f), HasSubstr("must equal the Mamba-2 inner size"));
  EXPECT_THAT(spec_error(f), HasSubstr("(mamba_d_ssm)"));
  // Nemotron-H's mixer is mamba_num_heads x mamba_head_dim wide whatever expand says (transformers and vLLM;
  // Nemotron-Nano-9B-v2: 128 x 80 = 10240 with hidden_size 4480 and expand 2).
  const auto nano = testing::source_dir() / "configs/nemotron-nano-9b-v2";
  if (std::filesystem::exists(nano / "config.json")) {
    const ModelConfig cfg = ModelConfig::from_json(read_config(nano));
    const DecoderSpec s = architecture_spec(cfg);
    EXPECT_EQ(Mamba2Config::from_json(s.module_params.at("mamba2"), cfg).d_inner, 10240);
  }
}

TEST(HybridConfigs, RoutingGroupsMustDivideTheExperts) {
  nlohmann::json n = checkpoint_config("tiny-nemotron_h");
  SKIP_IF_NULL(n, "tiny-nemotron_h");
  ASSERT_EQ(n["n_routed_experts"], 4);
  EXPECT_EQ(module_error(n, "moe"), "");
  n["n_group"] = 3;  // 4 experts in 3 groups
  EXPECT_THAT(module_error(n, "moe"), HasSubstr("n_group 3 / topk_group 1 do not fit 4 experts"));
  n["n_group"] = 2, n["topk_group"] = 3;  // more groups picked than there are
  EXPECT_THAT(module_error(n, "moe"), HasSubstr("n_group 2 / topk_group 3 do not fit 4 experts"));
  n["n_group"] = 0, n["topk_group"] = 1;
  EXPECT_THAT(module_error(n, "moe"), HasSubstr("n_group"));
  n["n_group"] = 2;  // 2 groups of 2, pick 1 group: top-2 still fits
  EXPECT_EQ(module_error(n, "moe"), "");
  // ... and when loading (the MoE layer's module is built before its weights are read; layer 1 of "ME*-M").
  nlohmann::json p = dummy_config("tiny-nemotron_h-pattern");
  p["n_routed_experts"] = 8, p["n_group"] = 3;
  try {
    (void)load_model(ModelConfig::from_json(p), LoadFormat::Dummy);
    ADD_FAILURE() << "n_group 3 loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("n_group 3 / topk_group 1 do not fit 8 experts"));
  }
}

TEST(HybridConfigs, UnsupportedFeatureFields) {
  nlohmann::json n = checkpoint_config("tiny-nemotron_h");
  SKIP_IF_NULL(n, "tiny-nemotron_h");
  n["moe_latent_size"] = 64;
  EXPECT_THAT(spec_error(n), HasSubstr("moe_latent_size (latent MoE projections) is not supported"));
  n["moe_latent_size"] = nullptr;  // as the checkpoint has it
  EXPECT_EQ(spec_error(n), "");
  n["attention_bias"] = true;
  EXPECT_THAT(spec_error(n), HasSubstr("attention_bias true is not supported for Nemotron-H"));
  nlohmann::json g = checkpoint_config("tiny-granitemoehybrid");
  g["attention_bias"] = true;
  EXPECT_THAT(spec_error(g), HasSubstr("attention_bias true is not supported for Granite-4.0-H"));
  g["attention_bias"] = "yes";
  EXPECT_THAT(spec_error(g), HasSubstr("attention_bias"));
  nlohmann::json b = dummy_config("tiny-bamba");
  b["attention_bias"] = true;
  EXPECT_THAT(spec_error(b), HasSubstr("attention_bias true is not supported for Bamba"));
  // Jamba and Falcon-H1 leave it to the attention module (an error when the model is built).
  for (const char* name : {"tiny-jamba", "tiny-falcon_h1"}) {
    nlohmann::json j = dummy_config(name);
    EXPECT_EQ(module_error(j, "attention"), "") << name;
    j["attention_bias"] = true;
    EXPECT_THAT(module_error(j, "attention"), HasSubstr("attention_bias true is not supported")) << name;
  }
}

// A checkpoint missing one tensor (the tiny checkpoint's file without it): loading names the tensor.
void expect_missing_tensor_named(const std::string& model, const std::string& tensor) {
  const auto dir = testing::model_dir(model);
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << model << " not found";
  testing::TempDir tmp("missing-tensor");
  std::filesystem::copy_file(dir / "config.json", tmp / "config.json");
  testing::SafetensorsImage img = testing::SafetensorsImage::load(dir / "model.safetensors");
  ASSERT_TRUE(img.header.contains(tensor)) << tensor;
  // Rebuild the file without it (the others laid out back to back, as a writer would).
  std::vector<testing::FixtureTensor> tensors;
  for (const auto& [name, meta] : img.header.items()) {
    if (name == "__metadata__" || name == tensor) continue;
    const size_t begin = meta["data_offsets"][0], end = meta["data_offsets"][1];
    tensors.push_back({name, meta["dtype"], meta["shape"].get<std::vector<int64_t>>(), img.data.substr(begin, end - begin)});
  }
  testing::write_safetensors(tmp / "model.safetensors", tensors);
  try {
    (void)load_model(tmp.path(), LoadFormat::Auto);
    ADD_FAILURE() << "a checkpoint without " << tensor << " loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(tensor));
  }
}

// Granite's shared expert (beside the routed experts, under its own prefix); Nemotron-H's router correction bias
// (which dummy weights fill with zeros: a checkpoint must not fall back to that).
TEST(HybridConfigs, MissingTensorIsNamed) {
  expect_missing_tensor_named("tiny-granitemoehybrid", "model.layers.0.shared_mlp.output_linear.weight");
  expect_missing_tensor_named("tiny-nemotron_h", "backbone.layers.5.mixer.gate.e_score_correction_bias");
}

// From a break test: heads that do not divide hidden_size name both fields (not a head_dim the family never writes);
// Nemotron-H with n_shared_experts 0 has no shared expert (not an error about a field the user never wrote).
TEST(HybridConfigs, HeadsNotDividingHiddenAndNoSharedExperts) {
  nlohmann::json g = dummy_config("tiny-granite-dense");
  g["num_attention_heads"] = 3, g["num_key_value_heads"] = 1;
  EXPECT_THAT(module_error(g, "attention"), HasSubstr("hidden_size 128 is not a multiple of num_attention_heads 3"));
  nlohmann::json n = dummy_config("tiny-nemotron_h-pattern");
  n["n_shared_experts"] = 0;
  EXPECT_EQ(module_error(n, "moe"), "");
  const ModelConfig cfg = ModelConfig::from_json(n);
  EXPECT_EQ(MoeConfig::from_json(architecture_spec(cfg).module_params.at("moe")).shared_intermediate_size, 0);
}

// An odd rotary width (head_dim x partial_rotary_factor): refused, not rounded (transformers rotates the next even
// count with the odd count's frequencies; a break test found 19 of 64 dims accepted silently).
TEST(QwenConfigs, OddRotaryWidthIsRefused) {
  nlohmann::json q = dummy_config("tiny-qwen3_5");  // head_dim 64
  q["partial_rotary_factor"] = 0.3, q["rope_parameters"]["partial_rotary_factor"] = 0.3;
  EXPECT_THAT(module_error(q, "attention"), HasSubstr("head_dim 64 x partial_rotary_factor 0.3 = 19 rotary dims; they must be even"));
  q["partial_rotary_factor"] = 0.5, q["rope_parameters"]["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(module_error(q, "attention"), "");
}

// The dummy-load memory check counts parameters from the modules' hyperparameters: the real-shape configs give the
// counts transformers gives for the same configs (a meta-device model, tools/bench_hybrids_reference.py).
TEST(HybridConfigs, ParameterEstimateMatchesTransformers) {
  const std::pair<const char*, double> cases[] = {
      {"granite-4.0-h-tiny", 6939037248.0},
      {"nemotron-nano-9b-v2", 8888227328.0},
      {"nemotron-3-nano-30b-a3b", 31577937344.0},
      {"falcon-h1-7b", 7585654880.0},
  };
  for (const auto& [name, want] : cases) {
    const ModelConfig cfg = ModelConfig::load(testing::source_dir() / "configs" / name);
    const double got = estimate_param_count(cfg, architecture_spec(cfg));
    EXPECT_NEAR(got / want, 1.0, 0.01) << name << ": " << got << " vs " << want;
  }
}

// A dummy load that cannot fit in memory is refused before it allocates (here: 118 GiB of weights and panels).
TEST(HybridConfigs, DummyLoadLargerThanMemoryIsRefused) {
  const ModelConfig cfg = ModelConfig::load(testing::source_dir() / "configs/nemotron-3-nano-30b-a3b");
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0 || 4 * 31.6e9 <= 0.8 * static_cast<double>(pages) * page) GTEST_SKIP() << "this machine has the memory";
  try {
    load_model(cfg, LoadFormat::Dummy);
    ADD_FAILURE() << "a 31.6 B-parameter dummy load was not refused";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("dummy Nemotron-H weights need"));
  }
}

// ---- Qwen3.5 / Qwen3.6 / Qwen3-Next ----

// What loading `j` with dummy weights says (empty: loaded). Modules validate their own fields when built.
std::string load_error(const nlohmann::json& j) {
  try {
    (void)load_model(ModelConfig::from_json(j), LoadFormat::Dummy);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The dense dummy config wrapped as Qwen3.5's multimodal checkpoints write it (the decoder's fields in text_config).
nlohmann::json qwen_wrapper(const nlohmann::json& text) {
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}, {"text_config", text},
          {"tie_word_embeddings", true}};
}

TEST(QwenConfigs, TheConfigsAsGivenAreAccepted) {
  for (const char* name : {"tiny-qwen3_5", "tiny-qwen3_next"}) EXPECT_EQ(load_error(dummy_config(name)), "") << name;
  EXPECT_EQ(load_error(qwen_wrapper(dummy_config("tiny-qwen3_5"))), "");
  const nlohmann::json moe = checkpoint_config("tiny-qwen3_5_moe");
  if (!moe.is_null()) {
    EXPECT_EQ(spec_error(moe), "");
  }
}

TEST(QwenConfigs, ValueHeadsMustBeAMultipleOfKeyHeads) {
  nlohmann::json j = dummy_config("tiny-qwen3_5");
  j["linear_num_value_heads"] = 3;  // 2 key heads
  EXPECT_THAT(load_error(j), HasSubstr("linear_num_value_heads 3 must be a multiple of linear_num_key_heads 2"));
  nlohmann::json n = dummy_config("tiny-qwen3_next");
  n["linear_num_key_heads"] = 3;  // 4 value heads
  EXPECT_THAT(load_error(n), HasSubstr("linear_num_value_heads 4 must be a multiple of linear_num_key_heads 3"));
  nlohmann::json w = qwen_wrapper(dummy_config("tiny-qwen3_5"));
  w["text_config"]["linear_num_value_heads"] = 5;
  EXPECT_THAT(load_error(w), HasSubstr("linear_num_value_heads 5 must be a multiple of linear_num_key_heads 2"));
  j = dummy_config("tiny-qwen3_5");
  j["linear_num_key_heads"] = 0;
  EXPECT_THAT(load_error(j), HasSubstr("field \"linear_num_key_heads\" must be a positive integer (got 0)"));
}

TEST(QwenConfigs, LayerTypesAreLinearOrFullAttention) {
  nlohmann::json j = dummy_config("tiny-qwen3_5");
  for (const char* bad : {"sliding_attention", "mamba", "attention", "linear"}) {
    j["layer_types"][1] = bad;
    EXPECT_THAT(spec_error(j), HasSubstr(fmt::format("config.json: \"layer_types\" entry \"{}\" is not a Qwen3.5 layer type "
                                                     "(linear_attention or full_attention)", bad)));
  }
  j["layer_types"][1] = 3;
  EXPECT_THAT(spec_error(j), HasSubstr("\"layer_types\" entries must be strings (got 3)"));
  j["layer_types"] = {"linear_attention", "full_attention"};  // 4 layers
  EXPECT_THAT(spec_error(j), HasSubstr("\"layer_types\" must list 4 layer types (num_hidden_layers)"));
  // Qwen3-Next places attention by full_attention_interval unless layer_types is given.
  nlohmann::json n = dummy_config("tiny-qwen3_next");
  n["layer_types"] = {"linear_attention", "moe", "linear_attention", "full_attention"};
  EXPECT_THAT(spec_error(n), HasSubstr("\"layer_types\" entry \"moe\" is not a Qwen3-Next layer type"));
  n.erase("layer_types");
  n["full_attention_interval"] = 0;
  EXPECT_THAT(spec_error(n), HasSubstr("field \"full_attention_interval\" must be a positive integer (got 0)"));
  nlohmann::json w = qwen_wrapper(dummy_config("tiny-qwen3_5"));
  w["text_config"]["layer_types"][0] = "linear_attn";
  EXPECT_THAT(spec_error(w), HasSubstr("\"layer_types\" entry \"linear_attn\" is not a Qwen3.5 layer type"));
}

TEST(QwenConfigs, TextConfigMustBeAnObject) {
  nlohmann::json w = qwen_wrapper(dummy_config("tiny-qwen3_5"));
  w["text_config"] = "qwen3_5_text";
  EXPECT_THAT(spec_error(w), HasSubstr("field \"text_config\" must be an object (got \"qwen3_5_text\")"));
  w["text_config"] = {1, 2};
  EXPECT_THAT(spec_error(w), HasSubstr("field \"text_config\" must be an object"));
  w["text_config"] = nullptr;  // no decoder fields anywhere
  EXPECT_THAT(spec_error(w), HasSubstr("vocab_size"));
}

TEST(QwenConfigs, MissingDeltaNetFieldIsNamed) {
  for (const char* field : {"linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads"}) {
    nlohmann::json j = dummy_config("tiny-qwen3_5");
    j.erase(field);
    EXPECT_THAT(load_error(j), HasSubstr(fmt::format("field \"{}\" is missing", field)));
    nlohmann::json w = qwen_wrapper(dummy_config("tiny-qwen3_5"));
    w["text_config"].erase(field);
    EXPECT_THAT(load_error(w), HasSubstr(fmt::format("field \"{}\" is missing", field)));
  }
  nlohmann::json j = dummy_config("tiny-qwen3_next");
  j["linear_key_head_dim"] = "32";
  EXPECT_THAT(load_error(j), HasSubstr("field \"linear_key_head_dim\" must be a positive integer (got \"32\")"));
}

// The projection layout is the architecture's (qwen3_5: in_proj_qkv / in_proj_z / in_proj_b / in_proj_a; qwen3_next:
// fused in_proj_qkvz / in_proj_ba): another is refused by the mixer, and a checkpoint in the other layout names the
// tensor its architecture expects.
TEST(QwenConfigs, ProjectionLayout) {
  const nlohmann::json j = dummy_config("tiny-qwen3_5");
  const ModelConfig cfg = ModelConfig::from_json(j);
  try {
    nlohmann::json params = j;
    params["projection_layout"] = "qwen4";
    (void)GatedDeltaConfig::from_json(params, cfg);
    ADD_FAILURE() << "projection_layout qwen4 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Gated DeltaNet projection_layout must be \"qwen3_5\" or \"qwen3_next\" (got \"qwen4\")"));
  }
  const auto dir = testing::model_dir("tiny-qwen3_5_moe");
  if (!std::filesystem::exists(dir / "model.safetensors")) GTEST_SKIP() << "tiny-qwen3_5_moe not found";
  testing::TempDir tmp("qwen-layout");
  std::filesystem::copy_file(dir / "config.json", tmp / "config.json");
  // Layer 0's in_proj_qkv and in_proj_z fused into one in_proj_qkvz (Qwen3-Next's name), the rest as they were.
  testing::SafetensorsImage img = testing::SafetensorsImage::load(dir / "model.safetensors");
  const std::string p = "model.language_model.layers.0.linear_attn.";
  ASSERT_TRUE(img.header.contains(p + "in_proj_qkv.weight"));
  std::vector<testing::FixtureTensor> tensors;
  const auto bytes = [&](const nlohmann::json& meta) {
    const size_t begin = meta["data_offsets"][0], end = meta["data_offsets"][1];
    return img.data.substr(begin, end - begin);
  };
  for (const auto& [name, meta] : img.header.items()) {
    if (name == "__metadata__" || name == p + "in_proj_z.weight") continue;
    if (name == p + "in_proj_qkv.weight") {
      const nlohmann::json& z = img.header[p + "in_proj_z.weight"];
      std::vector<int64_t> shape = meta["shape"].get<std::vector<int64_t>>();
      shape[0] += z["shape"][0].get<int64_t>();
      tensors.push_back({p + "in_proj_qkvz.weight", meta["dtype"], shape, bytes(meta) + bytes(z)});
      continue;
    }
    tensors.push_back({name, meta["dtype"], meta["shape"].get<std::vector<int64_t>>(), bytes(meta)});
  }
  testing::write_safetensors(tmp / "model.safetensors", tensors);
  try {
    (void)load_model(tmp.path(), LoadFormat::Auto);
    ADD_FAILURE() << "a Qwen3.5 checkpoint with a fused in_proj_qkvz loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(p + "in_proj_qkv.weight"));
  }
}

// The same defects through `ssmserve generate` on a copy of tiny-qwen3_5_moe (weights and tokenizer linked): exit
// status 1 and one "error:" line naming the field.
TEST(QwenConfigs, GenerateNamesTheField) {
  const auto dir = testing::model_dir("tiny-qwen3_5_moe");
  SSM_SKIP_IF_NO_MODEL(dir);
  const nlohmann::json base = read_config(dir);
  const std::pair<std::function<void(nlohmann::json&)>, std::string> cases[] = {
      {[](nlohmann::json& j) { j["text_config"]["linear_num_value_heads"] = 6; },
       "linear_num_value_heads 6 must be a multiple of linear_num_key_heads 4"},
      {[](nlohmann::json& j) { j["text_config"]["layer_types"][2] = "sliding_attention"; },
       "\"layer_types\" entry \"sliding_attention\" is not a Qwen3.5-MoE layer type (linear_attention or full_attention)"},
      {[](nlohmann::json& j) { j["text_config"] = "text"; }, "field \"text_config\" must be an object (got \"text\")"},
      {[](nlohmann::json& j) { j["text_config"].erase("linear_key_head_dim"); }, "field \"linear_key_head_dim\" is missing"},
  };
  for (const auto& [mutate, needle] : cases) {
    testing::TempDir tmp("qwen-cli");
    for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"})
      if (std::filesystem::exists(dir / f)) std::filesystem::create_symlink(dir / f, tmp / f);
    nlohmann::json j = base;
    mutate(j);
    std::ofstream(tmp / "config.json") << j.dump(2);
    const auto r = testing::run_cli("generate --model " + tmp.path().string() + " --prompt hello --max-tokens 2 --threads 1");
    EXPECT_EQ(r.status, 1) << needle << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: ")) << needle;
    EXPECT_THAT(r.err, HasSubstr(needle));
  }
}

}  // namespace
}  // namespace ssmserve
