// Owns the host-side block plan of the GPU lightning prefill (see lightning.h).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/lightning.h"

namespace ssmserve::cuda {

LightningPlan LightningPlan::build(std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                                   int block_size, int blocks_per_range, std::span<const int32_t> store_start,
                                   std::span<const int32_t> store_offset, std::span<const int32_t> store_block) {
  SSM_CHECK(block_size > 0, "lightning plan: block_size {} must be positive", block_size);
  SSM_CHECK(blocks_per_range >= 1 && blocks_per_range <= kMaxBlocksPerRange,
            "lightning plan: blocks_per_range {} outside 1..{}", blocks_per_range, kMaxBlocksPerRange);
  SSM_CHECK(!query_start_loc.empty() && query_start_loc.size() == num_computed.size() + 1,
            "lightning plan: query_start_loc has {} entries for {} sequences", query_start_loc.size(),
            num_computed.size());
  const bool stores = !store_start.empty() && !store_offset.empty();
  if (stores)
    SSM_CHECK(store_start.size() == query_start_loc.size() && store_offset.size() == store_block.size() &&
                  store_start.front() == 0 && store_start.back() == static_cast<int32_t>(store_offset.size()),
              "lightning plan: state stores (start {} entries, {} offsets, {} blocks) do not match {} sequences",
              store_start.size(), store_offset.size(), store_block.size(), num_computed.size());
  LightningPlan p;
  p.num_seqs = static_cast<int>(num_computed.size());
  p.seq_first_block.push_back(0);
  p.seq_first_range.push_back(0);
  for (int s = 0; s < p.num_seqs; ++s) {
    const int32_t t0 = query_start_loc[s], n = query_start_loc[s + 1] - t0, c = num_computed[s];
    SSM_CHECK(n >= 0 && c >= 0 && t0 >= 0, "lightning plan: sequence {} is malformed (start {}, length {}, computed {})",
              s, t0, n, c);
    int32_t si = stores ? store_start[s] : 0;
    const int32_t se = stores ? store_start[s + 1] : 0;
    SSM_CHECK(si <= se, "lightning plan: state stores of sequence {} are malformed", s);
    for (int32_t i = si, prev = 0; i < se; prev = store_offset[i++])
      SSM_CHECK(store_offset[i] > prev && store_offset[i] < n && store_block[i] >= 1,
                "lightning plan: state store {} of sequence {} (offset {}, block {}) is not increasing inside its {} "
                "tokens",
                i, s, store_offset[i], store_block[i], n);
    int32_t t = 0;
    bool range_ends = true;  // the next block starts a range (sequence start, a full range, a store)
    while (t < n) {
      const int64_t pos = static_cast<int64_t>(c) + t;
      int32_t m = static_cast<int32_t>(std::min<int64_t>(block_size - pos % block_size, n - t));
      if (si < se) m = std::min(m, store_offset[si] - t);  // a store cuts the block (store_offset[si] > t)
      const int32_t stored = si < se && store_offset[si] == t + m ? store_block[si++] : 0;
      const int32_t b = static_cast<int32_t>(p.blocks.size() / 3);
      p.blocks.insert(p.blocks.end(), {t0 + t, m, s});
      for (int32_t r = 0; r < m; r += 64) p.qtiles.insert(p.qtiles.end(), {b, r});
      if (range_ends) {
        p.ranges.insert(p.ranges.end(), {b, 0, 0});  // a new range
        if (stores) p.range_store.push_back(0);
      }
      const int32_t r = static_cast<int32_t>(p.ranges.size() / 3) - 1;
      p.block_range.insert(p.block_range.end(), {r, p.ranges[3 * r + 2]});
      p.ranges[3 * r + 1] += 1;
      p.ranges[3 * r + 2] += m;
      if (stores) {
        p.block_store.push_back(stored);
        if (stored != 0) p.range_store[r] = stored;
      }
      range_ends = stored != 0 || p.ranges[3 * r + 1] == blocks_per_range;
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
