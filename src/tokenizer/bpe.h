// Owns the byte-level BPE model: vocabulary ids of single bytes, ranked merges, the merge loop and its per-word cache.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ssmserve {

/// Byte-level BPE (Sennrich et al. 2016, as in GPT-2 and Hugging Face tokenizers' `models::bpe`).
/// Thread-safe: encode_word() may be called concurrently (the cache is guarded by a shared mutex).
class BpeModel {
 public:
  /// `vocab`: token string (byte-level alphabet) -> id. `merges`: pairs in rank order (rank = index).
  /// Throws Error when a merge's parts or result are missing from `vocab`. Bytes missing from `vocab` are dropped
  /// from words (HF without unk_token); well-formed UTF-8 never contains the ones GPT-NeoX lacks.
  BpeModel(const std::unordered_map<std::string, int>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges);

  /// Appends the ids of one pre-tokenized word given as raw bytes. Starts from one symbol per byte and repeatedly
  /// applies the lowest-ranked merge among adjacent pairs, leftmost first on ties (the order HF's priority queue
  /// yields). Results are cached per word (up to kCacheCapacity words, then no more insertions, like HF).
  void encode_word(std::string_view word, std::vector<int>& out) const;

  static constexpr std::size_t kCacheCapacity = 200000;
  static constexpr std::size_t kMaxCachedWordLen = 256;

 private:
  struct Merge {
    int rank;
    int new_id;
  };
  static std::uint64_t key(int a, int b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int>& out) const;

  std::array<int, 256> byte_ids_{};
  std::unordered_map<std::uint64_t, Merge> merges_;

  struct Cache;
  std::unique_ptr<Cache> cache_;

 public:
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;
};

}  // namespace ssmserve
