// Owns the model_type -> tokenizer class tables copied from transformers 5.24 and the Qwen pipeline rebuild (see
// transformers_class.h).
#include "tokenizer/transformers_class.h"

#include <algorithm>
#include <array>
#include <utility>

#include "config/hf_json.h"
#include "core/error.h"

namespace ssmserve::transformers_class {
namespace {

using nlohmann::json;

/// TOKENIZER_MAPPING_NAMES (models/auto/tokenization_auto.py, transformers 5.24), the Qwen entries.
constexpr std::array<std::pair<std::string_view, std::string_view>, 18> kRegistered = {{
    {"qwen2", "Qwen2Tokenizer"},        {"qwen2_5_omni", "Qwen2Tokenizer"},   {"qwen2_5_vl", "Qwen2Tokenizer"},
    {"qwen2_audio", "Qwen2Tokenizer"},  {"qwen2_moe", "Qwen2Tokenizer"},      {"qwen2_vl", "Qwen2Tokenizer"},
    {"qwen3", "Qwen2Tokenizer"},        {"qwen3_5", "Qwen3_5Tokenizer"},      {"qwen3_5_moe", "Qwen3_5Tokenizer"},
    {"qwen3_5_moe_text", "Qwen3_5Tokenizer"}, {"qwen3_5_text", "Qwen3_5Tokenizer"}, {"qwen3_asr", "Qwen2Tokenizer"},
    {"qwen3_moe", "Qwen2Tokenizer"},    {"qwen3_next", "Qwen2Tokenizer"},     {"qwen3_omni_moe", "Qwen2Tokenizer"},
    {"qwen3_vl", "Qwen2Tokenizer"},     {"qwen3_vl_moe", "Qwen2Tokenizer"},   {"qwen4_exp", "Qwen3_5Tokenizer"},
}};

/// MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS (same file), the Qwen entries: for these the registered class wins over
/// the hub's tokenizer_class. qwen3_5_text and qwen3_next are not in it.
constexpr std::array<std::string_view, 5> kIncorrectHubClass = {"qwen2", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text",
                                                                 "qwen4_exp"};

/// PRETOKENIZE_REGEX of the classes whose __init__ rebuilds the pipeline.
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen3_5Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string_view registered(std::string_view model_type) {
  for (const auto& [type, cls] : kRegistered)
    if (type == model_type) return cls;
  return {};
}

std::string without_fast(std::string_view cls) {
  constexpr std::string_view kFast = "Fast";
  if (cls.size() > kFast.size() && cls.substr(cls.size() - kFast.size()) == kFast) cls.remove_suffix(kFast.size());
  return std::string(cls);
}

/// The parsed JSON object at `path`, or an empty object when nothing is there.
json read_optional_json(const std::filesystem::path& path) {
  if (!path_entry_exists(path)) return json::object();
  const json j = parse_hf_json(read_text_file(path), path.string());
  SSM_CHECK(j.is_object(), "{}: top level is not an object", path.string());
  return j;
}

std::string string_field(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : std::string();
}

}  // namespace

std::string resolve(std::string_view model_type, std::string_view hub_class) {
  const std::string_view reg = registered(model_type);
  if (hub_class.empty()) return std::string(reg);
  const std::string hub = without_fast(hub_class);
  const bool incorrect_hub =
      std::find(kIncorrectHubClass.begin(), kIncorrectHubClass.end(), model_type) != kIncorrectHubClass.end();
  if (!reg.empty() && reg != hub && incorrect_hub) return std::string(reg);
  return hub;
}

std::string of_folder(const std::filesystem::path& folder) {
  const json config = read_optional_json(folder / "config.json");
  const json tok_config = read_optional_json(folder / "tokenizer_config.json");
  std::string hub = string_field(tok_config, "tokenizer_class");
  if (hub.empty()) hub = string_field(config, "tokenizer_class");
  std::string cls = resolve(string_field(config, "model_type"), hub);
  if (rebuilt_pattern(cls))
    SSM_CHECK(!tok_config.contains("add_prefix_space") || !tok_config.at("add_prefix_space").is_boolean() ||
                  !tok_config.at("add_prefix_space").get<bool>(),
              "{}: unsupported add_prefix_space=true for {}", (folder / "tokenizer_config.json").string(), cls);
  return cls;
}

std::optional<std::string_view> rebuilt_pattern(std::string_view class_name) {
  if (class_name == "Qwen2Tokenizer") return kQwen2Pattern;
  if (class_name == "Qwen3_5Tokenizer") return kQwen3_5Pattern;
  return std::nullopt;
}

void rebuild_pipeline(json& tokenizer_json, std::string_view pattern) {
  tokenizer_json["normalizer"] = {{"type", "NFC"}};
  tokenizer_json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", std::string(pattern)}}}, {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  tokenizer_json["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  if (tokenizer_json.contains("model") && tokenizer_json["model"].is_object()) {
    json& model = tokenizer_json["model"];
    model["dropout"] = nullptr;
    model["unk_token"] = nullptr;
    model["continuing_subword_prefix"] = "";
    model["end_of_word_suffix"] = "";
    model["fuse_unk"] = false;
    model["byte_fallback"] = false;
    model["ignore_merges"] = false;
  }
}

}  // namespace ssmserve::transformers_class
