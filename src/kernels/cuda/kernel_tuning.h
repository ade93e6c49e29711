// Owns the switches that select among kernel paths measured against each other (comparisons and benchmarks; every
// path is tested against the default): set once by the GPU runner from its options (CudaModelOptions::kernels, read
// from the environment in one place, core/env_options.h); the kernels' host code reads them here, never the
// environment. A switch changes speed, never a result, except where its doc says otherwise.
#pragma once
#include <cstdint>
#include <optional>

#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve::cuda {

struct KernelTuning {
  /// Skinny GEMM decode launch shape and block split count for every call (SSMSERVE_SKINNY_TUNE
  /// "unroll,pipelined,reg_cap,cta_splits"); unset: per shape class.
  std::optional<SkinnyTuning> skinny_tune;
  bool skinny_late_trigger = false;   ///< PDL trigger after the GEMM instead of before it (SSMSERVE_SKINNY_LATE_TRIGGER=1)
  bool skinny_preload = true;         ///< W loads before the PDL wait (SSMSERVE_SKINNY_PRELOAD=0 turns off)
  /// skinny_default_tuning's shape rules for wide and deep weights (4 splits on the pipelined form; 8-warp blocks when
  /// they balance over the SMs); SSMSERVE_SKINNY_RULES=0: the rules before them. Changes the summation order of
  /// those shapes (rounding only; a function of N, K and the GPU's SM count, never of M, so batch-invariant).
  bool skinny_rules = true;
  /// skinny_default_tuning's split rule for weights of >= 64 tiles of 16 rows and >= 16 chunks of 32 columns, under
  /// skinny_rules: 1 (default) every split of a tile in one block (no cross-block group sums), 16 splits when the
  /// tiles fit the SMs one block each, 8 up to 3 tiles per SM, else 4, fewer where a split would get < 3 chunks
  /// (graph-timed at M = 1 on an H100: 2-42% faster at the hybrids' 2-22 MB projections, within 2% either way on
  /// larger weights; docs/benchmarks.md session 40); 0 the rules before it (SSMSERVE_SKINNY_SPLIT_RULE=0|1). Changes
  /// the summation order of those shapes (a function of N, K and the SM count, never of M: batch-invariant).
  int skinny_split_rule = 1;
  int64_t skinny_prefetch_bytes = -1; ///< the pre-wait L2 prefetch (SSMSERVE_SKINNY_PREFETCH_MB, 0..48); -1: default
  bool kernel_profile = false;        ///< per-launch CUDA event times of multi-kernel ops (SSMSERVE_KERNEL_PROFILE=1)
  bool lightning_kv_wg = true;        ///< lightning bf16 range KV on warpgroup MMAs (SSMSERVE_LIGHTNING_KV_WG=0: mma.sync)
  /// Lightning bf16 prefill step 3: 0 block states + per-tile outputs, 1 the mma.sync range walk, 2 the warpgroup walk
  /// (head_dim 128; else the range walk) (SSMSERVE_LIGHTNING_WALK).
  int lightning_walk = 2;
  bool decode_prewait = true;         ///< decode updates' pre-PDL-wait L2 prefetch (SSMSERVE_DECODE_PREWAIT=0 turns off)
  bool sample_buckets = true;         ///< device sampling's bucket histogram for large candidate sets (SSMSERVE_SAMPLE_BUCKETS=0)
  /// Gated DeltaNet two-pass prefill walk (gated_delta_prefill_two_pass, SSMSERVE_GDN_WALK): 0 the previous walk
  /// (64-column tiles, decays summed by one lane, no prefetch); 1 the tile-product walk with the decays from the first
  /// pass and the next chunk prefetched into the L2, on 32-column tiles when the 64-column grid would leave SMs idle,
  /// else 64; 2 (default) the shared-memory walk (cp.async operands, fragments straight from shared memory, 32-column
  /// tiles) when Dk is a multiple of 32, else as 1. The same math; results differ in rounding only.
  int gdn_walk = 2;
  /// Its first pass per (chunk, key head) (gated_delta_prefill_wy_group.cu: the K K^T and Q K^T products shared by the
  /// key head's value heads, fragments straight from shared memory) when the walk is not the previous one (gdn_walk
  /// 0) and Dk, Dv are multiples of 16 up to 128; off: per (chunk, value head) (SSMSERVE_GDN_WY_GROUPED=0). The same
  /// values.
  bool gdn_wy_grouped = true;
  /// Split-KV attention tasks of one query token (decode rows) on the decode kernel that streams K / V from the paged
  /// cache in registers (groups up to 8); off: the shared-memory tiled kernel for every task, as before issue 31
  /// (SSMSERVE_ATTN_DECODE_KERNEL=0). Rounding-level differences; each is batch-invariant with fixed splits.
  bool attn_decode_kernel = true;
  /// Work items (tasks x key splits) the split-KV plans size their splits for outside batch-invariant mode
  /// (fill_key_split; kFillItems = 256 by default; SSMSERVE_ATTN_FILL_ITEMS=64..8192): more items, shorter splits.
  /// Rounding-level differences.
  int attn_fill_items = 256;
  /// bf16 MoE experts on the per-pair path (decode: up to 16 (token, expert) pairs, or every batch with
  /// MoeDevWeights::per_pair): the GEMVs that give each warp several output rows, stage x / the activations once per
  /// block in shared memory and keep several 16-byte weight loads per lane in flight; off: one warp per output element,
  /// as before issue 31 (SSMSERVE_MOE_PAIR_GEMV=0). The same bits either way (the same per-lane sums and warp sum).
  bool moe_pair_gemv = true;
  /// The fp32 GEMV of up to 8 rows (skinny_gemm_f32: the MoE router of a bf16 model at decode; every decode GEMM of
  /// an fp32-weight model) loads its column's first weight chunks into registers and hints the rest into the L2 before
  /// its PDL wait; off: every load after the wait (SSMSERVE_F32_GEMV_PRELOAD=0). The same sums in the same order: the
  /// same bits. +2.6-3.6% batch-1 decode on the three MoE shapes (H100, docs/benchmarks.md session 39).
  bool f32_gemv_preload = true;
  /// The per-pair down GEMV reads its pairs' experts (written by the router / the sort, two launches back) and loads
  /// its first weight chunks before its PDL wait, while the up GEMV still runs; off: after the wait
  /// (SSMSERVE_MOE_PAIR_PRELOAD=0). The same loads and sums either way: the same bits.
  bool moe_pair_preload = true;
  /// Decode-sized steps on the unsorted per-pair GEMVs (up to 16 pairs): the down GEMV and the weighted combine in one
  /// launch (moe_down_combine: each block's pair outputs in shared memory), one launch fewer per MoE layer. 1: steps
  /// without a shared-expert add in the combine (+6.6% Granite-4.0-H-Tiny batch-1 decode on an H100); 2: those with
  /// one too (the fused launch then waits for the shared expert's branch before its down GEMV: -4.4% on
  /// Qwen3.5-35B-A3B, whose gated add is in the combine); 0: the down GEMV and the combine kernel always
  /// (SSMSERVE_MOE_DOWN_COMBINE=0|1|2). The same bits either way.
  int moe_down_combine = 1;
  /// A Mamba-2 layer's plain decode rows (up to 16, outside batch-invariant mode, bf16 weights) take one launch for
  /// the conv update, the SSD state update and the gated norm (mamba2_decode_fused: the last block of each (row,
  /// group) runs the group's norm) instead of three; off: the three kernels (SSMSERVE_MAMBA2_DECODE_FUSED=0). The same
  /// bits either way. Batch-1 decode at 2k on an H100: Nemotron-3-Nano +1.5%, Falcon-H1-7B +0.6%, Granite-4.0-H-Tiny
  /// within noise (its one group's norm is a single block's tail; docs/benchmarks.md session 44).
  bool mamba2_decode_fused = true;
  /// The per-pair GEMVs' shape (benchmarks; SSMSERVE_MOE_PAIR_TUNE="rows,warps[,one_wave]"): output rows per warp (1,
  /// 2 or 4) and warps per block (4 or 8), 0: by the rule in moe.cu (enough warps to fill the SMs); one_wave: at most
  /// the blocks the SMs hold at once, each looping over an equal share of the pair rows (no partial last wave). Never
  /// changes a result.
  int moe_pair_rows = 0;
  int moe_pair_warps = 0;
  bool moe_pair_one_wave = false;
  /// bf16 MoE steps of up to 2 (token, expert) pairs per expert (17..2E pairs: decode batches of 3 and more, short
  /// prefill chunks) on the per-pair GEMVs over expert-sorted rows instead of the grouped tile GEMMs, whose 128-row
  /// tiles ran 1-8% full there: on the H200 2.2-8x faster from 3 to 16 tokens at the three MoE expert shapes, still
  /// ahead at 2E pairs (bench_cuda_moe_decode sweep, docs/benchmarks.md session 28). Off: the grouped GEMMs above 16
  /// pairs, as before (SSMSERVE_MOE_PAIR_SORTED=0). Rounding-level differences (another summation order).
  bool moe_pair_sorted = true;
  /// The large-T (prefill) forms of the memory-bound row kernels: the MoE combine one block per token (expert order
  /// ranked and the shared gate's dot once per token), the multi-block MoE pair sort, the MoE gather by token (each x
  /// row read once), the gated RMSNorm's small groups several per block, the causal conv1d four channels per thread,
  /// cast_rows and sigmoid_gate 8 columns per thread; chosen by the step's size only. Off: the old forms at every
  /// size (SSMSERVE_PREFILL_ROW_KERNELS=0). The same bits either way (the same per-element arithmetic and summation
  /// order; test_cuda_prefill_rows compares them).
  bool prefill_row_kernels = true;
  /// bf16 MoE grouped expert GEMMs (prefill steps above the per-pair bounds; SSMSERVE_MOE_GROUPED_WG): 1 (default) the
  /// Hopper kernel (TMA loads into a 128-byte-swizzled ring filled by a producer warp, two consumer warpgroups on
  /// wgmma; moe_grouped_gemm_wg.cu) with 256-wide weight tiles from K = 1024 (kWideTileMinK), 128-wide below, where
  /// the device is sm_90 and the operands suit TMA; 2 / 3 the same with 128- / 256-wide tiles always (benchmarks);
  /// 0 the mma.sync kernel everywhere, as before. Rounding-level differences (another summation order); every form
  /// batch-invariant.
  int moe_grouped_wg = 1;
  /// The tensor-core prefill attention's warpgroup tiles (staged keys, head_dim 128 / 256, PagedAttentionArgs::tc_wgmma)
  /// on the warp-specialized kernel (paged_attention_tc_ws.cu: a TMA producer warpgroup, K / V rings on mbarriers, two
  /// consumer warpgroups overlapping each tile's softmax with the previous tile's P V, FlashAttention-3 style)
  /// (SSMSERVE_ATTN_TC_WS): 0 the lockstep warpgroup kernel (paged_attention_tc_wg.cu); 1 (default) the
  /// warp-specialized one (H200, head_dim 256, 32k tokens: 455 TFLOP/s against the lockstep kernel's 307, session 31);
  /// 2 the same with the consumer warpgroups ping-ponging their product issues (420). The same products, softmax and
  /// merges in the same order per output element as the lockstep kernel (the same bits on the H200).
  int attn_tc_ws = 1;
};

/// The switches in force (the defaults until set_kernel_tuning).
const KernelTuning& kernel_tuning();
/// Sets them for the process (the GPU runner does, at load, from its options). Not thread-safe against kernels being
/// enqueued: call before any.
void set_kernel_tuning(const KernelTuning& t);

}  // namespace ssmserve::cuda
