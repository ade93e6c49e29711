// Owns the BPE merge loop (priority queue over adjacent symbol pairs) and the per-word result cache.
#include "tokenizer/bpe.h"

#include <mutex>
#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace ssmserve {

struct BpeModel::Cache {
  mutable std::shared_mutex mu;
  std::unordered_map<std::string, std::vector<int>> words;
};

BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;

BpeModel::BpeModel(const std::unordered_map<std::string, int>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges)
    : cache_(std::make_unique<Cache>()) {
  for (int b = 0; b < 256; ++b) {
    const std::string s = byte_level::byte_to_string(static_cast<unsigned char>(b));
    auto it = vocab.find(s);
    // GPT-NeoX lacks bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF): -1, dropped like HF does without unk.
    byte_ids_[b] = it != vocab.end() ? it->second : -1;
  }
  merges_.reserve(merges.size() * 2);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    SSM_CHECK(ia != vocab.end() && ib != vocab.end() && ic != vocab.end(),
              "BPE merge #{} '{} {}' uses a token missing from the vocabulary", rank, a, b);
    // A duplicated pair keeps its last rank: HF collects the merges into a map in order, later entries overwriting.
    merges_.insert_or_assign(key(ia->second, ib->second), Merge{static_cast<int>(rank), ic->second});
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    if (const int id = byte_ids_[static_cast<unsigned char>(word[0])]; id >= 0) out.push_back(id);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordLen;
  std::string key_str;
  if (cacheable) {
    key_str.assign(word);
    std::shared_lock lock(cache_->mu);
    auto it = cache_->words.find(key_str);
    if (it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_->mu);
    if (cache_->words.size() < kCacheCapacity) {
      cache_->words.try_emplace(std::move(key_str), out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    }
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int>& out) const {
  struct Symbol {
    int id;
    int prev;
    int next;
    bool alive;
  };
  struct Candidate {
    int rank;
    int pos;
    int new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (char c : word) {
    const int id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) sym.push_back({id, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, true});
  }
  const int n = static_cast<int>(sym.size());
  if (n == 0) return;
  sym.back().next = -1;

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push_pair = [&](int pos) {
    const int nx = sym[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(key(sym[pos].id, sym[nx].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale entry: the pair at this position changed since it was queued.
    auto it = merges_.find(key(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id || it->second.rank != top.rank) continue;
    Symbol& right = sym[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int i = 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace ssmserve
