// Owns the bulk-copy form of the skinny GEMM (skinny_gemm.h): the same y = x W^T with the same summation order
// (so the same bits), for decode rows (M <= 8), with W streamed into shared memory by the copy engine
// (cp.async.bulk global -> shared, completing on mbarriers, a ring of stages) instead of per-lane register loads.
// One block per SM: a producer warp issues the copies of the block's work items (tile of 16 W rows x one split
// group's k range) in order, the first ring's worth before the PDL wait (weights do not depend on the previous
// kernel), and one consumer warp per ring stage multiplies a whole item from shared memory.
//
// Why (issue 7, batch-1 decode): the register-load form keeps ~40 KB in flight per SM and starts loading only
// after its PDL wait; a 26 MB projection then runs at ~2.4-2.8 TB/s against the 4.28 TB/s copy roofline. Whole
// 16-row slabs in flight per SM, issued while the predecessor still runs, target the ramp-up.
//
// Internal to the skinny GEMM: skinny_gemm() decides when this form applies (skinny_bulk_eligible) and fills
// the parameters from the same split plan (skinny_gemm.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ssmserve::cuda::detail {

/// The plan of one bulk skinny GEMM: pointers (device), sizes, strides (elements) and the split plan that fixes
/// the summation order (see skinny_gemm.h: chunks of 32 k, `cps` chunks per split, `cta_splits` splits summed in
/// split order per group, `groups` group sums added in group order by the last block of a tile to finish).
struct BulkParams {
  const void* x;  ///< [M, xs] bf16
  int64_t xs;
  const void* w;  ///< [N, ws] bf16
  int64_t ws;
  void* y;  ///< [M, ys] fp32 or bf16
  int64_t ys;
  bool y_bf16;
  void* y2;  ///< optional [M, y2s] bf16 copy of y
  int64_t y2s;
  int M, N, K;
  int chunks, cps, cta_splits, groups, tiles;
  float* partials;     ///< groups > 1: [tiles, groups, 4, 32] group sums
  unsigned* counters;  ///< groups > 1: [tiles] arrivals, zero between launches
};

/// Whether the bulk form takes this plan: M <= 8, K % 8 == 0, 16-byte aligned x / w rows, at least two ring stages
/// in the shared-memory budget, cta_splits in {1, 2, 4, 8, 16}.
bool skinny_bulk_eligible(const BulkParams& p);

/// Enqueues the bulk skinny GEMM (grid: one block per SM, at most one per item). pdl: see pdl.cuh.
cudaError_t skinny_bulk_launch(const BulkParams& p, bool pdl, cudaStream_t stream);

}  // namespace ssmserve::cuda::detail
