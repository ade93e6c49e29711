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

/// TOKENIZER_MAPPING_NAMES (models/auto/tokenization_auto.py, transformers 5.24): the Qwen entries and those of the
/// other families ssmserve runs (bamba, falcon_h1, minimax, nemotron_h have none).
constexpr std::array<std::pair<std::string_view, std::string_view>, 27> kRegistered = {{
    {"qwen2", "Qwen2Tokenizer"},        {"qwen2_5_omni", "Qwen2Tokenizer"},   {"qwen2_5_vl", "Qwen2Tokenizer"},
    {"qwen2_audio", "Qwen2Tokenizer"},  {"qwen2_moe", "Qwen2Tokenizer"},      {"qwen2_vl", "Qwen2Tokenizer"},
    {"qwen3", "Qwen2Tokenizer"},        {"qwen3_5", "Qwen3_5Tokenizer"},      {"qwen3_5_moe", "Qwen3_5Tokenizer"},
    {"qwen3_5_moe_text", "Qwen3_5Tokenizer"}, {"qwen3_5_text", "Qwen3_5Tokenizer"}, {"qwen3_asr", "Qwen2Tokenizer"},
    {"qwen3_moe", "Qwen2Tokenizer"},    {"qwen3_next", "Qwen2Tokenizer"},     {"qwen3_omni_moe", "Qwen2Tokenizer"},
    {"qwen3_vl", "Qwen2Tokenizer"},     {"qwen3_vl_moe", "Qwen2Tokenizer"},   {"qwen4_exp", "Qwen3_5Tokenizer"},
    {"mamba", "GPTNeoXTokenizer"},      {"mamba2", "GPTNeoXTokenizer"},       {"gpt_neox", "GPTNeoXTokenizer"},
    {"granite", "TokenizersBackend"},   {"granitemoehybrid", "TokenizersBackend"}, {"jamba", "TokenizersBackend"},
    {"mistral", "TokenizersBackend"},   {"minimax_m2", "TokenizersBackend"},  {"nemotron", "TokenizersBackend"},
}};

/// MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS (same file), the entries of the tabled model types: for these the
/// registered class wins over the hub's tokenizer_class. qwen3_5_text and qwen3_next are not in it.
constexpr std::array<std::string_view, 8> kIncorrectHubClass = {"qwen2", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text",
                                                                 "qwen4_exp", "jamba", "minimax_m2", "nemotron"};

/// Classes that keep tokenizer.json's pipeline (transformers' TokenizersBackend).
bool is_backend(std::string_view cls) {
  return cls.empty() || cls == "TokenizersBackend" || cls == "PythonBackend" || cls == "PreTrainedTokenizerFast" ||
         cls == "PreTrainedTokenizer";
}

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

std::string resolve(std::string_view model_type, std::string_view hub_class, bool tokenizer_json_is_byte_level) {
  const std::string_view reg = registered(model_type);
  const bool incorrect_hub =
      std::find(kIncorrectHubClass.begin(), kIncorrectHubClass.end(), model_type) != kIncorrectHubClass.end();
  if (hub_class.empty()) return is_backend(reg) ? "" : std::string(reg);
  const std::string hub = without_fast(hub_class);
  // Hub LlamaTokenizer over a byte-level tokenizer.json (Llama-3 style): TokenizersBackend.
  if (hub == "LlamaTokenizer" && !incorrect_hub && tokenizer_json_is_byte_level) return "";
  if (!reg.empty() && reg != hub) {
    // The registered class differs: a known-incorrect hub class yields the registered one; a registered backend
    // class, or a hub class that is one, keeps tokenizer.json (TokenizersBackend).
    if (is_backend(reg)) return "";
    const std::string cls = incorrect_hub ? std::string(reg) : hub;
    return is_backend(cls) ? "" : cls;
  }
  return is_backend(hub) ? "" : hub;
}

std::string of_folder(const std::filesystem::path& folder, bool tokenizer_json_is_byte_level) {
  const json config = read_optional_json(folder / "config.json");
  const json tok_config = read_optional_json(folder / "tokenizer_config.json");
  std::string hub = string_field(tok_config, "tokenizer_class");
  if (hub.empty()) hub = string_field(config, "tokenizer_class");
  std::string cls = resolve(string_field(config, "model_type"), hub, tokenizer_json_is_byte_level);
  if (rebuilt_pattern(cls))
    SSM_CHECK(!tok_config.contains("add_prefix_space") || !tok_config.at("add_prefix_space").is_boolean() ||
                  !tok_config.at("add_prefix_space").get<bool>(),
              "{}: unsupported add_prefix_space=true for {}", (folder / "tokenizer_config.json").string(), cls);
  return cls;
}

bool rebuilds_pipeline(std::string_view class_name) {
  return rebuilt_pattern(class_name).has_value() || class_name == "GPT2Tokenizer" ||
         class_name == "GPTNeoXTokenizer" || class_name == "LlamaTokenizer";
}

json tokenizer_config_of(const std::filesystem::path& folder) {
  return read_optional_json(folder / "tokenizer_config.json");
}

namespace {

/// The BPE model options the rebuilding classes set (vocabulary, merges, unk_token and the rest kept).
void reset_bpe(json& tokenizer_json, bool llama) {
  if (!tokenizer_json.contains("model") || !tokenizer_json["model"].is_object()) return;
  json& model = tokenizer_json["model"];
  model["dropout"] = nullptr;
  model["continuing_subword_prefix"] = llama ? json(nullptr) : json("");
  model["end_of_word_suffix"] = llama ? json(nullptr) : json("");
  model["fuse_unk"] = llama;
  model["byte_fallback"] = llama;
  model["ignore_merges"] = false;
}

bool bool_option(const json& cfg, const char* key, bool def) {
  return cfg.contains(key) && cfg.at(key).is_boolean() ? cfg.at(key).get<bool>() : def;
}

}  // namespace

void rebuild_for_class(json& tokenizer_json, std::string_view class_name, const json& tokenizer_config) {
  if (const auto pattern = rebuilt_pattern(class_name)) {
    rebuild_pipeline(tokenizer_json, *pattern);
    return;
  }
  const bool add_prefix_space_gpt = bool_option(tokenizer_config, "add_prefix_space", false);
  if (class_name == "GPT2Tokenizer" || class_name == "GPTNeoXTokenizer") {
    // models/gpt2/tokenization_gpt2.py, models/gpt_neox/tokenization_gpt_neox.py: ByteLevel with the GPT-2 regex.
    tokenizer_json["normalizer"] = class_name == "GPTNeoXTokenizer" ? json{{"type", "NFC"}} : json(nullptr);
    tokenizer_json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space_gpt},
                                       {"trim_offsets", true}, {"use_regex", true}};
    tokenizer_json["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                                 {"use_regex", true}};
    reset_bpe(tokenizer_json, false);
  } else if (class_name == "LlamaTokenizer") {
    // models/llama/tokenization_llama.py: Metaspace (prepend_scheme from add_prefix_space and legacy), byte fallback.
    const bool add_prefix_space = bool_option(tokenizer_config, "add_prefix_space", true);
    const bool legacy = bool_option(tokenizer_config, "legacy", false);
    const char* scheme = add_prefix_space ? (legacy ? "always" : "first") : "never";
    tokenizer_json["normalizer"] = nullptr;
    tokenizer_json["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", scheme},
                                       {"split", false}};
    json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                 {{"type", "ByteFallback"}},
                                 {{"type", "Fuse"}}});
    if (add_prefix_space) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tokenizer_json["decoder"] = {{"type", "Sequence"}, {"decoders", std::move(decoders)}};
    reset_bpe(tokenizer_json, true);
  }
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

void add_special_tokens(json& tokenizer_json, std::string_view class_name, const json& tokenizer_config) {
  static constexpr std::array<const char*, 7> kAttributes = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                             "pad_token", "cls_token", "mask_token"};
  auto class_default = [&](std::string_view attr) -> std::string {
    if (class_name == "GPT2Tokenizer" || class_name == "GPTNeoXTokenizer") {
      if (attr == "bos_token" || attr == "eos_token" || attr == "unk_token") return "<|endoftext|>";
      if (attr == "pad_token" && class_name == "GPTNeoXTokenizer") return "<|padding|>";
    } else if (class_name == "LlamaTokenizer") {
      if (attr == "bos_token") return "<s>";
      if (attr == "eos_token") return "</s>";
      if (attr == "unk_token") return "<unk>";
    }
    return {};
  };
  if (!tokenizer_json.contains("added_tokens") || !tokenizer_json["added_tokens"].is_array()) {
    if (tokenizer_json.contains("added_tokens") && !tokenizer_json["added_tokens"].is_null()) return;  // reported later
    tokenizer_json["added_tokens"] = json::array();
  }
  json& added = tokenizer_json["added_tokens"];
  const json* vocab = tokenizer_json.contains("model") && tokenizer_json["model"].is_object() &&
                              tokenizer_json["model"].contains("vocab") && tokenizer_json["model"]["vocab"].is_object()
                          ? &tokenizer_json["model"]["vocab"]
                          : nullptr;
  const std::int64_t vocab_size = vocab != nullptr ? static_cast<std::int64_t>(vocab->size()) : 0;
  std::int64_t max_added = -1;
  for (const json& a : added)
    if (a.is_object() && a.contains("id") && a["id"].is_number_integer()) max_added = std::max(max_added, a["id"].get<std::int64_t>());
  std::int64_t next_id = max_added >= 0 && (max_added >= vocab_size || vocab_size == 0) ? max_added + 1 : vocab_size;
  for (const char* attr : kAttributes) {
    std::string content;
    if (tokenizer_config.contains(attr)) {
      const json& v = tokenizer_config.at(attr);
      if (v.is_string()) {
        content = v.get<std::string>();
      } else if (v.is_object() && v.contains("content") && v.at("content").is_string()) {
        content = v.at("content").get<std::string>();
      }
    } else {
      content = class_default(attr);
    }
    if (content.empty()) continue;
    bool present = false;
    for (const json& a : added) present = present || (a.is_object() && a.value("content", json()) == content);
    if (present) continue;
    std::int64_t id = -1;
    if (vocab != nullptr && vocab->contains(content) && (*vocab)[content].is_number_integer()) {
      id = (*vocab)[content].get<std::int64_t>();
    } else {
      id = next_id++;
    }
    added.push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
}

}  // namespace ssmserve::transformers_class
