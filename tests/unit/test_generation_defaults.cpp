// Owns the unit tests of GenerationDefaults (engine/generation_defaults.h): reading a checkpoint's
// generation_config.json sampling defaults as vLLM's get_diff_sampling_param does (--generation-config auto / vllm /
// a folder, --override-generation-config merged over it), every malformed field's message, the server-wide
// max_tokens cap, apply() and the startup notice.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "engine/generation_defaults.h"

namespace ssmserve {
namespace {

using ::ssmserve::testing::TempDir;
using ::ssmserve::testing::write_file;
using ::testing::HasSubstr;
using json = nlohmann::json;

const std::filesystem::path kSource = SSMSERVE_SOURCE_DIR;

/// Qwen3.5's sampling keys (its generation_config.json) next to the keys every HF file has.
constexpr const char* kQwenStyle = R"({"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": true,
  "temperature": 0.6, "top_p": 0.95, "top_k": 20, "transformers_version": "4.57.0"})";

/// Message of the Error GenerationDefaults::load throws (empty + a test failure when none).
std::string load_error(const std::filesystem::path& dir, std::string_view source, std::string_view override_json = "") {
  try {
    GenerationDefaults::load(dir, source, override_json);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an Error for " << source << " / " << override_json;
  return {};
}

TEST(GenerationDefaults, ModelFolderFile) {
  TempDir dir("gen");
  write_file(dir / "generation_config.json", kQwenStyle);
  const GenerationDefaults d = GenerationDefaults::load(dir.path(), "auto", "");
  EXPECT_FALSE(d.empty());
  EXPECT_EQ(d.temperature, 0.6);
  EXPECT_EQ(d.top_p, 0.95);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_FALSE(d.min_p || d.repetition_penalty || d.max_tokens || d.max_tokens_limit);
  EXPECT_EQ(d.source, "model");
  EXPECT_EQ(d.describe(), "{'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}");
  const std::string notice = d.notice("`--generation-config vllm`");
  EXPECT_THAT(notice, HasSubstr("Default sampling parameters have been overridden by the model's Hugging Face "
                                "generation config recommended from the model creator. If this is not intended, please "
                                "relaunch with `--generation-config vllm`."));
  EXPECT_THAT(notice, HasSubstr("from model: {'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}"));
}

// Every key, in vLLM's order; max_new_tokens becomes max_tokens; integral floats print as Python does.
TEST(GenerationDefaults, EveryKeyAndMaxNewTokens) {
  TempDir dir("gen");
  write_file(dir / "generation_config.json", R"({"repetition_penalty": 1.05, "temperature": 1, "top_k": -1,
    "top_p": 1.0, "min_p": 0, "max_new_tokens": 512, "max_length": 20})");
  const GenerationDefaults d = GenerationDefaults::load(dir.path(), "auto", "");
  EXPECT_EQ(d.describe(),
            "{'repetition_penalty': 1.05, 'temperature': 1.0, 'top_k': -1, 'top_p': 1.0, 'min_p': 0.0, 'max_tokens': 512}");
  EXPECT_EQ(d.max_tokens, 512);
  EXPECT_FALSE(d.max_tokens_limit) << "the model folder's max_new_tokens is a default, not a cap";
  SamplingParams sp;
  sp.presence_penalty = 0.5;
  d.apply(sp);
  EXPECT_EQ(sp.repetition_penalty, 1.05);
  EXPECT_EQ(sp.temperature, 1.0);
  EXPECT_EQ(sp.top_k, -1);
  EXPECT_EQ(sp.top_p, 1.0);
  EXPECT_EQ(sp.min_p, 0.0);
  EXPECT_EQ(sp.max_tokens, 512);
  EXPECT_EQ(sp.presence_penalty, 0.5) << "fields without a default are left as they are";
  EXPECT_NO_THROW(sp.validate(100));
}

// The bundled checkpoints' files have no sampling keys: nothing changes. A folder without the file, "vllm", and null
// values give no defaults either; apply() then leaves SamplingParams as it is.
TEST(GenerationDefaults, NoneWithoutSamplingKeys) {
  EXPECT_TRUE(GenerationDefaults::load(kSource / "models/tiny-mamba", "auto", "").empty());
  TempDir dir("gen");
  EXPECT_TRUE(GenerationDefaults::load(dir.path(), "auto", "").empty());
  write_file(dir / "generation_config.json", R"({"temperature": null, "top_p": null, "top_k": null, "min_p": null,
    "repetition_penalty": null, "max_new_tokens": null, "eos_token_id": 0})");
  GenerationDefaults d = GenerationDefaults::load(dir.path(), "auto", "");
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.describe(), "{}");
  write_file(dir / "generation_config.json", kQwenStyle);
  d = GenerationDefaults::load(dir.path(), "vllm", "");
  EXPECT_TRUE(d.empty()) << "vllm: the file is not read";
  EXPECT_EQ(d.source, "vllm");
  SamplingParams sp;
  d.apply(sp);
  const SamplingParams plain;
  EXPECT_EQ(sp.temperature, plain.temperature);
  EXPECT_EQ(sp.top_p, plain.top_p);
  EXPECT_EQ(sp.top_k, plain.top_k);
  EXPECT_EQ(sp.max_tokens, plain.max_tokens);
}

TEST(GenerationDefaults, EachMalformedFieldIsNamed) {
  TempDir dir("gen");
  const std::string file = (dir / "generation_config.json").string();
  const std::pair<const char*, const char*> bad[] = {
      {R"("temperature": -0.1)", "\"temperature\" must be a number >= 0 (got -0.1)"},
      {R"("temperature": "0.7")", "\"temperature\" must be a number >= 0 (got \"0.7\")"},
      {R"("temperature": true)", "\"temperature\" must be a number >= 0 (got true)"},
      {R"("temperature": NaN)", "\"temperature\" must be a number >= 0 (got NaN)"},
      {R"("top_p": 0)", "\"top_p\" must be a number in (0, 1] (got 0)"},
      {R"("top_p": 1.5)", "\"top_p\" must be a number in (0, 1]"},
      {R"("top_p": [0.9])", "\"top_p\" must be a number in (0, 1]"},
      {R"("top_k": -2)", "\"top_k\" must be an integer >= 1, or -1 or 0 (no top-k) (got -2)"},
      {R"("top_k": 20.5)", "\"top_k\" must be an integer"},
      {R"("top_k": 4294967296)", "\"top_k\" must be an integer"},
      {R"("min_p": -0.5)", "\"min_p\" must be a number in [0, 1]"},
      {R"("min_p": 2)", "\"min_p\" must be a number in [0, 1]"},
      {R"("repetition_penalty": 0)", "\"repetition_penalty\" must be a number > 0 (got 0)"},
      {R"("repetition_penalty": 1e-40)", "\"repetition_penalty\" must be a number > 0 that is a normal float32"},
      {R"("repetition_penalty": Infinity)", "\"repetition_penalty\" must be a number > 0"},
      {R"("max_new_tokens": 0)", "\"max_new_tokens\" must be a positive integer (got 0)"},
      {R"("max_new_tokens": "512")", "\"max_new_tokens\" must be a positive integer"},
      {R"("max_new_tokens": 1e3)", "\"max_new_tokens\" must be a positive integer"},
  };
  for (const auto& [field, want] : bad) {
    write_file(dir / "generation_config.json", std::string("{\"eos_token_id\": 0, ") + field + "}");
    const std::string msg = load_error(dir.path(), "auto");
    EXPECT_THAT(msg, HasSubstr(file + ": field " + want)) << field;
    EXPECT_THAT(msg, HasSubstr("--generation-config=\"vllm\"")) << "the way to ignore the file: " << field;
  }
  write_file(dir / "generation_config.json", "[1, 2]");
  EXPECT_THAT(load_error(dir.path(), "auto"), HasSubstr(file + ": must be a JSON object (got [1,2])"));
  write_file(dir / "generation_config.json", R"({"temperature": 0.7,})");
  EXPECT_THAT(load_error(dir.path(), "auto"), HasSubstr(file + ": invalid JSON"));
  // transformers 5.x's float objects are numbers.
  write_file(dir / "generation_config.json", R"({"temperature": {"__float__": "0.25"}})");
  EXPECT_EQ(GenerationDefaults::load(dir.path(), "auto", "").temperature, 0.25);
}

// --override-generation-config: merged over the file key by key; null unsets a key; with "vllm" only the overrides;
// its max_new_tokens caps every request. Its errors name the flag.
TEST(GenerationDefaults, OverridesMergeOverTheFile) {
  TempDir dir("gen");
  write_file(dir / "generation_config.json", kQwenStyle);
  GenerationDefaults d = GenerationDefaults::load(dir.path(), "auto", R"({"temperature": 0.2, "top_k": null,
    "min_p": 0.05, "do_sample": false})");
  EXPECT_EQ(d.temperature, 0.2);
  EXPECT_EQ(d.top_p, 0.95) << "kept from the file";
  EXPECT_FALSE(d.top_k) << "null in the override unsets it";
  EXPECT_EQ(d.min_p, 0.05);
  EXPECT_FALSE(d.max_tokens_limit);
  EXPECT_EQ(d.describe(), "{'temperature': 0.2, 'top_p': 0.95, 'min_p': 0.05}");

  d = GenerationDefaults::load(dir.path(), "vllm", R"({"temperature": 0.5, "max_new_tokens": 64})");
  EXPECT_EQ(d.describe(), "{'temperature': 0.5, 'max_tokens': 64}");
  EXPECT_EQ(d.max_tokens_limit, 64) << "vLLM's override_max_tokens";
  EXPECT_EQ(d.source, "vllm");
  d = GenerationDefaults::load(dir.path(), "auto", R"({"max_new_tokens": 32})");
  EXPECT_EQ(d.max_tokens, 32);
  EXPECT_EQ(d.max_tokens_limit, 32);
  EXPECT_EQ(d.temperature, 0.6);
  EXPECT_TRUE(GenerationDefaults::load(dir.path(), "vllm", "{}").empty());
  EXPECT_TRUE(GenerationDefaults::load(dir.path(), "vllm", "  ").empty());

  EXPECT_EQ(load_error(dir.path(), "auto", R"({"top_p": 2})"),
            "--override-generation-config: field \"top_p\" must be a number in (0, 1] (got 2)");
  EXPECT_EQ(load_error(dir.path(), "vllm", "[1]"),
            "--override-generation-config must be a JSON object such as {\"temperature\": 0.5} (got [1])");
  EXPECT_THAT(load_error(dir.path(), "vllm", "{\"temperature\": "), HasSubstr("--override-generation-config: invalid JSON"));
  // A bad value in the file that the override replaces is never read.
  write_file(dir / "generation_config.json", R"({"temperature": "hot"})");
  EXPECT_EQ(GenerationDefaults::load(dir.path(), "auto", R"({"temperature": 0.1})").temperature, 0.1);
}

// --generation-config FOLDER: its generation_config.json (required), not the model's; its max_new_tokens caps every
// request (vLLM: "sets a server-wide limit").
TEST(GenerationDefaults, FolderPath) {
  TempDir model("gen-model");
  TempDir other("gen-other");
  write_file(model / "generation_config.json", kQwenStyle);
  write_file(other / "generation_config.json", R"({"temperature": 0.3, "max_new_tokens": 100})");
  GenerationDefaults d = GenerationDefaults::load(model.path(), other.path().string(), "");
  EXPECT_EQ(d.describe(), "{'temperature': 0.3, 'max_tokens': 100}");
  EXPECT_EQ(d.max_tokens_limit, 100);
  EXPECT_EQ(d.source, other.path().string());
  EXPECT_THAT(d.notice("X"), HasSubstr("from " + other.path().string() + ": {"));
  d = GenerationDefaults::load(model.path(), other.path().string(), R"({"max_new_tokens": 50})");
  EXPECT_EQ(d.max_tokens_limit, 50);
  d = GenerationDefaults::load(model.path(), model.path().string(), "");
  EXPECT_FALSE(d.max_tokens_limit) << "no max_new_tokens: no cap";
  EXPECT_EQ(d.top_k, 20);

  TempDir empty("gen-empty");
  EXPECT_EQ(load_error(model.path(), empty.path().string()),
            "--generation-config " + empty.path().string() + ": " + (empty / "generation_config.json").string() +
                " not found (the folder must hold a generation_config.json)");
  EXPECT_THAT(load_error(model.path(), (empty / "absent").string()), HasSubstr("no such folder"));
  EXPECT_THAT(load_error(model.path(), (other / "generation_config.json").string()),
              HasSubstr("is a file; give the folder that holds generation_config.json"));
  EXPECT_THAT(load_error(model.path(), ""), HasSubstr("--generation-config must be auto, vllm or a folder"));
  write_file(other / "generation_config.json", R"({"top_k": "many"})");
  EXPECT_THAT(load_error(model.path(), other.path().string()),
              HasSubstr((other / "generation_config.json").string() + ": field \"top_k\" must be an integer"));
}

}  // namespace
}  // namespace ssmserve
