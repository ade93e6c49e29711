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

#include "kernels/cuda/causal_conv1d.h"
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

/// The tuning skinny_gemm uses for M rows of an N x K weight (measured per shape class on the H200).
SkinnyTuning skinny_default_tuning(int64_t M, int64_t N, int64_t K);

/// The elementwise operations an x operand can be computed with in the loads (SkinnyEwInput).
enum class SkinnyEwOp : int {
  kSiluMul,      ///< x = silu(a) * b: the gated MLP activation (mlp_activation: a = gate, b = up)
  kRelu2,        ///< x = relu(a)^2: the relu^2 MLP activation (mlp_activation; b unused)
  kSigmoidGate,  ///< x = a * sigmoid(b): the attention output gate (sigmoid_gate: a = output, b = gate)
  kCopy,         ///< x = a: the cast to bf16 (cast_rows; b unused)
};

/// The x operand computed in the loads from fp32 rows a (and b), one element at a time with the arithmetic of the
/// kernel it replaces (common.cuh's mlp_act_value / sigmoid_gate_value), then rounded to bf16 to nearest even: that
/// kernel followed by skinny_gemm, bit for bit, in one launch. a, b: [M, K] fp32, row strides a_stride, b_stride
/// (elements). Decode rows only: see skinny_ew_input_serves.
struct SkinnyEwInput {
  const float* a = nullptr;  ///< null: x is read as given
  int64_t a_stride = 0;
  const float* b = nullptr;  ///< kSiluMul, kSigmoidGate
  int64_t b_stride = 0;
  SkinnyEwOp op = SkinnyEwOp::kCopy;
};

/// The Mamba-2 / DeltaNet gated RMSNorm fused into the out projection's x loads: each block first computes the
/// rms of its rows' groups exactly as gated_rms_norm's vectorized kernel does (gated_norm_vec.cuh: the same per-thread
/// runs and block_sum tree, emulated warp by warp), then x[m, k] = bf16(gated norm of y, z at k), the bits
/// gated_rms_norm_pdl writes: the product is bit-identical to the norm kernel followed by skinny_gemm.
/// y, z: [M, K] fp32 (row strides y_stride, z_stride); weight: [K] fp32; groups of group_size columns (K % group_size
/// == 0); norm_before_gate as gated_rms_norm. Decode rows only: see skinny_gated_norm_input_serves.
struct SkinnyGatedNormInput {
  const float* y = nullptr;  ///< null: x is read as given
  int64_t y_stride = 0;
  const float* z = nullptr;
  int64_t z_stride = 0;
  const float* weight = nullptr;
  float eps = 1e-5f;
  int64_t group_size = 0;
  bool norm_before_gate = false;
};

/// The Mamba-2 causal conv1d decode update fused into the input projection's epilogue: the thread that writes
/// y[m, col0 + c] (fp32) for a channel c < conv.dim also runs conv1d_update_dual's step for row m on that value
/// (conv_update_channel, decode_math.cuh: the window of state block state_indices[m] shifted in place, bias, taps,
/// SiLU) and writes the result to out[m, c]: the bits conv1d_update_dual writes for plain decode rows (one token and
/// one state block per row; rows whose block is 0 are padding and skipped). Rows >= rows are left alone.
struct SkinnyConvEpilogue {
  ConvParams conv;                         ///< conv.weight null: none
  int64_t col0 = 0;                        ///< y's column of channel 0
  const int32_t* state_indices = nullptr;  ///< [rows] int32 device: each row's state block
  int64_t rows = 0;
  float* out = nullptr;                    ///< [rows, conv.dim] fp32, row stride out_stride
  int64_t out_stride = 0;
};

/// Optional parts of a skinny_gemm call.
struct SkinnyExtras {
  const SkinnyTuning* tuning = nullptr;      ///< overrides skinny_default_tuning (benchmarks)
  SkinnyEwInput ew;                          ///< the elementwise input (a.x is then ignored and may be null)
  SkinnyGatedNormInput norm;                 ///< the gated-norm input (a.x ignored)
  SkinnyConvEpilogue conv;                   ///< the conv update epilogue (with a plain x only; one form per call)
  /// Launch without Programmatic Dependent Launch (the first kernel on a stream after a fork: its dependency is an
  /// event, not a kernel before it).
  bool plain_launch = false;
};


/// Whether skinny_gemm takes `e` for the GEMM `a`: 1 <= M <= 16, an fp32 y, the channels inside y's columns
/// (col0 >= 0, col0 + dim <= N), 1 <= rows <= M, width 1..8 (a state view unless width 1), an fp32 or bf16 conv
/// state, out_stride >= dim. Else the caller runs conv1d_update_dual after a plain GEMM.
bool skinny_conv_epilogue_serves(const GemmArgs& a, const SkinnyConvEpilogue& e);

/// Whether e holds exactly one fused form (ew, norm or conv) and skinny_gemm serves it for `a` (its *_serves above).
bool skinny_fused_form_serves(const GemmArgs& a, const SkinnyExtras& e);

/// Whether skinny_gemm takes `n` for the GEMM `a`: 1 <= M <= 16, K % 8 == 0, 16-byte aligned weight rows, group_size
/// a multiple of 8 dividing K, at most 128 (row, group) pairs per block (min(M, 16) x K / group_size), and y / z /
/// weight laid out for gated_rms_norm's vectorized kernel (gated_norm_vec_plan). Else the caller runs the norm kernel
/// and a plain GEMM.
bool skinny_gated_norm_input_serves(const GemmArgs& a, const SkinnyGatedNormInput& n);

/// Whether skinny_gemm takes `in` for the GEMM `a` (bf16 weight, x from in): 1 <= M <= 16, K % 8 == 0, the weight
/// rows and the a (and, for kSiluMul / kSigmoidGate, b) rows 16-byte aligned (16-byte loads), strides >= K. Else the
/// caller runs the elementwise kernel and a plain GEMM.
bool skinny_ew_input_serves(const GemmArgs& a, const SkinnyEwInput& in);

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
/// extras: a tuning override (benchmarks).
cudaError_t skinny_gemm(const GemmArgs& a, void* y2, int64_t y2_stride, bool pdl, cudaStream_t stream,
                        void* workspace = nullptr, size_t workspace_bytes = 0, unsigned* counters = nullptr,
                        const SkinnyExtras& extras = {});

}  // namespace ssmserve::cuda
