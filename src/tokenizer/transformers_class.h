// Owns the mirror of transformers 5.x AutoTokenizer's class choice for the tokenizer classes that rebuild the
// tokenizer.json pipeline (Qwen2Tokenizer, Qwen3_5Tokenizer), and the pipeline those classes build.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace ssmserve::transformers_class {

/// The tokenizer class transformers 5.x `AutoTokenizer.from_pretrained` instantiates (without remote code), given the
/// top-level `model_type` of the folder's config.json ("" when absent; for multimodal wrappers the wrapper's type, as
/// transformers reads config.model_type, not text_config) and the hub class (tokenizer_config.json `tokenizer_class`,
/// else config.json `tokenizer_class`; "" when neither). Mirrors models/auto/tokenization_auto.py
/// (transformers 5.24, `AutoTokenizer.from_pretrained`):
///   - hub class set, the model type's registered class (TOKENIZER_MAPPING_NAMES) differs from it and the model type
///     is in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: the registered class;
///   - hub class set otherwise: the hub class (a "Fast" suffix removed);
///   - no hub class: the registered class.
/// Only the Qwen model types are tabled (the classes that matter here); "" for anything else.
std::string resolve(std::string_view model_type, std::string_view hub_class);

/// The class `resolve` gives for the folder holding tokenizer.json, read from its config.json and
/// tokenizer_config.json (either may be absent), as AutoTokenizer.from_pretrained(folder) reads them. Throws Error
/// naming the file when one exists but is not valid JSON.
std::string of_folder(const std::filesystem::path& folder);

/// PRETOKENIZE_REGEX of a tokenizer class that rebuilds its pipeline from tokenizer.json's vocab and merges
/// (Qwen2Tokenizer: models/qwen2/tokenization_qwen2.py; Qwen3_5Tokenizer: models/qwen3_5/tokenization_qwen3_5.py),
/// or nullopt when `class_name` keeps tokenizer.json's own pipeline.
std::optional<std::string_view> rebuilt_pattern(std::string_view class_name);

/// Rewrites a parsed tokenizer.json into the pipeline the class's __init__ builds: NFC normalizer, pre-tokenizer
/// Sequence[Split(Regex(pattern), Isolated), ByteLevel(add_prefix_space=false, use_regex=false)], ByteLevel decoder,
/// BPE without dropout/unk/prefix/suffix/byte_fallback/ignore_merges. Vocabulary, merges, added tokens and the
/// post-processor stay (transformers passes them through convert_to_native_format). Not mirrored: special tokens that
/// tokenizer_config.json names but tokenizer.json's added_tokens lacks (the class's __init__ would add them).
void rebuild_pipeline(nlohmann::json& tokenizer_json, std::string_view pattern);

}  // namespace ssmserve::transformers_class
