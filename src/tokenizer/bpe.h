// Owns the BPE model: initial symbols of a word (bytes or characters, with unk / byte fallback / subword prefixes),
// ranked merges, the merge loop and its per-word cache.
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

/// tokenizer.json BPE model options (HF `models::bpe::BPE`; dropout is refused by the loader).
struct BpeOptions {
  /// Words arrive as raw bytes that stand for their byte-level alphabet characters (the ByteLevel pre-tokenizer ran
  /// last). Otherwise words are in the vocabulary's own alphabet and split into Unicode characters.
  bool byte_input = true;
  bool byte_fallback = false;  ///< characters missing from the vocabulary become `<0xHH>` byte tokens when all exist
  bool ignore_merges = false;  ///< a word that is itself in the vocabulary is one token, merges aside
  bool fuse_unk = false;       ///< consecutive unknown characters become one unk token
  int unk_id = -1;             ///< id of unk_token, -1 when there is none (unknown characters are then dropped)
  std::string continuing_subword_prefix;  ///< prepended to every initial symbol but the first of a word
  std::string end_of_word_suffix;         ///< appended to the last initial symbol of a word
};

/// Byte-pair encoding as Hugging Face tokenizers' `models::bpe` computes it (Sennrich et al. 2016).
/// Thread-safe: encode_word() may be called concurrently (the cache is guarded by a shared mutex).
class BpeModel {
 public:
  /// `vocab`: token string -> id. `merges`: pairs in rank order (rank = index); the merged token is
  /// left + right without its continuing_subword_prefix. Throws Error when a merge's parts or result are missing from
  /// `vocab`.
  BpeModel(const std::unordered_map<std::string, int>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options = {});

  /// Appends the ids of one pre-tokenized word. Starts from one symbol per byte / character (see BpeOptions) and
  /// repeatedly applies the lowest-ranked merge among adjacent pairs, leftmost first on ties (the order HF's priority
  /// queue yields). Results are cached per word (up to kCacheCapacity words, then no more insertions, like HF).
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
  void initial_symbols(std::string_view word, std::vector<int>& sym) const;
  void merge_symbols(std::vector<int>& sym, std::vector<int>& out) const;

  BpeOptions opt_;
  bool fast_bytes_ = true;  // byte_input without prefix / suffix / ignore_merges: symbols straight from byte_ids_
  std::unordered_map<std::string, int> vocab_;
  std::array<int, 256> byte_ids_{};           // byte-level character of each byte -> id (-1: missing)
  std::array<int, 256> fallback_ids_{};       // `<0xHH>` -> id (-1: missing)
  std::unordered_map<std::uint64_t, Merge> merges_;

  struct Cache;
  std::unique_ptr<Cache> cache_;

 public:
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;
};

}  // namespace ssmserve
