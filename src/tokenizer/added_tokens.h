// Owns matching of added tokens (special or not) inside text, with HF's leftmost-longest rule.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve {

/// One piece of text after added-token extraction: either an added token (`id >= 0`) or plain text (`id == -1`).
struct TextSegment {
  std::string_view text;
  int id;
};

/// Finds added tokens in text like HF tokenizers' AddedVocabulary (an Aho-Corasick automaton with
/// MatchKind::LeftmostLongest): scanning left to right, the first position where any token starts wins, and there
/// the longest token. Supports tokens without lstrip/rstrip/single_word (the loader rejects those options).
class AddedTokenMatcher {
 public:
  /// Adds a token (non-empty content) with its id; a repeated content keeps the first id.
  void add(std::string content, int id);
  bool empty() const { return count_ == 0; }

  /// Splits `text` into segments in order; plain segments are never empty. Appends to `out`.
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Entry {
    std::string content;
    int id;
  };
  std::array<std::vector<Entry>, 256> by_first_byte_;  // each list sorted longest first
  std::size_t count_ = 0;
};

}  // namespace ssmserve
