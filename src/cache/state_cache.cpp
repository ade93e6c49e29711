// Owns the recurrent state pool storage (see state_cache.h).
#include "cache/state_cache.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve {

StateCache::StateCache(int num_layers, StateShape shape, int num_blocks) : shape_(shape), num_blocks_(num_blocks) {
  SSM_CHECK(num_blocks >= 2, "StateCache: need at least 2 blocks (block 0 is the null block), got {}", num_blocks);
  for (int l = 0; l < num_layers; ++l) {
    conv_.emplace_back(static_cast<size_t>(shape.conv_elems * num_blocks), 0.0f);
    ssm_.emplace_back(static_cast<size_t>(shape.ssm_elems * num_blocks), 0.0f);
  }
}

void StateCache::zero_block(int block) {
  SSM_CHECK(block >= 0 && block < num_blocks_, "StateCache: block {} out of range", block);
  for (auto& c : conv_) std::fill_n(c.begin() + block * shape_.conv_elems, shape_.conv_elems, 0.0f);
  for (auto& s : ssm_) std::fill_n(s.begin() + block * shape_.ssm_elems, shape_.ssm_elems, 0.0f);
}

int64_t StateCache::bytes_per_block() const {
  return static_cast<int64_t>(conv_.size()) * (shape_.conv_elems + shape_.ssm_elems) * 4;
}

}  // namespace ssmserve
