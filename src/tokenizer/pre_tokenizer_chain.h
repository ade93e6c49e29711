// Owns tokenizer.json's `pre_tokenizer`: the supported HF pre-tokenizers as a chain of steps that split (and
// transform) normalized text into the words the model tokenizes.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ssmserve {

/// A word produced by the pre-tokenizer. `first`: it starts at offset 0 of the input text (HF's
/// offsets_original().0 == 0, which Metaspace's prepend_scheme "first" tests).
struct PreToken {
  std::string text;
  bool first;
};

/// HF's SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// A tokenizer.json pre-tokenizer as HF `tokenizers` runs it: ByteLevel (add_prefix_space, use_regex), Split (any
/// regex or string, every behaviour, invert), Metaspace (replacement, prepend_scheme always/first/never, split),
/// Digits (individual_digits), Punctuation (behaviour), WhitespaceSplit, Sequence of these. Immutable after parsing;
/// run() is thread-safe.
class PreTokenizerChain {
 public:
  /// Parses the `pre_tokenizer` value (null: the whole text is one word). Throws Error naming the component for an
  /// unsupported type (e.g. "unsupported pre_tokenizer 'BertPreTokenizer'") or a bad field.
  static PreTokenizerChain from_json(const nlohmann::json& j);

  /// True when the last step is ByteLevel: run() then leaves the words as raw bytes, and the model maps each byte to
  /// the byte-level alphabet itself (faster; same result). Otherwise words are in the vocabulary's alphabet.
  bool raw_bytes_out() const { return raw_bytes_out_; }

  /// True when every step only cuts text into substrings: Split steps with behaviour Isolated (not inverted), then
  /// ByteLevel last without add_prefix_space (GPT-NeoX, GPT-2, Qwen, Llama-3 style). run_views() then gives the words
  /// without copying them.
  bool splits_only() const { return splits_only_; }

  /// The words of `text` as views into it, when splits_only() (same words as run()). `scratch` is reused.
  void run_views(std::string_view text, std::vector<std::string_view>& out,
                 std::vector<std::string_view>& scratch) const;

  /// Appends the words of `text` (one normalized segment; `first`: the segment starts the input) to `out`.
  void run(std::string_view text, bool first, std::vector<PreToken>& out) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
  bool raw_bytes_out_ = false;
  bool splits_only_ = false;
  static void parse_into(const nlohmann::json& j, std::vector<std::shared_ptr<const Step>>& steps, int depth);
};

}  // namespace ssmserve
