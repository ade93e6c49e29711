// Owns the host-side block plan of the GPU lightning prefill (see lightning.h).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/lightning.h"

namespace ssmserve::cuda {

LightningPlan LightningPlan::build(std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                                   int block_size, int blocks_per_range) {
  SSM_CHECK(block_size > 0, "lightning plan: block_size {} must be positive", block_size);
  SSM_CHECK(blocks_per_range >= 1 && blocks_per_range <= kMaxBlocksPerRange,
            "lightning plan: blocks_per_range {} outside 1..{}", blocks_per_range, kMaxBlocksPerRange);
  SSM_CHECK(!query_start_loc.empty() && query_start_loc.size() == num_computed.size() + 1,
            "lightning plan: query_start_loc has {} entries for {} sequences", query_start_loc.size(),
            num_computed.size());
  LightningPlan p;
  p.num_seqs = static_cast<int>(num_computed.size());
  p.seq_first_block.push_back(0);
  p.seq_first_range.push_back(0);
  for (int s = 0; s < p.num_seqs; ++s) {
    const int32_t t0 = query_start_loc[s], n = query_start_loc[s + 1] - t0, c = num_computed[s];
    SSM_CHECK(n >= 0 && c >= 0 && t0 >= 0, "lightning plan: sequence {} is malformed (start {}, length {}, computed {})",
              s, t0, n, c);
    int32_t t = 0;
    while (t < n) {
      const int64_t pos = static_cast<int64_t>(c) + t;
      const int32_t m = static_cast<int32_t>(std::min<int64_t>(block_size - pos % block_size, n - t));
      const int32_t b = static_cast<int32_t>(p.blocks.size() / 3);
      p.blocks.insert(p.blocks.end(), {t0 + t, m, s});
      for (int32_t r = 0; r < m; r += 64) p.qtiles.insert(p.qtiles.end(), {b, r});
      const int32_t sb = p.seq_first_block.back();
      if ((b - sb) % blocks_per_range == 0) p.ranges.insert(p.ranges.end(), {b, 0, 0});  // a new range
      const int32_t r = static_cast<int32_t>(p.ranges.size() / 3) - 1;
      p.block_range.insert(p.block_range.end(), {r, p.ranges[3 * r + 2]});
      p.ranges[3 * r + 1] += 1;
      p.ranges[3 * r + 2] += m;
      t += m;
    }
    p.seq_first_block.push_back(static_cast<int32_t>(p.blocks.size() / 3));
    p.seq_first_range.push_back(static_cast<int32_t>(p.ranges.size() / 3));
  }
  p.num_blocks = static_cast<int>(p.blocks.size() / 3);
  p.num_qtiles = static_cast<int>(p.qtiles.size() / 2);
  p.num_ranges = static_cast<int>(p.ranges.size() / 3);
  return p;
}

int LightningPlan::pick_blocks_per_range(int64_t num_tokens, int block_size, int num_heads) {
  if (block_size <= 0 || num_heads <= 0 || num_tokens <= 0) return 1;
  const int64_t blocks = (num_tokens + block_size - 1) / block_size;
  return static_cast<int>(std::clamp<int64_t>(blocks * num_heads / 128, 1, kMaxBlocksPerRange));
}

}  // namespace ssmserve::cuda
