// Owns the gated delta rule on the GPU (Gated DeltaNet, Qwen3.5 / Qwen3-Next linear attention), the CUDA
// counterpart of kernels/cpu/gated_delta.h with the same math, chunk grid, null-block rule and state layout
// (block b of the state view: [Hv, Dk, Dv], row = key dim, column = value dim), plus the fused input preparation
// the mixer runs before it (l2-normalised q / k, q / sqrt(Dk), the log decay g and the learning rate beta).
//
// Decode (gated_delta.cu): one block per (row, value head, slice of 16 or 32 value columns); every column of S
// evolves independently (S' = e^g S, u = beta (v - S'^T k), S = S' + k u^T, o = S^T q), so a block reads its
// [Dk, cols] slice of the state once (16-byte loads, a warp covering 4 rows x 128 contiguous bytes), reduces
// k^T S, q^T S and q.k over the key rows in the same pass, and writes the slice back:
//   o = e^g q^T S + u (q . k)     (= S_new^T q in real arithmetic).
// Memory-bound: Hv * Dk * Dv * 2 * sizeof(state) bytes per row.
//
// Prefill (gated_delta_prefill.cu): one block of 256 threads per (sequence, value head, 64-column tile of Dv)
// walks the sequence's chunks (sequence-aligned, as on the CPU) carrying its [Dk, 64] slice of the state in shared
// memory. Per chunk of m <= 64 tokens (c: chunk-local cumulative log decays in double):
//   X  = diag(beta) V - diag(beta e^c) K S                   (the right-hand side of (I + A) V~ = X)
//   A  = strictly lower (beta_i e^{c_i - c_j} k_i . k_j),  P = lower incl. diagonal (e^{c_i - c_j} q_i . k_j)
//   V~ = (I + A)^{-1} X                                      (forward substitution, one warp per 8 columns)
//   O  = diag(e^c) Q S + P V~
//   S <- e^{c_m} S + K^T diag(e^{c_m - c}) V~
// which is the CPU header's WY / UT form with W folded into X (V~ = U - W S). The five products are 64 x 64 tile
// products on the tensor cores (mma.sync m16n8k8 TF32, kernels/cuda/mma_tile.cuh): 3xTF32 (hi / lo splits, fp32
// accuracy) by default, one TF32 pass with GatedDeltaPrecision::kTf32.
//
// Batch-invariant mode (gated_delta_prefill_sequential): the prefill walks each sequence token by token through the
// decode kernel's per-token step (one __device__ function shared by both kernels), so prefill and decode give the
// same bits per token whatever the batch and the cut of the prompt into steps.
//
// gated_delta_prefill_two_pass (gated_delta_prefill_wy.cu) computes the state-independent part (A, T = (I + A)^-1,
// W = T diag(beta e^c) K, U = T diag(beta) V, P, the decay factors) chunk-parallel into a workspace first, so the
// walk does only W S, Q S, P V~ and K^T V~. Its default walk (issue 31, KernelTuning::gdn_walk 2) runs per
// (sequence, value head, 32-column tile) with every operand of a chunk copied into shared memory by cp.async while
// the previous part computes and the mma.sync fragments read straight from there (128 blocks for one sequence of
// the Qwen3.5 layer instead of 64; no per-slice staging or global-latency stalls in the chain of chunks).
//
// Measured on the H200 (tests/cuda/test_cuda_gated_delta_ops.cpp, bench/cuda_gated_delta.cpp), fp32 state:
//   errors vs the CPU kernel (norm-wise relative): decode <= 2.7e-7 (outputs), 1.2e-7 (states); prefill 3xTF32
//   <= 1.5e-6 (outputs, 700-token prompts, both paths) and <= 2.8e-7 (states), 1.7e-6 vs the double recurrence;
//   TF32 ~5e-4; bf16 states ~3e-5 (bf16 rounding of the stored state).
//   decode, Qwen3.5 layer (Hv 32, Dk = Dv 128): 4.5 us at batch 1, 44.6 us at 32, 343 us at 256 = 3.13 TB/s of
//   state traffic (65% of the 4.8 TB/s peak, ~73% of the ~4.3 TB/s a device copy reaches);
//   prefill, same layer, 1 x 32k tokens: fused 33.3 ms (3xTF32) / 28.1 ms (TF32), two-pass with the previous walk
//   (SSMSERVE_GDN_WALK=0) 24.7 / 20.8 ms (6.3 / 7.4 TFLOP/s of tile products); 8 x 4k: 15.4 / 13.0 ms. That walk
//   had only Hv x Dv / 64 = 64 blocks for a single sequence, summed each chunk's decays in one lane (64 dependent
//   global loads per chunk) and staged every 32-deep slice through registers from global memory. The shared-memory
//   walk (H200, session 26, bench/cuda_gated_delta.cpp): 1 x 32k 11.2 / 8.25 ms (13.8 / 18.7 TFLOP/s; pass 1 5.0 ms
//   of the 11.2, the walk 6.2), 1 x 2k 0.744 / 0.553 ms; outputs 3.1e-8 (relative) from the previous walk's.
//
// Framework-free: device pointers, sizes, row strides (elements), a stream; each returns the launch status
// (cudaErrorInvalidValue for unsupported or inconsistent sizes, before any launch).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/gated_delta.h"
#include "kernels/cuda/device_decode_rows.h"
#include "kernels/cuda/state_stores.h"

namespace ssmserve::cuda {

/// The CPU kernel's structs, with device pointers: q / k [T, Hk, Dk], v [T, Hv, Dv], g / beta [T, Hv] fp32 with
/// row strides in elements; params: Hk, Hv (a multiple of Hk), Dk, Dv, chunk_size and the state view (device
/// memory; F32, BF16 or F16 elements, block 0 = the null block, never read or written).
using GatedDeltaInputs = cpu::GatedDeltaInputs;
using GatedDeltaParams = cpu::GatedDeltaParams;

/// Arithmetic of the prefill's tile products.
enum class GatedDeltaPrecision {
  kFp32,  ///< 3xTF32 (hi / lo split operands): fp32 accuracy, ~3x the tensor-core work of kTf32
  kTf32,  ///< one TF32 pass per product (10-bit mantissas): ~1e-3 relative error, the fast path
};

/// True when gated_delta_decode supports these sizes: Dk in {32, 64, 128, 256}, Dv a multiple of 16, Hv a
/// multiple of Hk, state view 16-byte aligned with block_stride a multiple of 4 (any state dtype).
bool gated_delta_decode_supported(const GatedDeltaParams& p);
/// True when gated_delta_prefill supports these sizes: Dk a multiple of 4 in 4..128, Dv a multiple of 4 (any
/// value; tiles of 64 columns), chunk_size in 1..64, Hv a multiple of Hk (any state dtype).
bool gated_delta_prefill_supported(const GatedDeltaParams& p);

/// Decode over `batch` rows (device_decode_rows.h): a plain row (token r of `in`) advances state block
/// state_indices[r] by one token in place; a speculative verify row's tokens run one after another, token j
/// continuing from column j - 1's state and storing the state after it (rounded to the state dtype) into column j.
/// Null rows (block 0: padding) read and write no state and output zeros. out: [tokens, Hv, Dv] fp32 with row
/// stride out_stride (>= Hv * Dv). Inputs' row strides >= their row widths. batch_invariant: 16-column slices at
/// every batch size (by default large batches take 32-column slices, whose reduction over the key rows runs in
/// another order), so a row's bits do not depend on the batch; the slicing of gated_delta_prefill_sequential.
/// pdl: Programmatic Dependent Launch (pdl.cuh; the kernel waits on its predecessor in every block first, after
/// hinting the L2 to fetch its rows' state unless KernelTuning::decode_prewait is off).
/// Returns cudaErrorInvalidValue when !gated_delta_decode_supported(p) or a stride is too small.
cudaError_t gated_delta_decode(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                               DeviceDecodeRows rows, int batch, cudaStream_t stream, bool batch_invariant = false,
                               bool pdl = false);

/// Batch-invariant prefill (SSMSERVE_BATCH_INVARIANT): each sequence walks its tokens one by one with the decode
/// kernel's per-token arithmetic (the same __device__ step, 16-column slices as gated_delta_decode with
/// batch_invariant, the state rounded to the state dtype after every token as decode stores it), so a token's
/// outputs and states are bit-identical to feeding the tokens one at a time through gated_delta_decode, however the
/// prompt is cut into steps. Metadata as gated_delta_prefill (sequence s: tokens [query_start_loc[s],
/// query_start_loc[s+1]), starts from block state_indices[s] when num_computed[s] > 0, else zeros; block 0: null
/// row, outputs zero, no state I/O), writes the final states; stores: "all"-mode state stores (state_stores.h, rows
/// = sequences) at any offset: the state after the store's offset goes to its block. out: [T, Hv, Dv] fp32, row
/// stride out_stride (>= Hv * Dv), must not alias the inputs. Sizes: those of gated_delta_decode_supported.
/// Returns cudaErrorInvalidValue for unsupported sizes, short strides or missing arrays. Slower than the chunked
/// prefill on long prompts (one token after another, a sync-bound walk per token).
cudaError_t gated_delta_prefill_sequential(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                                           int64_t out_stride, const int32_t* query_start_loc,
                                           const int32_t* num_computed, const int32_t* state_indices, int num_seqs,
                                           cudaStream_t stream, const DevStateStores& stores = {});

/// Varlen prefill (tokens relative to `in`), the CPU kernel's metadata as device arrays: sequence s owns tokens
/// [query_start_loc[s], query_start_loc[s+1]) ([num_seqs + 1]), has num_computed[s] tokens already in its state
/// ([num_seqs]; 0: starts from zeros and the block is not read; chunk boundaries where (num_computed + i) %
/// chunk_size == 0) and keeps it in block state_indices[s] ([num_seqs]; 0: null row, outputs zero, no state I/O).
/// out: [T, Hv, Dv] fp32, row stride out_stride (>= Hv * Dv), must not alias the inputs. Writes the final states.
/// Returns cudaErrorInvalidValue when !gated_delta_prefill_supported(p) or a stride is too small.
cudaError_t gated_delta_prefill(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                                const int32_t* query_start_loc, const int32_t* num_computed,
                                const int32_t* state_indices, int num_seqs, cudaStream_t stream,
                                GatedDeltaPrecision precision = GatedDeltaPrecision::kFp32);

/// fp32 workspace elements gated_delta_prefill_two_pass needs for a step of num_tokens tokens in num_seqs
/// sequences: the chunk offsets, then per chunk (at most num_tokens / chunk_size + 2 num_seqs chunks) and value head
/// 64 (Dk + Dv + 66) floats (W, U, P and the chunk's decay factors: about 1.35 GB at 32k tokens, Hv = 32,
/// Dk = Dv = 128). 0 for negative sizes.
size_t gated_delta_prefill_workspace_floats(int64_t num_tokens, int num_seqs, const GatedDeltaParams& p);

/// The same prefill in two passes (gated_delta_prefill_wy.cu): 1. chunk-parallel over (chunk, value head), the
/// state-independent part of each chunk (A = K K^T terms, T = (I + A)^{-1}, W = T diag(beta e^c) K,
/// U = T diag(beta) V, P = decayed Q K^T) into `workspace`; 2. per (sequence, value head, 64-column tile) the walk
/// over the chunks with only the state products (V~ = U - W S, O = diag(e^c) Q S + P V~, S update). Arguments as
/// gated_delta_prefill, plus num_tokens (>= query_start_loc[num_seqs], sizes the first pass's grid) and workspace
/// (device, gated_delta_prefill_workspace_floats(num_tokens, num_seqs, p) floats, 16-byte aligned).
/// stores: prefix caching's "all"-mode state stores of the sequences (state_stores.h; rows = sequences): the state
/// after each store's offset is written into its block, rounded to the state dtype as the final state. Every store
/// offset must end a chunk (num_computed[s] + offset a multiple of chunk_size; the caller checks: a store elsewhere
/// is not written). cudaErrorInvalidValue when stores.num > 0 and an array is missing. The walk's form:
/// KernelTuning::gdn_walk (kernel_tuning.h; default: the shared-memory walk on 32-column tiles for Dk a multiple of
/// 32), read at every call; every form gives the same results up to rounding.
cudaError_t gated_delta_prefill_two_pass(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                                         int64_t out_stride, const int32_t* query_start_loc,
                                         const int32_t* num_computed, const int32_t* state_indices, int num_seqs,
                                         int64_t num_tokens, float* workspace, cudaStream_t stream,
                                         GatedDeltaPrecision precision = GatedDeltaPrecision::kFp32,
                                         const DevStateStores& stores = {});

/// Inputs of the fused preparation (device pointers, fp32, row strides in elements).
struct GatedDeltaPrepareArgs {
  const float* q = nullptr;        ///< [T, Hk, Dk] raw queries (after the conv)
  int64_t q_stride = 0;
  const float* k = nullptr;        ///< [T, Hk, Dk] raw keys
  int64_t k_stride = 0;
  const float* a = nullptr;        ///< [T, Hv] decay input (in_proj_a)
  int64_t a_stride = 0;
  const float* b = nullptr;        ///< [T, Hv] learning-rate input (in_proj_b)
  int64_t b_stride = 0;
  const float* A_log = nullptr;    ///< [Hv]
  const float* dt_bias = nullptr;  ///< [Hv]
  float* q_out = nullptr;          ///< [T, Hk, Dk] may equal q (in place)
  int64_t q_out_stride = 0;
  float* k_out = nullptr;          ///< [T, Hk, Dk] may equal k (in place)
  int64_t k_out_stride = 0;
  float* g = nullptr;              ///< [T, Hv]
  int64_t g_stride = 0;
  float* beta = nullptr;           ///< [T, Hv]
  int64_t beta_stride = 0;
};

/// Per token t and head (transformers' Qwen3NextGatedDeltaNet with use_qk_l2norm_in_kernel, all fp32):
///   q_out = q * rsqrt(sum(q^2) + 1e-6) / sqrt(Dk),   k_out = k * rsqrt(sum(k^2) + 1e-6)
///   g     = -exp(A_log) * softplus(a + dt_bias)        (softplus(x) = x > 20 ? x : log1p(exp(x)), as torch)
///   beta  = sigmoid(b)
/// One warp per (token, key head), which also computes the gates of that key head's Hv / Hk value heads.
/// pdl: Programmatic Dependent Launch (pdl.cuh; the kernel waits on its predecessor in every block first).
/// Returns cudaErrorInvalidValue for Dk outside 1..1024, Hv not a multiple of Hk, Hv / Hk > 32 or short strides.
cudaError_t gated_delta_prepare(const GatedDeltaPrepareArgs& args, int64_t num_tokens, int num_k_heads,
                                int num_v_heads, int head_k_dim, cudaStream_t stream, bool pdl = false);

}  // namespace ssmserve::cuda
