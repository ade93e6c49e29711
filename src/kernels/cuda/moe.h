// Owns the sparse mixture-of-experts MLP on the GPU (the CUDA counterpart of kernels/cpu/moe.h, transformers'
// MiniMaxSparseMoeBlock): routing (softmax in fp32, top_k by probability with ties to the lower expert id,
// renormalized to sum 1), tokens sorted by expert on the device, grouped expert GEMMs on tensor cores (one launch
// per projection for all experts: bf16 operands, fp32 accumulation; gate and up fused with SiLU(g) * u), and the
// weighted combine adding each token's experts in ascending id order (as the CPU); up to 16 (token, expert) pairs
// (decode) take per-pair GEMV kernels instead of the tile grid. fp32 experts (MoeDevWeights::f32, the fp32-weight
// model) run fp32 per-pair GEMVs for every batch instead (x and the activations unrounded, fp32 FMA chains: the
// CPU's arithmetic up to summation order), over the pairs in expert order so an expert's weights stay in L2: slower
// than the bf16 tiles at prefill, but an fp32 model is for accuracy. Nothing is copied to the host,
// so the whole block can be captured in a CUDA graph. Router logits (x W_gate^T) come from the caller's GEMM.
// Framework-free: device pointers, sizes, row strides (elements), a stream; each returns the launch status
// (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ssmserve::cuda {

/// How tokens pick their experts (cpu::MoeRouting): softmax (renormalized or not) or sigmoid scores with an optional
/// correction bias [E] (device) for the choice, group-limited choice (n_group <= 32 groups, the topk_group best by the
/// sum of their two best), weights times routed_scaling_factor.
struct MoeRouteParams {
  bool sigmoid = false;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  int n_group = 1, topk_group = 1;
  const float* correction_bias = nullptr;
};

/// Router limits: experts (Qwen3-Next: 512) and experts per token (Qwen3-Next: top-10).
inline constexpr int kMoeMaxExperts = 512, kMoeMaxTopK = 16;

/// Stacked expert weights (device, bf16 or fp32 (f32), row-major as Linear weights are stored).
struct MoeDevWeights {
  int num_experts = 0;   ///< E, 1..512 (the router's limit)
  int top_k = 0;         ///< 1..min(E, 16)
  int64_t hidden = 0;    ///< multiple of 8
  int64_t intermediate = 0;  ///< I, multiple of 8
  const void* w1 = nullptr;  ///< [E, I, hidden] gate_proj (relu^2 experts: up_proj)
  const void* w3 = nullptr;  ///< [E, I, hidden] up_proj (null: relu^2 experts, w2(relu(w1 x)^2))
  const void* w2 = nullptr;  ///< [E, hidden, I] down_proj
  MoeRouteParams routing;
  bool f32 = false;  ///< w1 / w3 / w2 are fp32 and the experts compute in fp32 (else bf16 operands)
  /// bf16 experts on the per-pair GEMVs at every batch size, not only up to 16 pairs (batch-invariant mode: a
  /// token's result is then the same in any batch; the tile GEMMs sum in another order than the GEMVs).
  bool per_pair = false;
};

/// Workspace bytes sparse_moe needs for T tokens (ids, weights, offsets, sorted rows, activations, expert outputs).
size_t moe_workspace_bytes(int64_t T, const MoeDevWeights& w);

/// Router only: logits [T, E] fp32 (contiguous) -> ids [T, top_k] (descending probability, ties to the lower id)
/// and their renormalized weights [T, top_k] fp32. E <= 512, top_k <= 16.
cudaError_t moe_route(const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights,
                      cudaStream_t stream);
/// The same with any routing (MoeRouteParams); ids by descending choice score. pdl: Programmatic Dependent Launch
/// (pdl.cuh; the kernel waits on its predecessor in every block first).
cudaError_t moe_route(const float* logits, int64_t T, int E, int top_k, const MoeRouteParams& r, int32_t* ids, float* weights,
                      cudaStream_t stream, bool pdl = false);

/// The shared expert's rows that sparse_moe adds in its combine kernel (instead of a launch of its own after it):
///   out[t] = combine[t] + y[t]                        (gate == nullptr; the bits of scaled_residual(out, out, 1, y, 1))
///   out[t] = combine[t] + sigmoid(x[t] . gate) * y[t]  (Qwen's shared_expert_gate; the bits of sigmoid_gated_add)
/// y: [T, hidden] fp32 (row stride y_stride); gate: [hidden] fp32 or nullptr; x: [T, hidden] fp32 (row stride
/// x_stride; sparse_moe's own x when null). ready: an event recorded after y's producer on another stream (the
/// runner's second branch), which the combine waits for (the routed experts before it do not), or nullptr.
struct MoeSharedAdd {
  const float* y = nullptr;
  int64_t y_stride = 0;
  const float* gate = nullptr;
  const float* x = nullptr;
  int64_t x_stride = 0;
  cudaEvent_t ready = nullptr;
};

/// Whether sparse_moe's combine at T tokens is the per-token form (KernelTuning::prefill_row_kernels, T >= 64): one
/// block per token, which computes a gated MoeSharedAdd's sigmoid(x . gate) once per token (the column-slice form of
/// smaller steps computes it once per slice), so the runner can fuse the shared add there too. A function of T only.
bool moe_combine_per_token(int64_t T);

/// out[t] = sum over token t's top_k experts e (ascending e) of weight_e * w2_e(silu(w1_e x) * (w3_e x)) (relu^2
/// experts: weight_e * w2_e(relu(w1_e x)^2)).
///   x: [T, hidden] fp32 (row stride x_stride, multiple of 4); logits: [T, E] fp32 contiguous; out: [T, hidden]
///   fp32 (row stride out_stride; must not alias x); workspace: moe_workspace_bytes(T, w) bytes.
///   pdl: this file's kernels (routing, sort, the per-pair / fp32 GEMVs, combine) launched with Programmatic
///   Dependent Launch (pdl.cuh); the grouped GEMMs of large batches stay plain launches.
///   shared: the shared expert's rows added in the combine (MoeSharedAdd), or nullptr.
cudaError_t sparse_moe(const float* x, int64_t x_stride, int64_t T, const float* logits, const MoeDevWeights& w,
                       float* out, int64_t out_stride, void* workspace, cudaStream_t stream, bool pdl = false,
                       const MoeSharedAdd* shared = nullptr);

}  // namespace ssmserve::cuda
