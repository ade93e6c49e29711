// Owns the leftmost-longest added-token scan (see added_tokens.h; mirrors added_vocabulary.rs find_matches).
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode_props.h"

namespace ssmserve {
namespace {

/// The character ending right before byte `end` of `s` (0 < end), and its start.
char32_t char_before(std::string_view s, std::size_t end, std::size_t& start) {
  std::size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80 && end - k < 4) --k;
  std::size_t len = 0;
  start = k;
  return unicode_props::decode_at(s, k, len);
}

}  // namespace

void AddedTokenMatcher::add(const std::string& content, int id, AddedTokenFlags flags) {
  if (content.empty()) return;
  std::int32_t node = 0;
  for (char c : content) {
    const std::uint64_t k = (static_cast<std::uint64_t>(node) << 8) | static_cast<unsigned char>(c);
    auto [it, inserted] = edges_.try_emplace(k, nodes_);
    if (inserted) ++nodes_;
    node = it->second;
  }
  if (terminals_.try_emplace(node, Terminal{id, flags}).second) ++count_;
  first_byte_[static_cast<unsigned char>(content[0])] = true;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  if (count_ == 0) {
    if (!text.empty()) out.push_back({text, -1, 0});
    return;
  }
  std::size_t plain_start = 0;  // end of the last match (HF's start_offset)
  std::size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    const Terminal* hit = nullptr;
    std::size_t hit_len = 0;
    std::int32_t node = 0;
    for (std::size_t k = i; k < text.size(); ++k) {
      auto e = edges_.find((static_cast<std::uint64_t>(node) << 8) | static_cast<unsigned char>(text[k]));
      if (e == edges_.end()) break;
      node = e->second;
      if (auto t = terminals_.find(node); t != terminals_.end()) {
        hit = &t->second;
        hit_len = k + 1 - i;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    std::size_t start = i, stop = i + hit_len;
    i = stop;  // the scan resumes after this match (before any rstrip widening) whether or not it is kept
    if (hit->flags.single_word) {
      std::size_t cs = 0, len = 0;
      const bool word_before = start > 0 && unicode_props::is_word(char_before(text, start, cs));
      const bool word_after = stop < text.size() && unicode_props::is_word(unicode_props::decode_at(text, stop, len));
      if (word_before || word_after) continue;
    }
    if (hit->flags.lstrip) {
      std::size_t s = start, cs = 0;
      while (s > 0 && unicode_props::is_whitespace(char_before(text, s, cs))) s = cs;
      start = std::max(s, plain_start);
    }
    if (hit->flags.rstrip) {
      std::size_t len = 0;
      while (stop < text.size() && unicode_props::is_whitespace(unicode_props::decode_at(text, stop, len))) stop += len;
    }
    // As HF: a match inside the whitespace an rstrip match absorbed is still emitted (its range overlaps).
    if (start > plain_start) out.push_back({text.substr(plain_start, start - plain_start), -1, plain_start});
    out.push_back({text.substr(start, stop > start ? stop - start : 0), hit->id, start});
    plain_start = stop;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1, plain_start});
}

}  // namespace ssmserve
