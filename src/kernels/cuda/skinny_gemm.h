// Owns the batch-invariant bf16 GEMM of the decode path ("skinny" GEMM): y[M, N] = x[M, K] W[N, K]^T with bf16
// operands on tensor cores (mma.sync m16n8k16, fp32 accumulation), built for small M (decode batches), where the
// step is bound by streaming W once from HBM: one warp per 16 rows of W and K-split, 16-byte loads, the split-K
// partial sums reduced in shared memory in a fixed order inside the block (no second launch).
//
// Batch invariance (issue 7): every output element y[m, n] is computed by the same sequence of operations for
// every M, every row m and every launch shape: K is cut into `skinny_gemm_splits(N, K)` splits of whole 32-wide
// chunks (a function of N and K only); each split accumulates its chunks in increasing order with two mma steps
// per chunk (fixed k permutation inside the chunk), starting from 0; the split sums are added in split order.
// Rows beyond M and columns beyond K are zeros and never change a result. So a request's projections are
// bit-identical whatever batch it is decoded in (cuBLASLt picks M-dependent algorithms and is not).
//
// Framework-free: device pointers, sizes, row strides (elements), a stream; returns the launch status
// (cudaErrorInvalidValue for bad sizes / dtypes). Reference: kernels/cpu/linear.h (same math, fp32 accumulation).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gemm.h"

namespace ssmserve::cuda {

/// K splits the skinny GEMM uses for a weight of N rows and K columns (a power of two in [1, 64]; depends on N
/// and K only): enough warps to keep HBM busy, at least 4 chunks of 32 per split (2 beyond 16 splits). Up to 16
/// splits are reduced inside one block; beyond, each group of 16 is one block and the last block of a tile to
/// finish adds the group sums in group order (global workspace + arrival counters).
int skinny_gemm_splits(int64_t N, int64_t K);

/// Workspace bytes skinny_gemm needs for (M, N, K) (0 when the splits fit in one block), and in *counter_bytes
/// the bytes of its arrival counters (zeroed once by the caller; every launch leaves them zero again).
size_t skinny_gemm_workspace(int64_t M, int64_t N, int64_t K, size_t* counter_bytes = nullptr);

/// Enqueues y = x W^T. a.ab_dtype must be BF16 (x and w bf16); a.y_dtype F32 or BF16. Optional y2: a second,
/// bf16 copy of y ([M, N], row stride y2_stride >= N) written by the same epilogue (the next GEMM's input), or
/// nullptr. Any M >= 0, N >= 1, K >= 1, any strides (16-byte loads when the rows and pointers allow them, scalar
/// loads otherwise: same arithmetic). pdl: launch with Programmatic Dependent Launch (see pdl.cuh).
/// workspace / counters: device buffers of skinny_gemm_workspace's sizes (may be null when those are 0).
cudaError_t skinny_gemm(const GemmArgs& a, void* y2, int64_t y2_stride, bool pdl, cudaStream_t stream,
                        void* workspace = nullptr, size_t workspace_bytes = 0, unsigned* counters = nullptr);

}  // namespace ssmserve::cuda
