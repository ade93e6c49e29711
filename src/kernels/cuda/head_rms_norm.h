// Owns the per-head RMSNorm of queries and keys on the GPU (Qwen3-Next / Qwen3.5's q_norm / k_norm, applied before
// RoPE; the CPU reference is cpu::rms_norm with every head's head_dim values as one row, model/mixers/attention_mixer.cpp).
// One warp per (token, head), a fixed reduction order (lane-strided partial sums, then the xor butterfly), so a row's
// result does not depend on the batch. Framework-free: device pointers, sizes, row strides (elements), a stream;
// returns the launch status (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssmserve::cuda {

/// In place, per token t and head h: x[t, h D : (h + 1) D] = x * rsqrt(mean(x^2) + eps) * weight (fp32 statistics).
///   x: [T, num_heads * head_dim] fp32, row stride x_stride (>= num_heads * head_dim); weight: [head_dim] fp32 device
///   (the effective weight, Qwen's offset 1 already added). head_dim even, 2..1024; num_heads >= 1.
cudaError_t head_rms_norm(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, const float* weight, float eps,
                          cudaStream_t stream);

/// head_rms_norm over the query and key heads of one fused projection row in one launch: x [T, (q_heads + k_heads)
/// * head_dim] fp32 (row stride x_stride >= that), heads [0, q_heads) normed with q_weight, the k_heads after them with
/// k_weight (both [head_dim] fp32 device). Each head's result is bit-identical to head_rms_norm on it alone. q_heads
/// >= 1, k_heads >= 0 (0: head_rms_norm); the other bounds as head_rms_norm's.
cudaError_t head_rms_norm_qk(float* x, int64_t x_stride, int64_t T, int q_heads, int k_heads, int head_dim, const float* q_weight,
                             const float* k_weight, float eps, cudaStream_t stream);

}  // namespace ssmserve::cuda
