// Owns the BPE merge loop (priority queue over adjacent symbol pairs), the initial symbols of a word and the
// per-word result cache (see bpe.h; mirrors HF tokenizers' models/bpe/model.rs merge_word and word.rs merge_all).
#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <mutex>
#include <queue>

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode_props.h"

namespace ssmserve {

struct BpeModel::Cache {
  mutable std::shared_mutex mu;
  std::unordered_map<std::string, std::vector<int>> words;
};

BpeModel::~BpeModel() = default;
BpeModel::BpeModel(BpeModel&&) noexcept = default;

BpeModel::BpeModel(const std::unordered_map<std::string, int>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : opt_(std::move(options)), vocab_(vocab), cache_(std::make_unique<Cache>()) {
  fast_bytes_ = opt_.byte_input && opt_.continuing_subword_prefix.empty() && opt_.end_of_word_suffix.empty() &&
                !opt_.ignore_merges;
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_level::byte_to_string(static_cast<unsigned char>(b)));
    // GPT-NeoX lacks bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF): -1, dropped like HF does without unk.
    byte_ids_[b] = it != vocab.end() ? it->second : -1;
    auto fb = vocab.find(fmt::format("<0x{:02X}>", b));
    fallback_ids_[b] = fb != vocab.end() ? fb->second : -1;
  }
  const std::string& prefix = opt_.continuing_subword_prefix;
  merges_.reserve(merges.size() * 2);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab.find(a), ib = vocab.find(b);
    SSM_CHECK(ia != vocab.end() && ib != vocab.end(), "BPE merge #{} '{} {}' uses a token missing from the vocabulary",
              rank, text_excerpt(a), text_excerpt(b));
    SSM_CHECK(b.compare(0, prefix.size(), prefix) == 0,
              "BPE merge #{} '{} {}': the right part lacks the continuing_subword_prefix '{}'", rank, text_excerpt(a),
              text_excerpt(b), text_excerpt(prefix));
    auto ic = vocab.find(a + b.substr(prefix.size()));
    SSM_CHECK(ic != vocab.end(), "BPE merge #{} '{} {}' makes a token missing from the vocabulary", rank,
              text_excerpt(a), text_excerpt(b));
    // A duplicated pair keeps its last rank: HF collects the merges into a map in order, later entries overwriting.
    merges_.insert_or_assign(key(ia->second, ib->second), Merge{static_cast<int>(rank), ic->second});
  }
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int>& sym) const {
  if (fast_bytes_) {
    for (char c : word)
      if (const int id = byte_ids_[static_cast<unsigned char>(c)]; id >= 0) sym.push_back(id);
    return;
  }
  std::string mapped;
  if (opt_.byte_input) {
    mapped.reserve(word.size() * 2);
    for (char c : word) mapped += byte_level::byte_to_string(static_cast<unsigned char>(c));
    word = mapped;
  }
  int unk_len = 0;  // pending unk symbol (fuse_unk merges consecutive ones)
  std::string s;
  for (std::size_t i = 0, len = 0; i < word.size(); i += len) {
    len = unicode_props::char_len(static_cast<unsigned char>(word[i]));
    if (i + len > word.size()) len = word.size() - i;
    s.clear();
    if (i > 0) s += opt_.continuing_subword_prefix;
    s.append(word.substr(i, len));
    if (i + len == word.size()) s += opt_.end_of_word_suffix;
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (unk_len > 0) sym.push_back(opt_.unk_id);
      unk_len = 0;
      sym.push_back(it->second);
      continue;
    }
    if (opt_.byte_fallback) {
      bool all = true;
      for (char c : s) all = all && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {  // HF adds the byte tokens without flushing a pending unk first
        for (char c : s) sym.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (opt_.unk_id >= 0) {
      if (unk_len > 0 && !opt_.fuse_unk) sym.push_back(opt_.unk_id);
      unk_len += static_cast<int>(len);
    }
  }
  if (unk_len > 0) sym.push_back(opt_.unk_id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (opt_.ignore_merges) {
    std::string mapped;
    if (opt_.byte_input) {
      for (char c : word) mapped += byte_level::byte_to_string(static_cast<unsigned char>(c));
    } else {
      mapped.assign(word);
    }
    if (auto it = vocab_.find(mapped); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (fast_bytes_ && word.size() == 1) {
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
  std::vector<int> sym;
  sym.reserve(word.size());
  initial_symbols(word, sym);
  merge_symbols(sym, out);
  if (cacheable) {
    std::unique_lock lock(cache_->mu);
    if (cache_->words.size() < kCacheCapacity) {
      cache_->words.try_emplace(std::move(key_str), out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    }
  }
}

void BpeModel::merge_symbols(std::vector<int>& ids, std::vector<int>& out) const {
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
  const int n = static_cast<int>(ids.size());
  if (n == 0) return;
  if (n == 1) {
    out.push_back(ids[0]);
    return;
  }
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};

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
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
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
