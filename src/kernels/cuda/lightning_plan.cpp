// Owns the host-side block plan of the GPU lightning prefill (see lightning.h).
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/lightning.h"

namespace ssmserve::cuda {

LightningPlan LightningPlan::build(std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                                   int block_size) {
  SSM_CHECK(block_size > 0, "lightning plan: block_size {} must be positive", block_size);
  SSM_CHECK(!query_start_loc.empty() && query_start_loc.size() == num_computed.size() + 1,
            "lightning plan: query_start_loc has {} entries for {} sequences", query_start_loc.size(),
            num_computed.size());
  LightningPlan p;
  p.num_seqs = static_cast<int>(num_computed.size());
  p.seq_first_block.push_back(0);
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
      t += m;
    }
    p.seq_first_block.push_back(static_cast<int32_t>(p.blocks.size() / 3));
  }
  p.num_blocks = static_cast<int>(p.blocks.size() / 3);
  p.num_qtiles = static_cast<int>(p.qtiles.size() / 2);
  return p;
}

}  // namespace ssmserve::cuda
