// Owns the default sampling parameters a checkpoint's creator recommends in generation_config.json, as vLLM applies
// them (ModelConfig.get_diff_sampling_param with --generation-config and --override-generation-config): where they
// are read from, their checks, and how a request's unset fields take them. (ModelConfig::load reads the same file's
// eos_token_id; the two share nothing else.)
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "engine/sampling_params.h"

namespace ssmserve {

/// The served model's default sampling parameters (vLLM's "diff sampling params"): each field that is set is the
/// value a request gets when it leaves that field unset (the server: the field absent or null in the body, for
/// /v1/completions and /v1/chat/completions; the Python API: LLM.generate / chat / stream without sampling_params,
/// LLM.get_default_sampling_params). Unset fields keep SamplingParams' own (vLLM's neutral) defaults. Empty when the
/// checkpoint recommends nothing, so a checkpoint without these keys behaves exactly as before.
///
/// Source (vLLM's get_diff_sampling_param): the keys repetition_penalty, temperature, top_k, top_p, min_p and
/// max_new_tokens (HF's name; it becomes max_tokens) that are present and not null in the generation config, after
/// --override-generation-config is merged over it (an override's null unsets the key). Every value present is kept:
/// transformers 4.x's GenerationConfig.to_diff_dict, through which vLLM reads the file, also drops values equal to
/// that version's defaults (top_k 50, temperature / top_p / repetition_penalty 1.0); only "top_k": 50 differs in
/// effect, and transformers 5.x (whose defaults are None) keeps it as here.
struct GenerationDefaults {
  std::optional<double> repetition_penalty;  ///< > 0
  std::optional<double> temperature;         ///< >= 0 (below kSamplingEps: greedy)
  std::optional<int> top_k;                  ///< -1 or 0 (off), or >= 1
  std::optional<double> top_p;               ///< in (0, 1]
  std::optional<double> min_p;               ///< in [0, 1]
  std::optional<int> max_tokens;             ///< generation_config's max_new_tokens, >= 1
  /// vLLM's override_max_tokens: a server-wide cap on every request's max_tokens, its own included. Set when
  /// --override-generation-config gives max_new_tokens, or with --generation-config FOLDER to the resulting
  /// max_tokens; never from the model folder's own file ("auto"), whose max_new_tokens is only a default. The server
  /// applies it; the Python LLM does not (as vLLM's LLM).
  std::optional<int> max_tokens_limit;
  /// Where the defaults came from, as vLLM's startup log names it: "model" (--generation-config auto), "vllm" (the
  /// overrides only) or the --generation-config folder.
  std::string source = "model";

  /// True when no sampling field is set (requests keep SamplingParams' defaults).
  bool empty() const;

  /// Sets every field of `sp` that has a default here (max_tokens too); leaves the others as they are.
  void apply(SamplingParams& sp) const;

  /// The fields set, as vLLM logs its dict of them, in its order: "{'repetition_penalty': 1.05, 'temperature': 0.7,
  /// 'top_k': 20, 'top_p': 0.8, 'min_p': 0.0, 'max_tokens': 512}" ("{}" when empty).
  std::string describe() const;

  /// vLLM's startup notice when defaults are set: "Default sampling parameters have been overridden by the model's
  /// Hugging Face generation config recommended from the model creator. If this is not intended, please relaunch
  /// with <relaunch>. Using default sampling params from <source>: <describe()>". `relaunch` names the front end's
  /// way to turn them off (the CLI: "`--generation-config vllm`").
  std::string notice(std::string_view relaunch) const;

  /// Reads the defaults (vLLM's ModelConfig.get_diff_sampling_param). generation_config: "auto" (`model_dir`'s
  /// generation_config.json when there is one, else none), "vllm" (none) or a folder holding generation_config.json.
  /// override_json: --override-generation-config, a JSON object merged over it ("" = none); with "vllm" only these.
  /// Keys other than the six are ignored, as vLLM does (an override's unknown key is logged as a warning).
  /// Throws Error naming the file (or --override-generation-config) and the field for a value of the wrong type or
  /// out of range (temperature < 0, top_p outside (0, 1], top_k < -1, min_p outside [0, 1], repetition_penalty <= 0,
  /// max_new_tokens < 1, non-finite numbers), for invalid JSON or a non-object, and naming --generation-config for an
  /// empty value, a folder that does not exist or one without generation_config.json.
  static GenerationDefaults load(const std::filesystem::path& model_dir, std::string_view generation_config,
                                 std::string_view override_json);
};

}  // namespace ssmserve
