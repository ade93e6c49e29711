// Owns tokenizer.json's `normalizer`: the supported HF normalizers, parsed once and applied to text in order.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ssmserve {

class RegexSplitter;

/// The regex of a tokenizer.json pattern object ({"Regex": Oniguruma regex} or {"String": literal}), as the Split
/// pre-tokenizer and the Replace normalizer / decoder read it. Throws Error naming `what` when it is malformed or the
/// regex does not compile.
std::shared_ptr<RegexSplitter> parse_pattern(const nlohmann::json& pattern, const char* what);

/// A tokenizer.json normalizer as HF `tokenizers` applies it: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace
/// (String or Regex pattern) and Sequence of these (flattened). Immutable after parsing; apply() is thread-safe.
class Normalizer {
 public:
  /// Parses the `normalizer` value (null: the identity). Throws Error naming the component for any other type
  /// (e.g. "unsupported normalizer 'Precompiled'") or a bad field.
  static Normalizer from_json(const nlohmann::json& j);

  /// True when apply() returns its input unchanged for every text.
  bool empty() const { return steps_.empty(); }

  /// The normalized form of well-formed UTF-8 `text` (one added-token-free segment of the input).
  std::string apply(std::string_view text) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
  static void parse_into(const nlohmann::json& j, std::vector<std::shared_ptr<const Step>>& steps, int depth);
};

}  // namespace ssmserve
