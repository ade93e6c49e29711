// Owns the free list of state blocks. Block 0 is the null block and is never handed out
// (vllm-ssm-design.md §3.2).
#pragma once
#include <vector>

#include "core/error.h"

namespace ssmserve {

/// Hands out block ids in [1, num_blocks). LIFO reuse; the caller zeroes a block before first use.
class BlockPool {
 public:
  explicit BlockPool(int num_blocks) : num_blocks_(num_blocks) {
    SSM_CHECK(num_blocks >= 2, "BlockPool: need at least 2 blocks (block 0 is the null block), got {}", num_blocks);
    for (int b = num_blocks - 1; b >= 1; --b) free_.push_back(b);
  }
  /// A free block id, or 0 when none is free.
  int allocate() {
    if (free_.empty()) return 0;
    const int b = free_.back();
    free_.pop_back();
    return b;
  }
  /// Returns `block` to the pool; 0 is ignored. Throws Error on an id out of range.
  void free(int block) {
    if (block == 0) return;
    SSM_CHECK(block > 0 && block < num_blocks_, "BlockPool: freeing block {} out of range", block);
    free_.push_back(block);
  }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_blocks() const { return num_blocks_; }

 private:
  int num_blocks_;
  std::vector<int> free_;
};

}  // namespace ssmserve
