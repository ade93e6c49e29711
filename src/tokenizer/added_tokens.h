// Owns matching of added tokens (special or not) inside text: HF's leftmost-longest rule and the lstrip / rstrip /
// single_word options.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ssmserve {

/// One piece of text after added-token extraction: either an added token (`id >= 0`) or plain text (`id == -1`).
/// `start`: byte offset of the piece in the text that was split.
struct TextSegment {
  std::string_view text;
  int id;
  std::size_t start = 0;
};

/// Options of one added token (tokenizer.json `added_tokens` entry).
struct AddedTokenFlags {
  bool lstrip = false;       ///< the match absorbs the whitespace before it
  bool rstrip = false;       ///< the match absorbs the whitespace after it
  bool single_word = false;  ///< only matches when not inside a word (no \w character right before or after)
};

/// Finds added tokens in text like HF tokenizers' AddedVocabulary::find_matches: a leftmost-longest scan (the first
/// position where any token starts wins, and there the longest token), matches not overlapping; a single_word match
/// inside a word is skipped (the scan continues after it); lstrip / rstrip widen a match over adjacent whitespace
/// (Rust regex `\s`), never over a previous match. A byte trie keeps the scan at O(text x longest token) however many
/// tokens there are.
class AddedTokenMatcher {
 public:
  /// Adds a token (non-empty content) with its id; a repeated content keeps the first id and options.
  void add(const std::string& content, int id, AddedTokenFlags flags = {});
  bool empty() const { return count_ == 0; }

  /// Splits `text` into segments in order; plain segments are never empty. Appends to `out`.
  void split(std::string_view text, std::vector<TextSegment>& out) const;

 private:
  struct Terminal {
    int id;
    AddedTokenFlags flags;
  };
  // Trie over bytes: node 0 is the root; edges keyed by (node << 8 | byte).
  std::unordered_map<std::uint64_t, std::int32_t> edges_;
  std::unordered_map<std::int32_t, Terminal> terminals_;  // node -> token ending there
  std::int32_t nodes_ = 1;
  std::size_t count_ = 0;
  bool first_byte_[256] = {};
};

}  // namespace ssmserve
