// Owns lightning attention on the GPU (MiniMax-01's linear attention with per-head exponential decay), the CUDA
// counterpart of kernels/cpu/lightning.h with the same math and block grid: per head h with slope s,
//   S_t = e^{-s} S_{t-1} + k_t^T v_t,   o_t = q_t S_t      (S: [D, D] fp32, row = key dim, column = value dim)
// computed blockwise over blocks of `block_size` tokens counted from the sequence start (a continued prefill's
// first block ends on the same grid boundary as an unsplit one), with i, j block-local and S the state carried in:
//   o_i = e^{-s(i+1)} q_i S + sum_{j<=i} e^{-s(i-j)} (q_i . k_j) v_j          (exact query decay, not vLLM's e^{-s i})
//   S  <- e^{-s m} S + sum_j e^{-s(m-1-j)} k_j^T v_j
// Decay factors e^{-s k} are evaluated in double and rounded to fp32, as on the CPU.
//
// Prefill is three launches over a packed varlen batch (no per-sequence host loop; the host only builds the
// block plan, O(blocks)):
//   1. block KV: per (block, head) KV_b = sum_j e^{-s(m-1-j)} k_j^T v_j on tensor cores;
//   2. state passing: per (sequence, head) S_b (state entering block b) = scan of KV_b from the initial state,
//      stored as bf16 hi + lo parts for step 3; the final state is written to the state pool;
//   3. output: per (64-query tile, head) o = e^{-s(i+1)} q S_b + (Q K^T (.) decay) V on tensor cores.
// Tensor-core operands are bf16 with fp32 accumulation. q, k, v are rounded to bf16 when loaded (exact when the
// caller's activations are already bf16-valued); operands that are not bf16-valued by construction (the decayed
// scores, the decayed keys, the fp32 state) are split into hi + lo bf16 parts, so the products keep ~16 mantissa
// bits and the result tracks the fp32 recurrence to ~1e-5 relative.
// The bf16 fast path (lightning_prefill_bf16, lightning_bf16.cu) runs the same math on bf16 activations with
// one bf16 operand per product (mma.sync m16n8k16, cp.async pipelines, fp32 state accumulation) and passes state
// over ranges of blocks: 1. per (range, head) one CTA walks the range's blocks, carrying the range-local state
// L_b (zero at the range start) in fp32 accumulators, storing it per block as bf16 and the range's aggregate in
// fp32; 2. per (sequence, head) the ranges' entering states S_r are scanned (fp32), the final state stored and
// each block's S_b = e^{-s (tokens since the range start)} S_r + L_b written as bf16; 3. output from S_b. By default
// (SSMSERVE_LIGHTNING_WALK unset or not 0) steps 2b and 3 are one range walk instead: per (range, head) one CTA
// carries the fp32 state from S_r through the range in 64-token chunks (o = decayed q S + the chunk's causal part,
// then S <- decayed S + the chunk's k^T v), so no per-block state goes through memory and step 1 stores none; for
// head_dim 128 the walk and step 1 run on sm_90a warpgroups (wgmma: one warpgroup for the outputs, one for the
// state; SSMSERVE_LIGHTNING_WALK=1 keeps the mma.sync walk, SSMSERVE_LIGHTNING_KV_WG=0 the mma.sync step 1). The runner uses it with bf16 weights, the fp32-exact path
// with fp32 weights.
// Batch-invariant mode (lightning_prefill_sequential): the prefill walks each sequence token by token through the
// decode kernel's per-token steps (shared __device__ functions), so prefill and decode give the same bits per token.
// Framework-free: device pointers, sizes, row strides (elements), a stream; each returns the launch status
// (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cache/state_view.h"
#include "kernels/cuda/device_decode_rows.h"

namespace ssmserve::cuda {

/// One lightning layer's sizes, parameters (device) and state pool.
struct LightningDevParams {
  int num_heads = 0;              ///< H
  int head_dim = 0;               ///< D: 64 or 128
  int block_size = 256;           ///< tokens per intra-block, 1..1024
  const float* slopes = nullptr;  ///< [H] decay rates s_h >= 0 (device)
  StateView states;               ///< block b: [H, D, D] F32/BF16/F16; block 0 = null (skipped)
};

/// The prefill's block plan, built on the host from the step's metadata (LinearAttentionMetadata's
/// query_start_loc and num_computed_tokens). A block never spans two sequences; a sequence's blocks end on
/// multiples of block_size in sequence positions.
struct LightningPlan {
  int num_seqs = 0;
  int num_blocks = 0;
  int num_qtiles = 0;                   ///< 64-query tiles over all blocks
  std::vector<int32_t> blocks;          ///< [num_blocks, 3] first token row, length m, sequence
  std::vector<int32_t> seq_first_block; ///< [num_seqs + 1]
  std::vector<int32_t> qtiles;          ///< [num_qtiles, 2] block, first row within the block (multiple of 64)
  /// Ranges (the bf16 path's unit of state passing): runs of up to blocks_per_range consecutive blocks of one
  /// sequence. The bf16 path computes each range's blocks' states relative to the range start in one CTA and
  /// scans only the ranges, so fewer per-block states go through memory.
  int num_ranges = 0;
  std::vector<int32_t> ranges;           ///< [num_ranges, 3] first block, number of blocks, tokens
  std::vector<int32_t> seq_first_range;  ///< [num_seqs + 1]
  std::vector<int32_t> block_range;      ///< [num_blocks, 2] range, tokens from the range's first token to the block's
  /// Prefix caching's "all"-mode stores (empty without stores): the cached block the state after block b / range r
  /// is also written into (0: none). A store cuts its row's block there (as the CPU runs the row in pieces cut at
  /// its stores) and ends the block's range, so the state passing kernels hold the state at every store.
  std::vector<int32_t> block_store;      ///< [num_blocks]
  std::vector<int32_t> range_store;      ///< [num_ranges]
  /// Throws Error on malformed spans (sizes disagree, negative lengths / computed counts, block_size <= 0,
  /// blocks_per_range outside 1..kMaxBlocksPerRange, stores not strictly increasing inside (0, row length) or
  /// store blocks < 1). Stores (MambaBatchMetadata::state_store_*_p of the same rows): store_start
  /// [num_seqs + 1] (empty: no stores), store_offset / store_block [stores]: after store_offset[i] tokens of its row
  /// the state goes to block store_block[i].
  static LightningPlan build(std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                             int block_size, int blocks_per_range = 1, std::span<const int32_t> store_start = {},
                             std::span<const int32_t> store_offset = {}, std::span<const int32_t> store_block = {});
  bool has_stores() const { return !block_store.empty(); }
  /// Blocks per range for a prefill of num_tokens tokens over num_heads heads: about (blocks x heads) / 128, so
  /// the range walk runs ~128 CTAs (one wave of 1 per SM on 132 SMs; 256 = two at 64k), 1..kMaxBlocksPerRange (16 at
  /// 64k tokens x 16 heads, block 256; 8 at 16k; 2 at 4k; 1 at 1k; measured on the H200, docs/benchmarks.md).
  static int pick_blocks_per_range(int64_t num_tokens, int block_size, int num_heads);
  static constexpr int kMaxBlocksPerRange = 16;
};

/// The plan and per-sequence metadata as device arrays.
struct LightningPlanDev {
  int num_seqs = 0, num_blocks = 0, num_qtiles = 0;
  const int32_t* blocks = nullptr;           ///< [num_blocks, 3]
  const int32_t* seq_first_block = nullptr;  ///< [num_seqs + 1]
  const int32_t* qtiles = nullptr;           ///< [num_qtiles, 2]
  const int32_t* state_indices = nullptr;    ///< [num_seqs] state block (0 = null row: outputs zero, no state I/O)
  const int32_t* num_computed = nullptr;     ///< [num_seqs] tokens already in the state (0 = start from zeros)
  int num_ranges = 0;                        ///< the range fields: required by the bf16 path, unused by the fp32 one
  const int32_t* ranges = nullptr;           ///< [num_ranges, 3]
  const int32_t* seq_first_range = nullptr;  ///< [num_seqs + 1]
  const int32_t* block_range = nullptr;      ///< [num_blocks, 2]
  /// "all"-mode stores (LightningPlan::block_store / range_store), or nullptr when the step has none: the fp32
  /// path's state passing writes the state after block b into block_store[b], the bf16 path's range scan the state
  /// after range r into range_store[r] (when nonzero), rounded to the state dtype as the final state.
  const int32_t* block_store = nullptr;      ///< [num_blocks]
  const int32_t* range_store = nullptr;      ///< [num_ranges]
};

/// fp32 workspace elements lightning_prefill needs: 2 * num_blocks * H * D * D (each block's KV_b in fp32, then
/// the state entering it as bf16 hi + lo parts). The bf16 path needs less: num_ranges * H * D * D fp32 (each
/// range's aggregate, then the state entering it) plus num_blocks * H * D * D bf16 (range-local block states).
inline size_t lightning_workspace_floats(int num_blocks, int num_heads, int head_dim) {
  return 2 * static_cast<size_t>(num_blocks) * num_heads * head_dim * head_dim;
}

/// Varlen prefill. qkv: [T, H * 3D] fp32 (q | k | v per head, after SiLU), row stride qkv_stride (a multiple of 4);
/// out: [T, H * D] fp32, row stride out_stride (multiple of 4; must not alias qkv); workspace: at least
/// lightning_workspace_floats(...) floats. Writes every token's output (zeros on null rows) and the final states, and
/// with plan.block_store ("all" mode) the state after each such block (both paths: the bf16 path by plan.range_store).
cudaError_t lightning_prefill(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                              const LightningDevParams& p, const LightningPlanDev& plan, float* workspace,
                              cudaStream_t stream);

/// bf16 fast path of the varlen prefill (lightning_bf16.cu): the same plan, math and fp32 state passing, with
/// bf16 activations straight from the projection and one bf16 operand per product (no hi / lo splits): the
/// decayed keys, the decayed scores and the state entering each block are rounded to bf16 (relative error ~1e-3
/// against the fp32 recurrence instead of ~1e-5); mma.sync m16n8k16 with fp32 accumulation, cp.async double
/// buffering. qkv: [T, H * 3D] bf16 (q | k | v per head), row stride qkv_stride (a multiple of 8); out: [T, H * D]
/// bf16, row stride out_stride (a multiple of 8); workspace: lightning_workspace_floats(...) floats. The final
/// states are fp32-accumulated and stored in the pool's dtype.
cudaError_t lightning_prefill_bf16(const __nv_bfloat16* qkv, int64_t qkv_stride, __nv_bfloat16* out,
                                   int64_t out_stride, const LightningDevParams& p, const LightningPlanDev& plan,
                                   float* workspace, cudaStream_t stream);
/// As above with an fp32 output [T, H * D] (the runner's RMSNorm input).
cudaError_t lightning_prefill_bf16(const __nv_bfloat16* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                                   const LightningDevParams& p, const LightningPlanDev& plan, float* workspace,
                                   cudaStream_t stream);

/// Batch-invariant prefill (SSMSERVE_BATCH_INVARIANT): per (sequence, head) one CTA walks the sequence's tokens (the
/// plan's blocks in order) one by one with the decode kernel's per-token arithmetic (the same __device__ steps and
/// thread layout, the state rounded to the state dtype after every token as decode stores it), so every token's
/// output and state are bit-identical to feeding the tokens one at a time through lightning_decode, whatever the
/// batch and the cut of the prompt into steps. qkv / out: fp32 as lightning_prefill (qkv_stride a multiple of 4);
/// uses the plan's blocks, seq_first_block, state_indices, num_computed and block_store (the state after each such
/// block, "all" mode); no workspace. Writes every token's output (zeros on null rows) and the final states.
/// cudaErrorInvalidValue for bad sizes or missing arrays. Slow for long prompts (one token after another).
cudaError_t lightning_prefill_sequential(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                                         const LightningDevParams& p, const LightningPlanDev& plan,
                                         cudaStream_t stream);

/// Decode over `batch` rows (device_decode_rows.h): S <- e^{-s} S + k^T v; o = q S per token, a plain row's state
/// (states[state_indices[r]]) updated in place, a speculative verify row's tokens one after another (token j
/// continuing from column j - 1's state, storing the state after it into column j). qkv: [tokens, H * 3D]; out:
/// [tokens, H * D]. Null rows (block 0) are skipped (outputs zero). Math: kernels/cpu/lightning.h lightning_decode.
cudaError_t lightning_decode(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                             const LightningDevParams& p, DeviceDecodeRows rows, int batch, cudaStream_t stream);

}  // namespace ssmserve::cuda
