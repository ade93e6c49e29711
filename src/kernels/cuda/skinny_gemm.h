// Owns the batch-invariant bf16 GEMM of the decode path ("skinny" GEMM): y[M, N] = x[M, K] W[N, K]^T with bf16
// operands on tensor cores (mma.sync m16n8k16, fp32 accumulation), built for small M (decode batches), where the
// step is bound by streaming W once from HBM: one warp per 16 rows of W and K-split, 16-byte loads, the split-K
// partial sums reduced in shared memory in a fixed order inside the block, then across the blocks of a tile in
// group order (no second launch).
//
// Batch invariance (issue 7): every output element y[m, n] is computed by the same sequence of operations for
// every M, every row m and every launch shape: K is cut into splits of whole 32-wide chunks (their number and
// their grouping into blocks come from skinny_default_tuning, a function of N and K only, and under
// KernelTuning::skinny_rules of the GPU's SM count); each split accumulates its chunks in increasing order with
// two mma steps per chunk (fixed k permutation inside the chunk), starting from 0; the split sums are added in
// split order inside a block, the block sums in group order.
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

/// Launch tuning of the skinny GEMM (speed only, never a result: every variant runs each split's chunks in the
/// same order). unroll: 32-wide k chunks of loads in flight per warp (2, 4 or 8); pipelined: the next chunks'
/// loads are issued before the current ones are multiplied; reg_cap: the 64-register cap (2 blocks of 512
/// threads per SM) of the first version. split_shift (the split count is skinny_gemm_splits times 2^shift) and
/// cta_splits (splits reduced inside one block, 4, 8 or 16; the block sums then in group order across blocks)
/// change the summation order and so the bits: they are chosen from (N, K) only, never per M.
struct SkinnyTuning {
  int unroll = 4;
  bool pipelined = false;
  bool reg_cap = true;
  int split_shift = 0;
  int cta_splits = 16;
  /// Launch shape from occupancy instead of unroll / pipelined / reg_cap (aligned decode rows only): the
  /// pipelined unroll-2 form when the grid fits in one wave of it, else plain unroll 4, both without the cap.
  /// Every form loads its first `unroll` chunks of W into registers before the PDL wait (W does not depend on
  /// the previous kernel; x is read after it): mamba-2.8b batch-1 decode 397.4 vs 387.3 tokens/s with session 7's
  /// order (SSMSERVE_SKINNY_PRELOAD=0) in the same H200 run (docs/benchmarks.md, session 9).
  bool auto_shape = false;
};

/// The tuning skinny_gemm uses for M rows of an N x K weight (measured per shape class on the H200; the split rule of
/// KernelTuning::skinny_split_rule, every split of a tile in one block, on an H100).
SkinnyTuning skinny_default_tuning(int64_t M, int64_t N, int64_t K);

/// The dense MLP's activation applied in the epilogue instead of writing y (model/ffns/mlp_ffn.h's math,
/// common.cuh mlp_act_value: the same expression on the same fp32 sums as mlp_activation over a written y, so the
/// same bits). kSiluGatedInterleaved8: W's rows are gate and up interleaved in groups of 8 (rows 16i .. 16i + 7 =
/// gate rows 8i .. 8i + 7, rows 16i + 8 .. 16i + 15 = the same up rows; N = 2I, N % 16 == 0), so one lane holds
/// a channel's gate and up sums: out[m, c] = silu(gate) * up for c in [0, N / 2). kRelu2: out[m, n] = relu(y)^2.
enum class SkinnyAct { kNone, kSiluGatedInterleaved8, kRelu2 };
struct SkinnyActEpilogue {
  SkinnyAct act = SkinnyAct::kNone;
  void* out = nullptr;          ///< [M, N / 2] (gated) or [M, N], row stride out_stride, in out_dtype
  int64_t out_stride = 0;
  DType out_dtype = DType::BF16;  ///< BF16 or F32
};

/// Optional parts of a skinny_gemm call.
struct SkinnyExtras {
  const SkinnyTuning* tuning = nullptr;      ///< overrides skinny_default_tuning (benchmarks)
  SkinnyActEpilogue act;                     ///< the MLP activation in the epilogue (y is then not written)
};

/// The base K split count for a weight of N rows and K columns (a power of two in [1, 64]; depends on N and K
/// only): enough warps to keep HBM busy, at least 4 chunks of 32 per split (2 beyond 16 splits). The tuning
/// scales it (split_shift) and reduces up to cta_splits of them inside one block; with more, each group is one
/// block and the last block of a tile to finish adds the group sums in group order (global workspace + arrival
/// counters). Benchmark knobs (environment, read once): SSMSERVE_SKINNY_TUNE="unroll,pipelined,reg_cap,cta_splits",
/// SSMSERVE_SKINNY_PREFETCH_MB (the pre-wait L2 prefetch, default 4), SSMSERVE_SKINNY_LATE_TRIGGER=1 (PDL
/// trigger after the main loop: measured no faster), SSMSERVE_SKINNY_PRELOAD=0 (W's first chunks loaded after the
/// PDL wait and only prefetched into L2 before it, as before session 8).
int skinny_gemm_splits(int64_t N, int64_t K);

/// skinny_gemm_splits(N, K) scaled by 2^split_shift (clamped to [1, 64]; SkinnyTuning::split_shift).
int skinny_gemm_splits(int64_t N, int64_t K, int split_shift);

/// Tuning for rows [r0, r0 + rows) of an N_whole x K weight run as their own GEMM (e.g. in_proj cut between two
/// graph branches) so that every output element is summed exactly as the whole GEMM sums it: the whole weight's
/// default split count (split_shift adjusted for the part's row count) and block splits. Any rows >= 1.
SkinnyTuning skinny_part_tuning(int64_t M, int64_t rows, int64_t N_whole, int64_t K);

/// Workspace bytes skinny_gemm needs for (M, N, K) (0 when the splits fit in one block), and in *counter_bytes
/// the bytes of its arrival counters (zeroed once by the caller; every launch leaves them zero again).
/// tuning: the call's override (SkinnyExtras::tuning), or nullptr for skinny_default_tuning.
size_t skinny_gemm_workspace(int64_t M, int64_t N, int64_t K, size_t* counter_bytes = nullptr,
                             const SkinnyTuning* tuning = nullptr);

/// Enqueues y = x W^T. a.ab_dtype must be BF16 (x and w bf16); a.y_dtype F32 or BF16. Optional y2: a second,
/// bf16 copy of y ([M, N], row stride y2_stride >= N) written by the same epilogue (the next GEMM's input), or
/// nullptr. Any M >= 0, N >= 1, K >= 1, any strides (16-byte loads when the rows and pointers allow them, scalar
/// loads otherwise: same arithmetic). pdl: launch with Programmatic Dependent Launch (see pdl.cuh).
/// workspace / counters: device buffers of skinny_gemm_workspace's sizes (may be null when those are 0).
/// extras: a tuning override (benchmarks); an activation epilogue (SkinnyActEpilogue: y2 must be null; y is not
/// written and may be null).
cudaError_t skinny_gemm(const GemmArgs& a, void* y2, int64_t y2_stride, bool pdl, cudaStream_t stream,
                        void* workspace = nullptr, size_t workspace_bytes = 0, unsigned* counters = nullptr,
                        const SkinnyExtras& extras = {});

}  // namespace ssmserve::cuda
