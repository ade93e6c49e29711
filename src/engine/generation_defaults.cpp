// Owns reading and checking the generation-config sampling defaults (see generation_defaults.h).
#include "engine/generation_defaults.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <climits>
#include <cmath>
#include <string>

#include "config/hf_json.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::json;

/// The generation-config keys that become sampling defaults, in vLLM's order (get_diff_sampling_param's
/// available_params).
constexpr const char* kSamplingKeys[] = {"repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens"};

constexpr const char* kOverrideFlag = "--override-generation-config";

/// One value to check: the JSON it holds and where it came from (a file path or kOverrideFlag), for messages.
struct Source {
  const json& v;
  std::string what;
  std::string hint;  ///< appended to a file's errors: how to ignore the file

  [[noreturn]] void bad(const char* key, const char* want) const {
    fail("{}: field \"{}\" must be {} (got {}){}", what, key, want, json_excerpt(v), hint);
  }
  /// A finite number (a JSON number, or transformers 5.x's {"__float__": ...}; not a bool or a string).
  double number(const char* key, const char* want) const {
    double x = 0;
    try {
      x = json_float(v, key);
    } catch (const Error&) {
      bad(key, want);
    }
    if (!std::isfinite(x)) bad(key, want);
    return x;
  }
  /// A JSON integer in [lo, INT_MAX] (not a float such as 20.0, a bool or a string).
  int integer(const char* key, long long lo, const char* want) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<unsigned long long>() > INT_MAX)) bad(key, want);
    const long long x = v.get<long long>();
    if (x < lo || x > INT_MAX) bad(key, want);
    return static_cast<int>(x);
  }
};

/// Sets the field of `d` that `key` names from `s`, checked as vLLM's SamplingParams checks it.
void set_field(GenerationDefaults& d, const std::string& key, const Source& s) {
  if (key == "repetition_penalty") {
    d.repetition_penalty = s.number("repetition_penalty", "a number > 0");
    if (*d.repetition_penalty <= 0) s.bad("repetition_penalty", "a number > 0");
    if (!repetition_penalty_fits_float32(*d.repetition_penalty))  // as SamplingParams::validate
      s.bad("repetition_penalty", "a number > 0 that is a normal float32 (1.2e-38 to 3.4e38)");
  } else if (key == "temperature") {
    d.temperature = s.number("temperature", "a number >= 0");
    if (*d.temperature < 0) s.bad("temperature", "a number >= 0");
  } else if (key == "top_k") {
    d.top_k = s.integer("top_k", -1, "an integer >= 1, or -1 or 0 (no top-k)");
  } else if (key == "top_p") {
    d.top_p = s.number("top_p", "a number in (0, 1]");
    if (!(*d.top_p > 0 && *d.top_p <= 1)) s.bad("top_p", "a number in (0, 1]");
  } else if (key == "min_p") {
    d.min_p = s.number("min_p", "a number in [0, 1]");
    if (*d.min_p < 0 || *d.min_p > 1) s.bad("min_p", "a number in [0, 1]");
  } else if (key == "max_new_tokens") {
    d.max_tokens = s.integer("max_new_tokens", 1, "a positive integer");
  }
}

/// A generation_config.json as a JSON object; Error naming `path` otherwise (read_text_file / parse_hf_json name
/// a missing, unreadable or oversized file and invalid JSON).
json read_object(const std::filesystem::path& path) {
  json j = parse_hf_json(read_text_file(path, kMaxConfigFileBytes), path.string());
  SSM_CHECK(j.is_object(), "{}: must be a JSON object (got {})", path.string(), json_excerpt(j));
  return j;
}

/// --override-generation-config as a JSON object ("" = none).
json read_override(std::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  json j = parse_hf_json(text, kOverrideFlag);
  SSM_CHECK(j.is_object(), "{} must be a JSON object such as {{\"temperature\": 0.5}} (got {})", kOverrideFlag,
            json_excerpt(j));
  return j;
}

/// `x` as Python's repr writes a float (vLLM's log): "0.7", "1.0", "1e-05".
std::string py_float(double x) {
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // integral: 1 -> 1.0 (not inf / nan / 1e+20)
  return s;
}

}  // namespace

bool GenerationDefaults::empty() const {
  return !repetition_penalty && !temperature && !top_k && !top_p && !min_p && !max_tokens;
}

void GenerationDefaults::apply(SamplingParams& sp) const {
  if (repetition_penalty) sp.repetition_penalty = *repetition_penalty;
  if (temperature) sp.temperature = *temperature;
  if (top_k) sp.top_k = *top_k;
  if (top_p) sp.top_p = *top_p;
  if (min_p) sp.min_p = *min_p;
  if (max_tokens) sp.max_tokens = *max_tokens;
}

std::string GenerationDefaults::describe() const {
  std::string out;
  auto add = [&out](const char* key, const std::string& value) {
    out += fmt::format("{}'{}': {}", out.empty() ? "" : ", ", key, value);
  };
  if (repetition_penalty) add("repetition_penalty", py_float(*repetition_penalty));
  if (temperature) add("temperature", py_float(*temperature));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (top_p) add("top_p", py_float(*top_p));
  if (min_p) add("min_p", py_float(*min_p));
  if (max_tokens) add("max_tokens", std::to_string(*max_tokens));
  return "{" + out + "}";
}

std::string GenerationDefaults::notice(std::string_view relaunch) const {
  return fmt::format("Default sampling parameters have been overridden by the model's Hugging Face generation config "
                     "recommended from the model creator. If this is not intended, please relaunch with {}. Using "
                     "default sampling params from {}: {}", relaunch, source, describe());
}

GenerationDefaults GenerationDefaults::load(const std::filesystem::path& model_dir, std::string_view generation_config,
                                            std::string_view override_json) {
  // 1. The generation config: the model folder's (auto, when present), a given folder's (required), or none (vllm).
  GenerationDefaults d;
  json base = json::object();
  std::string base_path;
  const bool from_folder = generation_config != "auto" && generation_config != "vllm";
  if (generation_config == "auto") {
    const auto path = model_dir / "generation_config.json";
    if (path_entry_exists(path)) {
      base = read_object(path);
      base_path = path.string();
    }
  } else if (generation_config == "vllm") {
    d.source = "vllm";
  } else {
    SSM_CHECK(!generation_config.empty(), "--generation-config must be auto, vllm or a folder holding "
              "generation_config.json (got \"\")");
    const std::filesystem::path dir(generation_config);
    std::error_code ec;
    SSM_CHECK(!std::filesystem::is_regular_file(dir, ec), "--generation-config {}: is a file; give the folder that "
              "holds generation_config.json (or auto, or vllm)", text_excerpt(generation_config, 200));
    SSM_CHECK(std::filesystem::is_directory(dir, ec), "--generation-config {}: no such folder (give auto, vllm, or a "
              "folder holding generation_config.json)", text_excerpt(generation_config, 200));
    const auto path = dir / "generation_config.json";
    SSM_CHECK(path_entry_exists(path), "--generation-config {}: {} not found (the folder must hold a "
              "generation_config.json)", text_excerpt(generation_config, 200), path.string());
    base = read_object(path);
    base_path = path.string();
    d.source = std::string(generation_config);
  }
  // 2. The overrides, merged over it: each key from the override when it has it (null there unsets it).
  const json over = read_override(override_json);
  for (auto it = over.begin(); it != over.end(); ++it) {
    bool known = false;
    for (const char* k : kSamplingKeys) known = known || it.key() == k;
    if (!known)
      spdlog::warn("{}: \"{}\" is not a sampling default (repetition_penalty, temperature, top_k, top_p, min_p, "
                   "max_new_tokens); ignored{}", kOverrideFlag, text_excerpt(it.key()),
                   it.key() == "max_tokens" ? " (Hugging Face's name for max_tokens is max_new_tokens)" : "");
  }
  const std::string hint = " (fix the file, or ignore it with --generation-config=\"vllm\")";
  for (const char* key : kSamplingKeys) {
    if (const auto it = over.find(key); it != over.end()) {
      if (!it->is_null()) set_field(d, key, Source{*it, kOverrideFlag, ""});
    } else if (const auto b = base.find(key); b != base.end() && !b->is_null()) {
      set_field(d, key, Source{*b, base_path, hint});
    }
  }
  // 3. vLLM's server-wide max_tokens cap: the override's max_new_tokens, or a given folder's resulting one.
  const auto over_max = over.find("max_new_tokens");
  if (from_folder || (over_max != over.end() && !over_max->is_null())) d.max_tokens_limit = d.max_tokens;
  return d;
}

}  // namespace ssmserve
