// Owns the options of the GPU runner (CudaModelOptions): read once (CLI flags / environment, docs/environment.md),
// then passed down; no kernel reads the environment.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/kernel_tuning.h"

namespace ssmserve {
struct ModelConfig;
}

namespace ssmserve::cuda {

/// Options of the GPU runner; every one applies to every architecture (a mixer that has no use for one ignores it).
struct CudaModelOptions {
  /// Weights and GEMM operands: BF16 (tensor cores, the default) or F32 (exact fp32 GEMMs: matches the CPU
  /// backend to rounding; tests and small models).
  DType weight_dtype = DType::BF16;
  /// Decode-only steps through CUDA graphs (captured per step shape on its second occurrence; see DecodeGraphs).
  bool cuda_graphs = true;
  /// Kernels of the decode path launched with Programmatic Dependent Launch (kernels/cuda/pdl.cuh).
  bool pdl = true;
  /// BF16 GEMMs with at most this many rows run on the batch-invariant skinny kernel (kernels/cuda/skinny_gemm.h),
  /// larger ones on cuBLASLt.
  int64_t skinny_max_m = 16;
  /// Every BF16 GEMM on the skinny kernel, whatever M (vLLM's VLLM_BATCH_INVARIANT): a request's outputs are
  /// then bit-identical whatever it is batched with, prefill chunks included; slower prefill (the sequential
  /// scans instead of the chunk-parallel ones).
  bool batch_invariant = false;
  /// Mamba-1 decode-only steps of up to 16 rows (bf16 weights, no tensor parallelism) on the dataflow decode
  /// kernel (kernels/cuda/dataflow_decode.h: the whole stack in one launch per group of rows, weights streamed
  /// through shared memory): the batch-1 latency option. Batch-invariant (a row's bits are the same in any decode
  /// batch up to 16), not the op chain's bits (another summation order; within bf16 tolerance, tested). Off by
  /// default: on the H200 faster at batch 1 (mamba-2.8b 510.1 vs 396.7 tokens/s; 555.3 with
  /// --num-scheduler-steps 16, 72% of the copy roofline) but slower from batch 4 (docs/benchmarks.md, session 13).
  bool dataflow_decode = false;
  /// Mamba-1 decode-only steps of up to 16 rows (bf16 weights, no tensor parallelism) with in_proj cut in two
  /// (the z half off the critical path): bit 1 = the x rows on the main stream, the z rows on a second graph
  /// branch that runs while conv -> x_proj -> dt_proj run, joined before the state update; bit 2 = that branch
  /// then prefetches out_proj's weights into L2 (overlap_prefetch's mode); bit 4 = the halves with their own K
  /// split count (other bits) instead of the whole in_proj's (bit-identical to the unsplit chain; forced in
  /// batch-invariant mode); bit 8 = the branch forks before the x rows; bit 16 = the prefetch rejoins after
  /// out_proj. Default 1 (bit-identical to 0, tested; +0.8% at mamba-2.8b batch 1, docs/benchmarks.md session 6).
  int decode_overlap = 1;
  /// decode_overlap's prefetch mode (decode_ops.h l2_prefetch: 0 lines, 1 lines evict_last, 2 TMA bulk).
  int overlap_prefetch = 0;
  /// Mamba-2 prefill SSD with bf16 weights: keep the TF32 tensor-core tiles instead of the bf16 ones.
  bool ssd_tf32 = false;
  /// A mixer and the parallel mixer on the same normed rows (Falcon-H1's Mamba-2 and attention) with their input
  /// projections stacked at load and run as one GEMM (one launch less per layer; CudaModule::input_projection).
  bool fuse_parallel_projections = true;
  /// A MoE layer's shared expert (cast, gate / up GEMM, activation, down GEMM) on a second stream, a second branch of
  /// the decode graphs, while the routed experts run on the first; joined before the shared output is added
  /// (CudaBranch, runtime/cuda_branch.h). The same kernels on the same inputs: bit-identical to one stream (tested).
  /// Off under layer_profile (its spans time one stream).
  bool moe_shared_branch = true;
  /// A parallel mixer pair whose input projections run as one GEMM (fuse_parallel_projections; Falcon-H1's Mamba-2 and
  /// attention): after the GEMM the runner forks the second branch (CudaBranch) and runs the parallel mixer (the
  /// attention) there while the first runs on the main stream, joined before the parallel mixer's residual rule; in
  /// every step (prefill too). The branch's module has a scratch pool of its own (no slot or workspace shared with the
  /// main stream's). The same kernels on the same inputs: bit-identical to one stream (tested). Off under layer_profile
  /// and tensor parallelism, and without fuse_parallel_projections.
  bool parallel_mixer_branch = true;
  /// Which MoE layers add their shared-expert rows inside the routed experts' combine kernel (kernels/cuda/moe.h
  /// MoeSharedAdd; the second branch joined just before the combine) instead of a launch of their own after it, in
  /// steps of up to 16 tokens and those on the per-token combine (moe_combine_per_token; the column-slice combine's
  /// blocks each recompute the gate's dot: cheap at decode only):
  /// 0 none, 1 those with Qwen's sigmoid gate (default: its one-block gated add took ~9.5 us per layer on the H200),
  /// 2 all (the plain add too: slower where the shared expert's branch is the layer's longer chain, since the combine
  /// then waits for it; docs/benchmarks.md session 29). The same arithmetic either way: bit-identical (tested).
  int moe_fused_shared_add = 1;
  /// Programmatic Dependent Launch on the second branch (CudaBranch) for its kernels after the first, which follows
  /// the fork's event wait and is launched plainly (as the Mamba-1 decode overlap's branch).
  bool branch_pdl = true;
  /// The tensor-core prefill attention converts the step's keys of its rows to bf16 once per layer (tc_stage_floats,
  /// paged_attention.h) instead of in every 128-row tile (SSMSERVE_ATTN_TC_STAGE=0: the tiles convert). On the
  /// mma.sync tiles the same bits either way.
  bool attn_tc_stage = true;
  /// With the staged keys, the tensor-core prefill attention's tiles at head_dim 128 / 256 on warpgroup MMAs (sm_90a
  /// wgmma: K / V read once per 64 query rows from shared memory instead of once per 16); SSMSERVE_ATTN_TC_WGMMA=0:
  /// the mma.sync tiles. Within bf16 rounding of each other. Staging (so the warpgroup tiles) needs the step's
  /// tensor-core rows' keys to fit kTcStageMaxBytes, so above it a row's bits can depend on the other rows of its
  /// step, as the default mode's cuBLAS GEMMs (chosen by M) already let them; batch-invariant mode has no
  /// tensor-core pass.
  bool attn_tc_wgmma = true;
  /// A sublayer's scaled residual h = alpha h + beta module(...) (Granite's residual_multiplier; any scaled residual
  /// not paired with a parallel mixer's and not from the normed rows) applied by the next sublayer's residual norm (or the LM head's) instead
  /// of a launch of its own: the same residual_step arithmetic, bit-identical (tested).
  bool fuse_scaled_residual = true;
  /// The dense MLP's activation (SiLU-gated or relu^2, also the MoE shared expert's) in the gate / up GEMM's epilogue
  /// on the skinny kernel (skinny_gemm.h SkinnyActEpilogue: gated weights stacked with gate and up rows interleaved
  /// by 8) instead of a launch of its own between the two GEMMs; steps off the skinny kernel run mlp_activation on
  /// the same layout. Skinny-kernel steps (every step in batch-invariant mode) compute the same sums and expression:
  /// bit-identical (tested); cuBLASLt steps (prefill) multiply the row-permuted weight, the same products per column
  /// (bit-identical on the tested shapes; an algorithm that summed columns differently by position could differ in the
  /// last bits). SSMSERVE_MLP_ACT_EPILOGUE=0 turns it off. With fuse_casts: Falcon-H1-7B batch-1 decode at 2k +2.9% on
  /// an H100 (docs/benchmarks.md, session 37).
  bool mlp_act_epilogue = true;
  /// Kernels whose fp32 output feeds a bf16 GEMM write the bf16 copy themselves instead of a cast launch after them:
  /// the split-KV attention combine of steps without tensor-core tiles (PagedAttentionArgs::out_bf16: o_proj's input,
  /// attention without an output gate; Falcon-H1's 44 layers) and a residual norm whose sublayer reads both forms
  /// (add_rms_norm_rows' out_bf16: MiniMax's mixers, whose residual comes from the normed rows). The same store per
  /// value: bit-identical (tested). SSMSERVE_FUSE_CASTS=0 turns it off.
  bool fuse_casts = true;
  /// With fuse_casts: the residual norm before a MoE layer with a shared expert writes the expert's bf16 input too
  /// (CudaModule::wants_input_copy), so the second branch starts with its GEMM instead of a cast launch. The same
  /// store per value: bit-identical (tested with fuse_casts). SSMSERVE_MOE_INPUT_COPY=0 turns it off.
  bool moe_input_copy = true;
  /// A MoE layer's shared-expert add done by the next sublayer's residual norm, which adds the rows to the layer's
  /// output first (the bits of the add's own launch or of the combine's; NormAddend), instead of a launch of its own
  /// after the join or the combine kernel's add; not after the last sublayer or before a parallel one. 1: the plain adds
  /// (Granite-4.0-H, Nemotron-H) where the combine does not take them (moe_fused_shared_add below 2): +2.6%
  /// Granite-4.0-H-Tiny and +2.4% Nemotron-3-Nano batch-1 decode on an H100 (docs/benchmarks.md, session 39); 2 (the
  /// default): Qwen's gated adds too in steps of up to 16 tokens, their gate's sigmoid(x . w_g) computed on the shared
  /// expert's branch (sigmoid_gate_rows) and the norm adding one FMA per value (NormAddend::gate), so the combine adds
  /// nothing and joins the down GEMV's launch (KernelTuning::moe_down_combine): Qwen3.5-35B-A3B +2.9% on an H100
  /// (session 49; session 40's form with the dot in the norm's block lost 2.3%); 0: none. Bit-identical (tested).
  /// SSMSERVE_MOE_SHARED_ADD_IN_NORM=0|1|2.
  int moe_shared_add_in_norm = 2;
  /// A Gated DeltaNet layer's plain decode rows (up to 16, outside batch-invariant mode, bf16 weights) in one launch:
  /// the conv update, the q / k / gate preparation, the delta-rule update and the per-head gated norm
  /// (kernels/cuda/gated_delta_decode_fused.h) instead of four. The same bits (tested). Batch-1 decode at 2k on an
  /// H100: Qwen3.5-35B-A3B +2.2%, Qwen3.5-9B +0.75% (docs/benchmarks.md session 44). SSMSERVE_GDN_DECODE_FUSED=0
  /// turns it off.
  bool gdn_decode_fused = true;
  /// Per-sublayer GPU times of every step, printed when the runner is destroyed (runtime/layer_profile.h;
  /// SSMSERVE_LAYER_PROFILE=1): eager launches (CUDA graphs off) and one synchronize per step.
  bool layer_profile = false;
  /// The n-th decode graph replay runs inside a profiler capture range (DecodeGraphs::set_profile_replay;
  /// SSMSERVE_PROFILE_REPLAY=n, 0 = off): one step's kernels for `ncu --profile-from-start off`.
  int64_t profile_replay = 0;
  /// Kernel paths measured against each other (comparisons, benchmarks); the runner installs them at load.
  KernelTuning kernels = {};

  /// Defaults, overridden by the environment (core/env_options.h, docs/environment.md): SSMSERVE_CUDA_GRAPHS=0|1,
  /// SSMSERVE_PDL=0|1, SSMSERVE_SKINNY_MAX_M=<n>, SSMSERVE_BATCH_INVARIANT=0|1, SSMSERVE_DECODE_DATAFLOW=0|1,
  /// SSMSERVE_LAYER_PROFILE=0|1, SSMSERVE_PROFILE_REPLAY=<n>, SSMSERVE_DECODE_OVERLAP=0..31, SSMSERVE_OVERLAP_PREFETCH=0..2, SSMSERVE_SSD_TF32=0|1,
  /// SSMSERVE_FUSE_PARALLEL_PROJ=0|1, SSMSERVE_PARALLEL_MIXER_BRANCH=0|1, SSMSERVE_MOE_SHARED_BRANCH=0|1, SSMSERVE_MOE_FUSED_SHARED_ADD=0..2,
  /// SSMSERVE_BRANCH_PDL=0|1, SSMSERVE_FUSE_SCALED_RESIDUAL=0|1, SSMSERVE_MLP_ACT_EPILOGUE=0|1, SSMSERVE_FUSE_CASTS=0|1,
  /// SSMSERVE_MOE_INPUT_COPY=0|1, SSMSERVE_MOE_SHARED_ADD_IN_NORM=0|1,
  /// and the kernel paths
  /// (SSMSERVE_SKINNY_TUNE / _LATE_TRIGGER / _PRELOAD / _PREFETCH_MB / _RULES / _SPLIT_RULE, SSMSERVE_KERNEL_PROFILE, SSMSERVE_LIGHTNING_KV_WG /
  /// _WALK, SSMSERVE_DECODE_PREWAIT, SSMSERVE_SAMPLE_BUCKETS, SSMSERVE_GDN_WALK,
  /// SSMSERVE_MOE_PAIR_GEMV / _TUNE / _SORTED, SSMSERVE_ATTN_TC_WS). Throws Error naming the variable on a
  /// malformed value.
  static CudaModelOptions from_env();
  /// from_env() with the model's requested weight dtype (ModelConfig::dtype, vLLM's --dtype) as weight_dtype; nullopt
  /// (auto) keeps BF16; and cuda_graphs off under ModelConfig::enforce_eager (vLLM's --enforce-eager). Throws Error
  /// as from_env, or naming --dtype for a dtype the runner has no kernels for (F16).
  static CudaModelOptions for_model(const ModelConfig& cfg);
};

}  // namespace ssmserve::cuda
