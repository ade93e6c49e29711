// Owns the bookkeeping of the host-memory tier of cached blocks (--swap-space, vLLM's flag name; issue 28 item 4):
// a fixed number of host slots, each one pool page (a cached state, or a hybrid's KV page), a table from a block's
// (kind, hash) to the slot holding it, pins for slots a swap-in of the current step reads, and one LRU over the
// unpinned slots. The copies themselves are the model's (CausalLM::swap_out_state_blocks / swap_in_state_blocks);
// the Scheduler drives both.
#pragma once
#include <list>
#include <unordered_map>
#include <vector>

#include "cache/prefix_cache.h"

namespace ssmserve {

/// Host slots of evicted cached blocks (states and KV pages, keyed apart: a state and the KV page ending at the same
/// token share a hash). Slots are 0..num_slots()-1. Single-threaded (the engine thread).
class HostStateTier {
 public:
  explicit HostStateTier(int num_slots = 0);
  int num_slots() const { return static_cast<int>(key_of_.size()); }
  /// Slots holding a block.
  int num_used() const { return static_cast<int>(slot_of_.size()); }
  /// The slot holding the block cached under (kind, hash), or -1.
  int lookup(CachedKind kind, const BlockHash& hash) const;
  /// A slot for the block cached under (kind, hash) (which must not be held already: Error): a free one, else the
  /// least recently used unpinned one (its block dropped); -1 when every slot is pinned. The slot is most recently
  /// used afterwards.
  int insert(CachedKind kind, const BlockHash& hash);
  /// Marks `slot` as just used.
  void touch(int slot);
  /// Pins / unpins a slot a swap-in reads (a pinned slot is never reused). Throws Error for a slot out of range or
  /// an unpin without a pin.
  void pin(int slot);
  void unpin(int slot);

 private:
  struct Key {
    BlockHash hash;
    CachedKind kind = CachedKind::State;
    bool operator==(const Key&) const = default;
  };
  struct Hasher {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.hash.lo ^ (k.hash.hi * 31) ^ static_cast<uint64_t>(k.kind)); }
  };
  std::vector<Key> key_of_;                        // [slots]
  std::vector<int8_t> used_;                       // [slots]
  std::vector<int> pins_;                          // [slots]
  std::unordered_map<Key, int, Hasher> slot_of_;
  std::list<int> lru_;                             // used slots, least recently used first
  std::vector<std::list<int>::iterator> lru_pos_;  // [slots]
  std::vector<int> free_;
};

}  // namespace ssmserve
