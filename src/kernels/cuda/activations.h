// Owns the elementwise GPU activations and residual steps of the decoder modules (the CUDA side of
// kernels/cpu/activations.h): SiLU in place (the lightning qkv projection), the sigmoid output gate (lightning), the dense MLP's SiLU-gated / relu^2 activation, and
// the scaled residual h = alpha x + beta y (MiniMax's residuals, muP multipliers). Framework-free: device pointers, sizes, row strides (elements), a
// stream; each returns the launch status (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ssmserve::cuda {

/// x = x * sigmoid(x) in place (cpu::silu): x [T, cols] fp32, row stride x_stride.
cudaError_t silu_inplace(float* x, int64_t x_stride, int64_t T, int64_t cols, cudaStream_t stream);

/// out = o * (1 / (1 + exp(-g))): o, g [T, cols] fp32 (row strides o_stride, g_stride); out [T, cols] in
/// out_dtype (F32 or BF16, the next GEMM's input), row stride out_stride.
cudaError_t sigmoid_gate(const float* o, int64_t o_stride, const float* g, int64_t g_stride, int64_t T, int64_t cols,
                         void* out, DType out_dtype, int64_t out_stride, cudaStream_t stream);

/// The dense MLP's activation (cpu: model/ffns/mlp_ffn.cpp): gated: out = silu(gu[:, :I]) * gu[:, I:2I] (gate then
/// up); else out = relu(gu[:, :I])^2. gu: [T, 2I or I] fp32 (row stride gu_stride); out: [T, I] in out_dtype (F32 or
/// BF16, the down projection's input), row stride out_stride.
cudaError_t mlp_activation(const float* gu, int64_t gu_stride, int64_t T, int64_t I, bool gated, void* out, DType out_dtype,
                           int64_t out_stride, cudaStream_t stream);
/// h = a * x + b * y over n contiguous fp32 elements (h may alias x or y).
cudaError_t scaled_residual(float* h, const float* x, float a, const float* y, float b, int64_t n, cudaStream_t stream);

}  // namespace ssmserve::cuda
