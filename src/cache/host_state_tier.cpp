// Owns the host tier's slot bookkeeping (see host_state_tier.h).
#include "cache/host_state_tier.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve {

HostStateTier::HostStateTier(int num_slots)
    : hash_of_(static_cast<size_t>(std::max(0, num_slots))),
      used_(hash_of_.size(), 0),
      pins_(hash_of_.size(), 0),
      lru_pos_(hash_of_.size()) {
  for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

int HostStateTier::lookup(const BlockHash& hash) const {
  const auto it = slot_of_.find(hash);
  return it == slot_of_.end() ? -1 : it->second;
}

int HostStateTier::insert(const BlockHash& hash) {
  SSM_CHECK(lookup(hash) < 0, "host state tier: the state is held already");
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
    slot_of_.erase(hash_of_[static_cast<size_t>(s)]);
  }
  hash_of_[static_cast<size_t>(s)] = hash;
  used_[static_cast<size_t>(s)] = 1;
  slot_of_[hash] = s;
  lru_pos_[static_cast<size_t>(s)] = lru_.insert(lru_.end(), s);
  return s;
}

void HostStateTier::touch(int slot) {
  if (slot < 0 || slot >= num_slots() || !used_[static_cast<size_t>(slot)]) return;
  lru_.splice(lru_.end(), lru_, lru_pos_[static_cast<size_t>(slot)]);
}

void HostStateTier::pin(int slot) {
  SSM_CHECK(slot >= 0 && slot < num_slots() && used_[static_cast<size_t>(slot)], "host state tier: pinning slot {}, which holds no state", slot);
  ++pins_[static_cast<size_t>(slot)];
}

void HostStateTier::unpin(int slot) {
  SSM_CHECK(slot >= 0 && slot < num_slots() && pins_[static_cast<size_t>(slot)] > 0, "host state tier: unpinning slot {}, which is not pinned", slot);
  --pins_[static_cast<size_t>(slot)];
}

}  // namespace ssmserve
