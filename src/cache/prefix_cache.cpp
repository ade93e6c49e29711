// Owns the pool's block manager with prefix caching (see prefix_cache.h).
#include "cache/prefix_cache.h"

#include "core/error.h"

namespace ssmserve {
namespace {

/// splitmix64's finalizer: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

BlockHash hash_block_tokens(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t salt) {
  // Two independent 64-bit chains (different seeds and multipliers) over the parent, the salt, the length and the
  // ids; each step is a bijective mix of the running value and the next word.
  uint64_t a = mix64(parent.hi ^ 0x9e3779b97f4a7c15ULL) ^ mix64(salt + 0x632be59bd9b4e019ULL);
  uint64_t b = mix64(parent.lo ^ 0xc2b2ae3d27d4eb4fULL) ^ mix64(salt * 0x165667b19e3779f9ULL + 1);
  a = mix64(a ^ tokens.size());
  b = mix64(b + tokens.size() * 0x27d4eb2f165667c5ULL);
  for (int32_t t : tokens) {
    const uint64_t v = static_cast<uint32_t>(t);
    a = mix64(a ^ (v + 0x9e3779b97f4a7c15ULL)) * 0xff51afd7ed558ccdULL;
    b = mix64(b + (v ^ 0xc4ceb9fe1a85ec53ULL) * 0x87c37b91114253d5ULL);
  }
  return {mix64(a), mix64(b ^ a)};
}

BlockHash cache_salt_root(std::string_view salt) {
  std::vector<int32_t> bytes(salt.size());
  for (size_t i = 0; i < salt.size(); ++i) bytes[i] = static_cast<unsigned char>(salt[i]);
  // A salt word no model configuration uses (prefix salts are hashes of the model's description).
  return hash_block_tokens(BlockHash{0x5a17c0deULL, 0xcac4e5a1ULL}, bytes, 0x73616c7420726f6fULL);
}

PrefixCache::PrefixCache(BlockPool& pool, bool enabled)
    : pool_(pool),
      enabled_(enabled),
      ref_(static_cast<size_t>(pool.num_blocks()), 0),
      cached_(static_cast<size_t>(pool.num_blocks()), 0),
      block_key_(static_cast<size_t>(pool.num_blocks())),
      lru_pos_(static_cast<size_t>(pool.num_blocks())),
      in_lru_(static_cast<size_t>(pool.num_blocks()), 0) {}

int PrefixCache::allocate() {
  int b = pool_.allocate();
  if (b == 0 && !lru_.empty()) {  // evict the least recently used cached block
    b = lru_.front();
    lru_.pop_front();
    in_lru_[static_cast<size_t>(b)] = 0;
    if (on_evict_) {
      const Key& k = block_key_[static_cast<size_t>(b)];
      on_evict_(b, k.kind, k.hash);
    }
    drop_key(b);
    ++evictions_;
  }
  if (b != 0) ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void PrefixCache::acquire(int block) {
  SSM_CHECK(block > 0 && block < pool_.num_blocks(), "PrefixCache: acquiring block {} out of range", block);
  const size_t i = static_cast<size_t>(block);
  SSM_CHECK(ref_[i] > 0 || cached_[i], "PrefixCache: acquiring block {}, which is free", block);
  if (in_lru_[i]) {
    lru_.erase(lru_pos_[i]);
    in_lru_[i] = 0;
  }
  ++ref_[i];
}

void PrefixCache::release(int block) {
  if (block == 0) return;
  SSM_CHECK(block > 0 && block < pool_.num_blocks(), "PrefixCache: releasing block {} out of range", block);
  const size_t i = static_cast<size_t>(block);
  SSM_CHECK(ref_[i] > 0, "PrefixCache: releasing block {}, which no one holds", block);
  if (--ref_[i] > 0) return;
  if (cached_[i]) {
    lru_pos_[i] = lru_.insert(lru_.end(), block);
    in_lru_[i] = 1;
  } else {
    pool_.free(block);
  }
}

int PrefixCache::lookup(CachedKind kind, const BlockHash& hash) const {
  const auto it = keys_.find(Key{hash, kind});
  return it == keys_.end() ? 0 : it->second;
}

bool PrefixCache::insert(CachedKind kind, const BlockHash& hash, int block) {
  SSM_CHECK(block > 0 && block < pool_.num_blocks() && ref_[static_cast<size_t>(block)] > 0,
            "PrefixCache: inserting block {}, which is not held", block);
  if (!enabled_ || cached_[static_cast<size_t>(block)]) return false;
  const Key k{hash, kind};
  if (!keys_.emplace(k, block).second) return false;
  cached_[static_cast<size_t>(block)] = 1;
  block_key_[static_cast<size_t>(block)] = k;
  return true;
}

void PrefixCache::touch(int block) {
  const size_t i = static_cast<size_t>(block);
  if (block <= 0 || block >= pool_.num_blocks() || !in_lru_[i]) return;
  lru_.splice(lru_.end(), lru_, lru_pos_[i]);
}

void PrefixCache::drop_key(int block) {
  const size_t i = static_cast<size_t>(block);
  if (!cached_[i]) return;
  keys_.erase(block_key_[i]);
  cached_[i] = 0;
}

}  // namespace ssmserve
