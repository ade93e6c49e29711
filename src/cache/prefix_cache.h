// Owns the block manager of the shared pool with prefix caching (vllm-ssm-design.md §3.2-§3.3, vLLM's
// KVCacheManager / BlockPool with cached-block hashes): per-block reference counts, a table from a token-chain
// block hash to the block holding that prefix's state (or KV page), and one LRU over the blocks no request holds,
// which keep their hash and are evicted only when a free block is needed. With caching off it is a plain free list.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/block_pool.h"

namespace ssmserve {

/// A token-chain block hash (128 bits: collisions are not a practical concern, so a hit is trusted without
/// comparing tokens). Block i's hash covers every token in [0, (i + 1) * granularity).
struct BlockHash {
  uint64_t hi = 0, lo = 0;
  bool operator==(const BlockHash&) const = default;
};

/// hash(parent, tokens, salt): the hash of a block whose earlier tokens hash to `parent` (BlockHash{} for the first
/// block), holding `tokens` [granularity] int32 ids; `salt` folds in what else changes a state (model, dtypes).
BlockHash hash_block_tokens(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t salt);

/// The chain's root for a request with vLLM's `cache_salt` (a tenant's secret): the parent of its first block, so
/// that only requests with the same salt share cached blocks (BlockHash{} without a salt). Bytes of `salt` hashed
/// as hash_block_tokens hashes ids.
BlockHash cache_salt_root(std::string_view salt);

/// What a cached block holds: the recurrent state after the block's last token, or a KV page of its tokens.
enum class CachedKind : uint8_t { State = 0, Kv = 1 };

/// The pool's block manager. Every handed-out block has a reference count (the requests and pending copies
/// holding it); a block at count 0 is free, or, when it carries a hash, cached and evictable (LRU order, least
/// recently used first). allocate() takes a free block first, else evicts the LRU cached one (running requests
/// always win over the cache). Block 0 (null) is never handed out. Single-threaded (the engine thread).
class PrefixCache {
 public:
  /// pool: the free list it draws from (not owned, outlives this). enabled = false: insert() caches nothing.
  PrefixCache(BlockPool& pool, bool enabled);

  bool enabled() const { return enabled_; }
  /// A block with reference count 1: a free one, else the least recently used cached block (its hash dropped);
  /// 0 when every block is held.
  int allocate();
  /// Blocks allocate() can still hand out (free + cached-and-unheld).
  int num_available() const { return pool_.num_free() + static_cast<int>(lru_.size()); }
  /// Adds a holder to `block` (a cached block leaves the LRU while held). Throws Error for an unknown / null block.
  void acquire(int block);
  /// Drops a holder; at count 0 a cached block becomes evictable (most recently used end), an uncached one free.
  /// 0 is ignored. Throws Error when the block was not held.
  void release(int block);
  /// The block cached under (kind, hash), or 0.
  int lookup(CachedKind kind, const BlockHash& hash) const;
  /// Registers `block` (held by the caller) under (kind, hash). Returns false, changing nothing, when caching is
  /// off, the key is already cached (under another block) or the block already carries a hash.
  bool insert(CachedKind kind, const BlockHash& hash, int block);
  /// Marks a cached, unheld block as just used (moves it to the LRU's most recently used end).
  void touch(int block);
  int ref_count(int block) const { return ref_[static_cast<size_t>(block)]; }
  /// Blocks carrying a hash (held or not), and of those the ones no request holds.
  int num_cached() const { return static_cast<int>(keys_.size()); }
  int num_evictable() const { return static_cast<int>(lru_.size()); }
  int64_t num_evictions() const { return evictions_; }
  /// Called by allocate() for every cached block it evicts, before the block's key is dropped and the block handed
  /// out again (the host tier copies the state out there: --swap-space). Empty: nothing is called.
  void set_on_evict(std::function<void(int block, CachedKind kind, const BlockHash& hash)> f) { on_evict_ = std::move(f); }

 private:
  struct Key {
    BlockHash hash;
    CachedKind kind = CachedKind::State;
    bool operator==(const Key&) const = default;
  };
  struct KeyHasher {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.hash.lo ^ (k.hash.hi * 31) ^ static_cast<uint64_t>(k.kind)); }
  };
  void drop_key(int block);

  BlockPool& pool_;
  bool enabled_;
  std::vector<int> ref_;                               // [num_blocks]
  std::vector<int8_t> cached_;                         // [num_blocks] 1 when the block carries a key
  std::vector<Key> block_key_;                         // [num_blocks] its key when cached_
  std::unordered_map<Key, int, KeyHasher> keys_;       // key -> block
  std::list<int> lru_;                                 // unheld cached blocks, LRU first
  std::vector<std::list<int>::iterator> lru_pos_;      // [num_blocks] position in lru_ when there
  std::vector<int8_t> in_lru_;
  int64_t evictions_ = 0;
  std::function<void(int, CachedKind, const BlockHash&)> on_evict_;
};

}  // namespace ssmserve
