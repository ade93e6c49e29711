// Owns the elementwise GPU activations and residual steps of the decoder modules (the CUDA side of
// kernels/cpu/activations.h): SiLU in place (the lightning qkv projection), the sigmoid output gate (lightning, Qwen's
// gated attention), the dense MLP's SiLU-gated / relu^2 activation, the scaled residual h = alpha x + beta y (MiniMax's
// residuals, muP multipliers) and the per-token sigmoid-gated add of Qwen's shared expert. Framework-free: device pointers, sizes, row strides (elements), a
// stream; each returns the launch status (cudaErrorInvalidValue for bad sizes). Launchers with a `pdl` argument launch
// with Programmatic Dependent Launch when it is set (pdl.cuh: the kernel waits on its predecessor in every block, then
// lets its successor launch); the results are the same either way.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ssmserve::cuda {

/// x = x * sigmoid(x) in place (cpu::silu): x [T, cols] fp32, row stride x_stride.
cudaError_t silu_inplace(float* x, int64_t x_stride, int64_t T, int64_t cols, cudaStream_t stream);

/// out = o * (1 / (1 + exp(-g))): o, g [T, cols] fp32 (row strides o_stride, g_stride); out [T, cols] in
/// out_dtype (F32 or BF16, the next GEMM's input), row stride out_stride. pdl: Programmatic Dependent Launch.
cudaError_t sigmoid_gate(const float* o, int64_t o_stride, const float* g, int64_t g_stride, int64_t T, int64_t cols,
                         void* out, DType out_dtype, int64_t out_stride, cudaStream_t stream, bool pdl = false);

/// The dense MLP's activation (cpu: model/ffns/mlp_ffn.cpp): gated: out = silu(gu[:, :I]) * gu[:, I:2I] (gate then
/// up); else out = relu(gu[:, :I])^2. gu: [T, 2I or I] fp32 (row stride gu_stride); out: [T, I] in out_dtype (F32 or
/// BF16, the down projection's input), row stride out_stride. pdl: Programmatic Dependent Launch.
/// interleaved8 (gated only, I % 8 == 0): gu's columns are gate and up interleaved in groups of 8 (columns 16i ..
/// 16i + 7 gate 8i .. 8i + 7, columns 16i + 8 .. 16i + 15 the same up channels), the layout of a gate / up weight
/// stacked for the skinny GEMM's activation epilogue (skinny_gemm.h SkinnyAct::kSiluGatedInterleaved8).
cudaError_t mlp_activation(const float* gu, int64_t gu_stride, int64_t T, int64_t I, bool gated, void* out, DType out_dtype,
                           int64_t out_stride, cudaStream_t stream, bool pdl = false, bool interleaved8 = false);
/// h = a * x + b * y over n contiguous fp32 elements (h may alias x or y). pdl: Programmatic Dependent Launch.
cudaError_t scaled_residual(float* h, const float* x, float a, const float* y, float b, int64_t n, cudaStream_t stream,
                            bool pdl = false);
/// Two residual updates in one pass: h = a1 * h + b1 * x, then h = a2 * h + b2 * y, each element with the arithmetic of
/// scaled_residual(h, h, a1, x, b1) followed by scaled_residual(h, h, a2, y, b2) (a mixer's and its parallel mixer's
/// outputs, Falcon-H1). h, x, y: n contiguous fp32 elements (x, y must not alias h). pdl: Programmatic Dependent
/// Launch.
cudaError_t scaled_residual2(float* h, float a1, const float* x, float b1, float a2, const float* y, float b2, int64_t n,
                             cudaStream_t stream, bool pdl = false);

/// Qwen's gated shared expert (model/ffns/moe_ffn.cpp), per row t: out[t] += sigmoid(x[t] . w) * y[t].
///   out, y: [T, H] fp32 (row strides out_stride, y_stride); x: [T, H] fp32 (row stride x_stride), the MoE's normed
///   input; w: [H] fp32 (shared_expert_gate.weight). One block per row, the dot in a fixed order (for any T).
///   pdl: Programmatic Dependent Launch.
cudaError_t sigmoid_gated_add(float* out, int64_t out_stride, const float* y, int64_t y_stride, const float* x, int64_t x_stride,
                              const float* w, int64_t T, int64_t H, cudaStream_t stream, bool pdl = false);

/// The gate of Qwen's shared expert alone, per row t: s[t] = sigmoid(x[t] . w), the value sigmoid_gated_add and the
/// MoE combine compute (one block of 256 threads per row, the same dot order), for an add done later (NormAddend::gate).
///   x: [T, H] fp32 (row stride x_stride); w: [H] fp32; s: [T] fp32. pdl: Programmatic Dependent Launch.
cudaError_t sigmoid_gate_rows(const float* x, int64_t x_stride, const float* w, int64_t T, int64_t H, float* s,
                              cudaStream_t stream, bool pdl = false);

}  // namespace ssmserve::cuda
