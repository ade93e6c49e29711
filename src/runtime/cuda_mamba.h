// Owns the loaders of the GPU model runners (Mamba-1 here, Mamba-2 in cuda_mamba2.cpp) and their registration.
// The Mamba-1 runner (issue 7 step 3): the same forward pass as model/archs/mamba.cpp
// (embedding -> N x [RMSNorm -> MambaMixer, fp32 residual] -> RMSNorm -> LM head) with the weights on the device,
// the recurrent state in a device mirror of the engine's StateCache, the batch metadata uploaded once per step
// and one host synchronization per step (the logits download).
#pragma once
#include <memory>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "model/causal_lm.h"

namespace ssmserve::cuda {

/// Options of the GPU runners.
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
  /// Decode-only steps on the fused decode kernels (issue 7): the conv update in in_proj's epilogue, dt_proj and
  /// the state update in one kernel that also prefetches out_proj's weights into L2 (Mamba-1), the conv update
  /// in in_proj's epilogue (Mamba-2). Same results bit for bit as the unfused kernels. Off by default: on the
  /// H200 the fused chain measured slower (mamba-2.8b layer 50.1 vs 47.5 us; docs/benchmarks.md).
  bool fused_decode = false;
  /// Decode-only steps of up to 8 rows (bf16 weights, no tensor parallelism) on the persistent decode kernel
  /// (kernels/cuda/persistent_decode.h): 1 = one launch per layer, 2 = the whole layer stack in one launch.
  /// Same results bit for bit as the op-by-op chain (tested on the H200). 0 (off) by default: measured slower there
  /// (mamba-2.8b 54.1 vs 43.0 us per layer, 282 vs 349 tokens/s at batch 1; docs/benchmarks.md).
  int persistent_decode = 0;
  /// The persistent kernel's L2 prefetch mode (Mamba1PersistentOptions::prefetch).
  int persistent_prefetch = 0;
  /// Mamba-1 decode-only steps of up to 16 rows (bf16 weights, no tensor parallelism) on the dataflow decode
  /// kernel (kernels/cuda/dataflow_decode.h: the whole stack in one launch per group of rows, weights streamed
  /// through shared memory). Batch-invariant (a row's bits are the same in any decode batch up to 16), not the op
  /// chain's bits (another summation order; within bf16 tolerance, tested). Off by default: on the H200 it is
  /// faster at batch 1 (mamba-2.8b 510.1 vs 396.7 tokens/s, mamba-1.4b 750.2 vs 633.1, mamba-130m 2,480 vs 1,989;
  /// mamba-2.8b 555.3 with --num-scheduler-steps 16 since session 16, 72% of the copy roofline)
  /// but slower from batch 4 (mamba-2.8b 1,248 vs 1,402; batch 16 1,287 vs 3,621), and switching kernels by batch
  /// size would make a request's bits depend on its batch; docs/benchmarks.md, session 13.
  bool dataflow_decode = false;
  /// Mamba-1 decode-only steps of up to 16 rows (bf16 weights, no tensor parallelism) with in_proj cut in two
  /// (issue 7: the z half off the critical path): bit 1 = the x rows on the main stream, the z rows on a second
  /// graph branch (stream + events, captured into the decode graphs) that runs while conv -> x_proj -> dt_proj
  /// run, joined before the state update; bit 2 = that branch then prefetches out_proj's weights into L2
  /// (l2_prefetch mode overlap_prefetch); bit 4 = the halves with their own K split count (faster, other bits)
  /// instead of the whole in_proj's (bit-identical to the unsplit chain; forced in batch-invariant mode);
  /// bit 8 = the branch forks before the x rows (z streams next to x) instead of after them; bit 16 = the
  /// prefetch rejoins the main stream after out_proj instead of before the state update. Bit 2 without bit 1:
  /// in_proj whole, then the branch prefetches. Default 1 (bit-identical to 0, tested): on the H200 mamba-2.8b
  /// batch-1 decode 351 vs 348 tokens/s (+0.8%, 3 runs); every prefetch / split-count variant measured slower
  /// (docs/benchmarks.md, session 6).
  int decode_overlap = 1;
  /// decode_overlap's prefetch mode (decode_ops.h l2_prefetch: 0 lines, 1 lines evict_last, 2 TMA bulk).
  int overlap_prefetch = 0;

  /// Defaults, overridden by the environment: SSMSERVE_CUDA_GRAPHS=0, SSMSERVE_PDL=0, SSMSERVE_SKINNY_MAX_M=<n>,
  /// SSMSERVE_BATCH_INVARIANT=1, SSMSERVE_DECODE_FUSED=1, SSMSERVE_DECODE_DATAFLOW=0|1,
  /// SSMSERVE_DECODE_PERSISTENT=0|1|2, SSMSERVE_PERSISTENT_PREFETCH=0..5, SSMSERVE_DECODE_OVERLAP=0..31, SSMSERVE_OVERLAP_PREFETCH=0..2. Throws
  /// Error on a malformed value.
  static CudaModelOptions from_env();
};

/// Loads a Mamba-1 model onto the GPU (checkpoint or dummy weights). Throws Error on any checkpoint / config
/// defect, when no GPU is usable, or for features the GPU runner does not have (in_proj / out_proj biases,
/// d_conv > 8). With tp.world > 1: rank tp.rank's shard on the current GPU (channels split as on the CPU, x_proj /
/// out_proj all-reduced through tp.comm, LM head vocab-parallel, embedding replicated; decode steps in CUDA graphs
/// with the all-reduces captured).
std::unique_ptr<CausalLM> load_mamba_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt = {},
                                          const dist::TpRank& tp = {});

/// Loads a Mamba-2 model onto the GPU (checkpoint or dummy weights; the same dummy values as the CPU model).
/// Throws Error as load_mamba_cuda (use_bias, conv_kernel > 8, state_size > 256, no GPU). With tp.world > 1: rank
/// tp.rank's shard on the current GPU (heads and groups split as on the CPU; n_groups == 1 is refused there),
/// out_proj all-reduced, LM head vocab-parallel, embedding replicated, decode steps in CUDA graphs.
std::unique_ptr<CausalLM> load_mamba2_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt = {},
                                           const dist::TpRank& tp = {});

/// Loads `config` over GPUs 0..tensor_parallel_size-1 (one runner shard each, through an NCCL group) as one
/// CausalLM (a TensorParallelLM). Throws Error when NCCL is missing, too few GPUs are visible, or a shard fails.
std::unique_ptr<CausalLM> load_cuda_tensor_parallel(const ModelConfig& config, LoadFormat format, int tensor_parallel_size,
                                                    CudaModelOptions opt = {});

/// Registers the NCCL tensor-parallel loaders of both runners (cuda_tensor_parallel.cpp).
void register_cuda_tensor_parallel();

/// Registers the CUDA runners with the model registry (device "cuda"); the app calls it once at start.
void register_cuda_backend();

}  // namespace ssmserve::cuda
