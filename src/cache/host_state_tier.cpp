// Owns the host tier's slot bookkeeping (see host_state_tier.h).
#include "cache/host_state_tier.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve {

HostStateTier::HostStateTier(int num_slots)
    : key_of_(static_cast<size_t>(std::max(0, num_slots))),
      used_(key_of_.size(), 0),
      pins_(key_of_.size(), 0),
      lru_pos_(key_of_.size()) {
  for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

int HostStateTier::lookup(CachedKind kind, const BlockHash& hash) const {
  const auto it = slot_of_.find(Key{hash, kind});
  return it == slot_of_.end() ? -1 : it->second;
}

int HostStateTier::insert(CachedKind kind, const BlockHash& hash) {
  SSM_CHECK(lookup(kind, hash) < 0, "host state tier: the {} is held already", kind == CachedKind::Kv ? "KV page" : "state");
  int s = -1;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (pins_[static_cast<size_t>(*it)] == 0) {
        s = *it;
        lru_.erase(it);
        break;
      }
    if (s < 0) return -1;
    slot_of_.erase(key_of_[static_cast<size_t>(s)]);
  }
  const Key k{hash, kind};
  key_of_[static_cast<size_t>(s)] = k;
  used_[static_cast<size_t>(s)] = 1;
  slot_of_[k] = s;
  lru_pos_[static_cast<size_t>(s)] = lru_.insert(lru_.end(), s);
  return s;
}

void HostStateTier::touch(int slot) {
  if (slot < 0 || slot >= num_slots() || !used_[static_cast<size_t>(slot)]) return;
  lru_.splice(lru_.end(), lru_, lru_pos_[static_cast<size_t>(slot)]);
}

void HostStateTier::pin(int slot) {
  SSM_CHECK(slot >= 0 && slot < num_slots() && used_[static_cast<size_t>(slot)], "host state tier: pinning slot {}, which holds nothing",
            slot);
  ++pins_[static_cast<size_t>(slot)];
}

void HostStateTier::unpin(int slot) {
  SSM_CHECK(slot >= 0 && slot < num_slots() && pins_[static_cast<size_t>(slot)] > 0, "host state tier: unpinning slot {}, which is not pinned", slot);
  --pins_[static_cast<size_t>(slot)];
}

}  // namespace ssmserve
