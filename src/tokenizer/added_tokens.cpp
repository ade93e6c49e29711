// Owns the leftmost-longest added-token scan (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include <algorithm>

namespace ssmserve {

void AddedTokenMatcher::add(std::string content, int id) {
  if (content.empty()) return;
  auto& list = by_first_byte_[static_cast<unsigned char>(content[0])];
  for (const Entry& e : list) {
    if (e.content == content) return;
  }
  list.push_back({std::move(content), id});
  std::stable_sort(list.begin(), list.end(),
                   [](const Entry& a, const Entry& b) { return a.content.size() > b.content.size(); });
  ++count_;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& out) const {
  if (count_ == 0) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  std::size_t plain_start = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const Entry* hit = nullptr;
    for (const Entry& e : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (text.size() - i >= e.content.size() && text.compare(i, e.content.size(), e.content) == 0) {
        hit = &e;
        break;  // list is sorted longest first
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > plain_start) out.push_back({text.substr(plain_start, i - plain_start), -1});
    out.push_back({text.substr(i, hit->content.size()), hit->id});
    i += hit->content.size();
    plain_start = i;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
}

}  // namespace ssmserve
