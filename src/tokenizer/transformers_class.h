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
/// transformers reads config.model_type, not text_config), the hub class (tokenizer_config.json `tokenizer_class`,
/// else config.json `tokenizer_class`; "" when neither) and whether tokenizer.json's text mentions "ByteLevel".
/// "" stands for TokenizersBackend (tokenizer.json's pipeline as it is). Mirrors models/auto/tokenization_auto.py
/// (transformers 5.24, `AutoTokenizer.from_pretrained`), with the registered classes of the Qwen model types and of
/// the other families ssmserve runs:
///   - a hub LlamaTokenizer over a byte-level tokenizer.json (model type not in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS):
///     TokenizersBackend;
///   - hub class set and the model type's registered class (TOKENIZER_MAPPING_NAMES) differs: TokenizersBackend when
///     the registered class is a backend class, else the registered class when the model type is in
///     MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, else the hub class;
///   - hub class set otherwise: the hub class (a "Fast" suffix removed);
///   - no hub class: the registered class.
std::string resolve(std::string_view model_type, std::string_view hub_class, bool tokenizer_json_is_byte_level = false);

/// The class `resolve` gives for the folder holding tokenizer.json, read from its config.json and
/// tokenizer_config.json (either may be absent), as AutoTokenizer.from_pretrained(folder) reads them. Throws Error
/// naming the file when one exists but is not valid JSON.
std::string of_folder(const std::filesystem::path& folder, bool tokenizer_json_is_byte_level = false);

/// True for the classes whose __init__ replaces tokenizer.json's pipeline (Qwen2Tokenizer, Qwen3_5Tokenizer,
/// GPT2Tokenizer, GPTNeoXTokenizer, LlamaTokenizer): see rebuild_for_class.
bool rebuilds_pipeline(std::string_view class_name);

/// The folder's tokenizer_config.json as an object (empty when absent). Throws Error when it is not valid JSON.
nlohmann::json tokenizer_config_of(const std::filesystem::path& folder);

/// Rewrites a parsed tokenizer.json into the pipeline `class_name`'s __init__ builds (transformers 5.24), keeping the
/// vocabulary, merges, added tokens and post-processor: Qwen classes as rebuild_pipeline; GPT2Tokenizer ByteLevel
/// (GPT-2 regex, add_prefix_space from tokenizer_config.json) without normalizer; GPTNeoXTokenizer the same after NFC;
/// LlamaTokenizer Metaspace (prepend_scheme "first", "always" with legacy=true, "never" with add_prefix_space=false),
/// BPE with byte_fallback and fuse_unk, decoder Replace / ByteFallback / Fuse / Strip. Other classes: unchanged.
void rebuild_for_class(nlohmann::json& tokenizer_json, std::string_view class_name, const nlohmann::json& tokenizer_config);

/// Adds the special tokens transformers registers on top of tokenizer.json: for bos, eos, unk, sep, pad, cls and mask
/// (in that order), tokenizer_config.json's value (a string or {"content": ...}; null: none), else the class default
/// (GPT2Tokenizer: <|endoftext|> for unk/bos/eos; GPTNeoXTokenizer: the same and <|padding|>; LlamaTokenizer: <unk>,
/// <s>, </s>). A token not among the added tokens becomes a special, non-normalized added token with its model
/// vocabulary id, else the next free id (HF AddedVocabulary::add_tokens).
void add_special_tokens(nlohmann::json& tokenizer_json, std::string_view class_name, const nlohmann::json& tokenizer_config);

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
