// Owns the unit tests of ModelConfig / MambaConfig loading and of the Hugging Face JSON dialect (bare
// Infinity/NaN, {"__float__": ...}), including every validation error's message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "checkpoint_fixtures.h"
#include "config/model_config.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using ::ssmserve::testing::TempDir;
using ::ssmserve::testing::write_file;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::filesystem::path kSource = SSMSERVE_SOURCE_DIR;

/// A minimal valid Mamba-1 config.json.
json mamba_cfg() {
  return json::parse(R"({"architectures": ["MambaForCausalLM"], "model_type": "mamba", "vocab_size": 100,
    "hidden_size": 64, "num_hidden_layers": 2, "state_size": 16, "conv_kernel": 4, "expand": 2,
    "intermediate_size": 128, "time_step_rank": 4, "layer_norm_epsilon": 1e-5, "eos_token_id": 0,
    "bos_token_id": 0, "pad_token_id": 0, "dtype": "bfloat16", "tie_word_embeddings": true})");
}

/// Message of the Error thrown by from_json(cfg) (empty + test failure when none).
std::string from_json_error(const json& cfg) {
  try {
    ModelConfig::from_json(cfg, "/m");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an Error for " << cfg.dump();
  return {};
}

/// Message of the Error thrown by load(dir) (empty + test failure when none).
std::string load_error(const std::filesystem::path& dir) {
  try {
    ModelConfig::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an Error loading " << dir;
  return {};
}

TEST(ModelConfigLoad, TinyMamba) {
  const ModelConfig c = ModelConfig::load(kSource / "models/tiny-mamba");
  EXPECT_EQ(c.architecture, "MambaForCausalLM");
  EXPECT_EQ(c.model_type, "mamba");
  EXPECT_EQ(c.vocab_size, 50280);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_FLOAT_EQ(c.layer_norm_epsilon, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{0});
  EXPECT_EQ(c.max_model_len, 0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  ASSERT_TRUE(c.mamba.has_value());
  EXPECT_EQ(c.mamba->d_inner, 512);
  EXPECT_EQ(c.mamba->d_state, 16);
  EXPECT_EQ(c.mamba->d_conv, 4);
  EXPECT_EQ(c.mamba->dt_rank, 16);
  EXPECT_FALSE(c.mamba->use_bias);
  EXPECT_TRUE(c.mamba->use_conv_bias);
  EXPECT_TRUE(c.mamba->residual_in_fp32);
}

TEST(ModelConfigLoad, OtherArchitecturesParseWithoutMambaSection) {
  const auto shared = kSource / "../shared/models";
  if (!std::filesystem::exists(shared / "tiny-mamba2/config.json")) GTEST_SKIP() << "no ../shared/models";
  const ModelConfig m2 = ModelConfig::load(shared / "tiny-mamba2");
  EXPECT_EQ(m2.architecture, "Mamba2ForCausalLM");
  EXPECT_FALSE(m2.mamba.has_value());
  const json& limit = m2.raw.at("time_step_limit");  // [0.0, {"__float__": "Infinity"}]
  EXPECT_EQ(json_float(limit[0], "time_step_limit"), 0.0);
  EXPECT_TRUE(std::isinf(json_float(limit[1], "time_step_limit")));
  EXPECT_TRUE(limit[1].is_number());  // normalized by parse_hf_json

  const ModelConfig mm = ModelConfig::load(shared / "tiny-minimax");
  EXPECT_EQ(mm.architecture, "MiniMaxForCausalLM");
  EXPECT_FALSE(mm.mamba.has_value());
  EXPECT_EQ(mm.max_model_len, 8192);
  EXPECT_FLOAT_EQ(mm.layer_norm_epsilon, 1e-5f);
}

TEST(ModelConfigHfJson, BareInfinityAndNaNOutsideStrings) {
  const json v = parse_hf_json(
      R"({"a": Infinity, "b": -Infinity, "c": NaN, "d": [1, NaN], "s": "Infinity and NaN stay", "e\"Infinity": 2})",
      "t.json");
  EXPECT_TRUE(std::isinf(v["a"].get<double>()) && v["a"].get<double>() > 0);
  EXPECT_TRUE(std::isinf(v["b"].get<double>()) && v["b"].get<double>() < 0);
  EXPECT_TRUE(std::isnan(v["c"].get<double>()));
  EXPECT_TRUE(std::isnan(v["d"][1].get<double>()));
  EXPECT_EQ(v["s"], "Infinity and NaN stay");
  EXPECT_EQ(v["e\"Infinity"], 2);
}

TEST(ModelConfigHfJson, FloatObjects) {
  const json v = parse_hf_json(R"({"x": {"__float__": "Infinity"}, "y": {"__float__": "-Infinity"},
      "z": {"__float__": "NaN"}, "w": {"__float__": "2.5"}, "odd": {"__float__": "banana"}})", "t.json");
  EXPECT_EQ(json_float(v["x"], "x"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(json_float(v["y"], "y"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(json_float(v["z"], "z")));
  EXPECT_EQ(json_float(v["w"], "w"), 2.5);
  EXPECT_EQ(json_float(json{{"__float__", "Infinity"}}, "raw"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(json_float(json(3), "i"), 3.0);
  try {
    json_float(v["odd"], "odd");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("\"odd\""));
    EXPECT_THAT(std::string(e.what()), HasSubstr("banana"));
  }
  EXPECT_THROW(json_float(json("1.0"), "s"), Error);
  EXPECT_THROW(json_float(json(true), "b"), Error);
}

TEST(ModelConfigHfJson, InvalidJsonNamesSourceAndPosition) {
  try {
    parse_hf_json("{\"a\": 1,\n \"b\": }", "cfg.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("cfg.json"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("byte 15"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("line 2"));
  }
  // Positions refer to the original text even after bare tokens were rewritten.
  try {
    parse_hf_json(R"({"a": Infinity, "b": NaN, "c": ])", "cfg.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("byte 31"));
  }
  EXPECT_THROW(parse_hf_json("", "empty.json"), Error);
  EXPECT_THROW(parse_hf_json("{\"a\": Infinityy}", "t.json"), Error);
  EXPECT_THROW(parse_hf_json("{\"a\": \"unterminated", "t.json"), Error);
}

TEST(ModelConfigFromJson, DerivedFields) {
  json cfg = mamba_cfg();
  cfg.erase("intermediate_size");
  cfg["expand"] = 3;
  cfg["hidden_size"] = 100;
  cfg["time_step_rank"] = "auto";
  cfg.erase("dtype");
  cfg["torch_dtype"] = "float32";
  cfg["eos_token_id"] = json::array({1, 2});
  cfg["pad_token_id"] = nullptr;
  const ModelConfig c = ModelConfig::from_json(cfg);
  ASSERT_TRUE(c.mamba.has_value());
  EXPECT_EQ(c.mamba->d_inner, 300);
  EXPECT_EQ(c.mamba->dt_rank, 7);  // ceil(100 / 16)
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(c.pad_token_id, -1);

  cfg.erase("time_step_rank");
  cfg.erase("expand");
  EXPECT_EQ(ModelConfig::from_json(cfg).mamba->dt_rank, 7);
  EXPECT_EQ(ModelConfig::from_json(cfg).mamba->d_inner, 200);
  EXPECT_EQ(MambaConfig::from_json(cfg, 100).d_state, 16);
}

TEST(ModelConfigFromJson, MissingFields) {
  for (const char* field : {"vocab_size", "hidden_size", "num_hidden_layers", "state_size", "conv_kernel"}) {
    json cfg = mamba_cfg();
    cfg.erase(field);
    const std::string msg = from_json_error(cfg);
    EXPECT_THAT(msg, HasSubstr("config.json"));
    EXPECT_THAT(msg, HasSubstr(std::string("\"") + field + "\" is missing"));
  }
  json cfg = mamba_cfg();
  cfg.erase("architectures");
  cfg.erase("model_type");
  EXPECT_THAT(from_json_error(cfg), HasSubstr("architectures"));
  EXPECT_THAT(from_json_error(json::array()), HasSubstr("JSON object"));
}

TEST(ModelConfigFromJson, InvalidValues) {
  const std::vector<std::pair<std::string, json>> bad = {
      {"state_size", "abc"},     {"hidden_size", -4},       {"num_hidden_layers", 0},
      {"vocab_size", 1.5},       {"conv_kernel", true},     {"intermediate_size", 0},
      {"time_step_rank", "big"}, {"time_step_rank", -1},    {"expand", 0},
      {"use_bias", "no"},        {"eos_token_id", -3},      {"eos_token_id", json::array({1, "x"})},
      {"bos_token_id", 1e20},    {"layer_norm_epsilon", 0}, {"layer_norm_epsilon", "tiny"},
      {"dtype", 16},             {"architectures", json::array()}, {"hidden_size", 1e12},
      {"vocab_size", 4294967296}};
  for (const auto& [field, value] : bad) {
    json cfg = mamba_cfg();
    cfg[field] = value;
    if (field == "expand") cfg.erase("intermediate_size");
    const std::string msg = from_json_error(cfg);
    EXPECT_THAT(msg, HasSubstr("/m/config.json")) << field;
    EXPECT_THAT(msg, HasSubstr("\"" + field + "\"")) << field;
  }
  json cfg = mamba_cfg();
  cfg["state_size"] = "abc";
  EXPECT_THAT(from_json_error(cfg), HasSubstr(R"(field "state_size" must be a positive integer (got "abc"))"));
}

TEST(ModelConfigLoad, FolderErrors) {
  TempDir dir("cfg");
  EXPECT_THAT(load_error(dir / "absent"), HasSubstr("absent"));
  std::string msg = load_error(dir.path());
  EXPECT_THAT(msg, HasSubstr((dir / "config.json").string()));
  EXPECT_THAT(msg, HasSubstr("not found"));

  write_file(dir / "config.json", "{\"vocab_size\": 10,,}");
  msg = load_error(dir.path());
  EXPECT_THAT(msg, HasSubstr((dir / "config.json").string()));
  EXPECT_THAT(msg, HasSubstr("invalid JSON at byte 18"));
}

TEST(ModelConfigLoad, InfinityInConfigAndGenerationOverrides) {
  TempDir dir("cfg");
  json cfg = mamba_cfg();
  std::string text = cfg.dump(2);
  text.insert(text.rfind('}'), ",\n  \"time_step_max\": Infinity, \"time_step_limit\": [0.0, {\"__float__\": "
                               "\"Infinity\"}], \"odd\": -Infinity, \"nan\": NaN\n");
  write_file(dir / "config.json", text);
  ModelConfig c = ModelConfig::load(dir.path());
  EXPECT_TRUE(std::isinf(json_float(c.raw["time_step_max"], "time_step_max")));
  EXPECT_TRUE(std::isinf(json_float(c.raw["time_step_limit"][1], "time_step_limit")));
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{0});

  write_file(dir / "generation_config.json", R"({"eos_token_id": [5, 7], "bos_token_id": 1})");
  c = ModelConfig::load(dir.path());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{5, 7}));
  write_file(dir / "generation_config.json", R"({"eos_token_id": 9})");
  EXPECT_EQ(ModelConfig::load(dir.path()).eos_token_ids, std::vector<int>{9});
  write_file(dir / "generation_config.json", R"({"do_sample": false})");
  EXPECT_EQ(ModelConfig::load(dir.path()).eos_token_ids, std::vector<int>{0});

  write_file(dir / "generation_config.json", R"({"eos_token_id": "x"})");
  const std::string msg = load_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("generation_config.json"));
  EXPECT_THAT(msg, HasSubstr("eos_token_id"));
  write_file(dir / "generation_config.json", R"({"eos_token_id": )");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("generation_config.json"));
}

TEST(ModelConfigFromJson, RejectsUnsupportedHiddenAct) {
  json cfg = mamba_cfg();
  cfg["hidden_act"] = "gelu";
  const std::string msg = from_json_error(cfg);
  EXPECT_THAT(msg, HasSubstr("/m/config.json"));
  EXPECT_THAT(msg, HasSubstr(R"(field "hidden_act" is "gelu")"));
  cfg["hidden_act"] = "silu";
  EXPECT_NO_THROW(ModelConfig::from_json(cfg, "/m"));
  cfg["hidden_act"] = "swish";  // the same function in HF's ACT2FN
  EXPECT_NO_THROW(ModelConfig::from_json(cfg, "/m"));
}

TEST(ModelConfigFromJson, RejectsTokenIdsOutsideVocab) {
  for (const char* field : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    json cfg = mamba_cfg();  // vocab_size 100
    cfg[field] = 100;
    std::string msg = from_json_error(cfg);
    EXPECT_THAT(msg, HasSubstr("\"" + std::string(field) + "\" is 100, outside the vocabulary [0, 100)")) << field;
    cfg[field] = 99;
    EXPECT_NO_THROW(ModelConfig::from_json(cfg, "/m")) << field;
  }
  json cfg = mamba_cfg();
  cfg["eos_token_id"] = {1, 2, 150};
  EXPECT_THAT(from_json_error(cfg), HasSubstr("\"eos_token_id\" is 150"));

  TempDir dir("cfg");
  write_file(dir / "config.json", mamba_cfg().dump());
  write_file(dir / "generation_config.json", R"({"eos_token_id": [5, 100]})");
  const std::string msg = load_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("generation_config.json"));
  EXPECT_THAT(msg, HasSubstr("\"eos_token_id\" is 100"));
}

TEST(ModelConfigFromJson, NonFiniteEpsilonIsNamed) {
  for (const auto& [text, shown] : std::vector<std::pair<std::string, std::string>>{
           {"Infinity", "Infinity"}, {"-Infinity", "-Infinity"}, {"NaN", "NaN"},
           {R"({"__float__": "Infinity"})", "Infinity"}}) {
    std::string cfg_text = mamba_cfg().dump();
    cfg_text.insert(cfg_text.rfind('}'), ", \"rms_norm_eps\": " + text);
    json cfg = parse_hf_json(cfg_text, "cfg");
    cfg.erase("layer_norm_epsilon");
    const std::string msg = from_json_error(cfg);
    EXPECT_THAT(msg, HasSubstr("\"rms_norm_eps\" must be a finite number in (0, 1) (got " + shown + ")")) << text;
  }
}

TEST(ModelConfigLoad, NonRegularConfigFiles) {
  TempDir dir("cfg");
  std::filesystem::create_directory(dir / "config.json");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("is a directory, not a regular file"));
  std::filesystem::remove(dir / "config.json");
  std::filesystem::create_symlink("/dev/zero", dir / "config.json");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("character device"));
  std::filesystem::remove(dir / "config.json");
  std::filesystem::create_symlink(dir / "config.json", dir / "config.json.tmp");
  std::filesystem::rename(dir / "config.json.tmp", dir / "config.json");  // a link to itself
  EXPECT_THAT(load_error(dir.path()), HasSubstr("symlink loop"));
  std::filesystem::remove(dir / "config.json");

  write_file(dir / "config.json", mamba_cfg().dump());
  std::filesystem::create_directory(dir / "generation_config.json");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("generation_config.json: is a directory"));
  std::filesystem::remove(dir / "generation_config.json");
  std::filesystem::create_symlink(dir / "gone.json", dir / "generation_config.json");
  EXPECT_THAT(load_error(dir.path()), HasSubstr("generation_config.json: dangling symlink"));
}

TEST(ModelConfigLoad, DeeplyNestedConfigIsRejectedBeforeParsing) {
  TempDir dir("cfg");
  write_file(dir / "config.json", std::string(100000, '[') + std::string(100000, ']'));
  std::string msg = load_error(dir.path());
  EXPECT_THAT(msg, HasSubstr("config.json"));
  EXPECT_THAT(msg, HasSubstr("more than 256 levels deep"));
  write_file(dir / "config.json", std::string(100000, '{'));
  EXPECT_THAT(load_error(dir.path()), HasSubstr("levels deep"));
}

}  // namespace
}  // namespace ssmserve
