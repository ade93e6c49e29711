// Owns the random prefill rows of the batch-invariant (sequential) prefill tests (test_cuda_gated_delta_ops.cpp,
// test_cuda_minimax_ops.cpp): lengths 1..max_len, some rows continuing from an initial state (num_computed > 0),
// one null row, "all"-mode state stores at random offsets, and the per-step gather that feeds the same tokens one at
// a time through a decode kernel.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/state_stores.h"

namespace ssmserve::cudatest {

/// A packed prefill step of `n` rows: row s owns tokens [qsl[s], qsl[s+1]) and state block idx[s] (s + 1; 0 for the
/// null row), continues from it when nc[s] > 0; its stores are [store_start[s], store_start[s+1]) (offsets strictly
/// increasing inside (0, length), blocks after the rows' blocks).
struct SeqRows {
  std::vector<int32_t> qsl{0}, nc, idx, store_start{0}, store_offset, store_block, store_row;
  int n() const { return static_cast<int>(idx.size()); }
  int64_t T() const { return qsl.back(); }
  int len(int s) const { return qsl[s + 1] - qsl[s]; }
  int max_len() const {
    int m = 0;
    for (int s = 0; s < n(); ++s) m = std::max(m, len(s));
    return m;
  }
  /// Blocks the pool needs: null block, the rows' blocks, the store blocks.
  int num_blocks() const { return n() + 1 + static_cast<int>(store_block.size()); }

  /// Row 0 has one token, row 1 max_len tokens, the others random lengths; every other row continues from its state
  /// (num_computed a random 1..999, off any chunk grid); row null_at is the null row; rows with >= 2 tokens get 0..3
  /// stores (when with_stores), the first row with >= 2 tokens always one at offset 1.
  static SeqRows random(std::mt19937& rng, int rows, int max_len, int null_at, bool with_stores) {
    SeqRows r;
    std::uniform_int_distribution<int> len_d(1, max_len), nc_d(1, 999), ns_d(0, 3);
    bool first_store = true;
    for (int s = 0; s < rows; ++s) {
      const int len = s == 0 ? 1 : s == 1 ? max_len : len_d(rng);
      r.qsl.push_back(r.qsl.back() + len);
      r.nc.push_back(s % 2 == 1 ? nc_d(rng) : 0);
      r.idx.push_back(s == null_at ? 0 : s + 1);
    }
    int next_block = rows + 1;
    for (int s = 0; s < rows; ++s) {
      const int len = r.len(s);
      std::vector<int32_t> offs;
      if (with_stores && len >= 2 && r.idx[s] != 0) {
        const int ns = first_store ? 1 : std::min(ns_d(rng), len - 1);
        std::uniform_int_distribution<int> off_d(1, len - 1);
        while (static_cast<int>(offs.size()) < ns) {
          const int o = first_store ? 1 : off_d(rng);
          if (std::find(offs.begin(), offs.end(), o) == offs.end()) offs.push_back(o);
        }
        first_store = false;
        std::sort(offs.begin(), offs.end());
      }
      for (int32_t o : offs) {
        r.store_offset.push_back(o), r.store_block.push_back(next_block++), r.store_row.push_back(s);
      }
      r.store_start.push_back(static_cast<int32_t>(r.store_offset.size()));
    }
    return r;
  }
};

/// SeqRows' metadata and stores on the device.
struct DevSeqRows {
  cuda::DeviceBuffer qsl, nc, idx, start, offset, block, row;
  explicit DevSeqRows(const SeqRows& r)
      : qsl(cuda::to_device(r.qsl)), nc(cuda::to_device(r.nc)), idx(cuda::to_device(r.idx)),
        start(cuda::to_device(r.store_start)) {
    if (!r.store_offset.empty())
      offset = cuda::to_device(r.store_offset), block = cuda::to_device(r.store_block),
      row = cuda::to_device(r.store_row);
  }
  cuda::DevStateStores stores(const SeqRows& r) const {
    cuda::DevStateStores s;
    s.num = static_cast<int>(r.store_offset.size());
    if (s.num == 0) return s;
    s.start = start.as<int32_t>(), s.offset = offset.as<int32_t>();
    s.block = block.as<int32_t>(), s.row = row.as<int32_t>();
    return s;
  }
};

/// Step t of the token-at-a-time walk: the rows with more than t tokens (in row order) and their token rows.
struct DecodeStep {
  std::vector<int> rows;
  std::vector<int64_t> tokens;
  std::vector<int32_t> blocks;
  DecodeStep(const SeqRows& r, int t) {
    for (int s = 0; s < r.n(); ++s)
      if (t < r.len(s)) rows.push_back(s), tokens.push_back(r.qsl[s] + t), blocks.push_back(r.idx[s]);
  }
  int size() const { return static_cast<int>(rows.size()); }
  /// Rows tokens[i] of x (row stride `stride`) packed into [size(), stride].
  std::vector<float> gather(const std::vector<float>& x, int64_t stride) const {
    std::vector<float> g(std::max<size_t>(1, tokens.size() * stride));
    for (size_t i = 0; i < tokens.size(); ++i)
      std::copy(x.begin() + tokens[i] * stride, x.begin() + (tokens[i] + 1) * stride, g.begin() + i * stride);
    return g;
  }
};

}  // namespace ssmserve::cudatest
