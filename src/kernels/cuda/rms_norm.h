// Owns the GPU normalizations and the embedding gather: fused residual-add + RMSNorm (vLLM's
// fused_add_rms_norm; HF MambaRMSNorm), the Mamba-2 gated RMSNorm (transformers' MambaRMSNormGated) and the
// token embedding lookup. Framework-free: device pointers, sizes, row strides (elements), a stream; each returns
// the launch status (cudaErrorInvalidValue for bad sizes). References: kernels/cpu/rms_norm.*, gated_rms_norm.*.
// Launchers with a `pdl` argument launch with Programmatic Dependent Launch when it is set (pdl.cuh: the kernel waits
// on its predecessor in every block, then lets its successor launch); the results are the same either way.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ssmserve::cuda {

/// Token embedding gather: out[t, :] = table[ids[t], :] as fp32.
///   ids: [T] int32 (ids outside [0, vocab) give a row of zeros: the host validates ids before);
///   table: [vocab, H] row-major, dtype F32 or BF16; out: [T, H] fp32, row stride out_stride.
///   pdl: Programmatic Dependent Launch (ids are read after the wait: they may be a PDL predecessor's picks).
cudaError_t embedding(const int32_t* ids, int64_t T, const void* table, DType table_dtype, int64_t vocab, int64_t H,
                      float* out, int64_t out_stride, cudaStream_t stream, bool pdl = false);

/// Fused residual add + RMSNorm, per row t:
///   residual[t] = residual[t] + x[t]   (x == nullptr: residual[t] is used as is),
///   out[t] = residual[t] / sqrt(mean(residual[t]^2) + eps) * weight   (fp32 statistics).
///   x: [T, H] fp32 (row stride x_stride) or nullptr; residual: [T, H] fp32 in/out (row stride res_stride);
///   weight: [H] fp32; out: [T, H] in out_dtype (F32 or BF16, the next GEMM's input), row stride out_stride.
/// out must not alias x or residual unless it is fp32 with the same stride as residual and x == nullptr.
/// pdl: Programmatic Dependent Launch.
cudaError_t fused_add_rms_norm(const float* x, int64_t x_stride, float* residual, int64_t res_stride,
                               const float* weight, float eps, int64_t T, int64_t H, void* out, DType out_dtype,
                               int64_t out_stride, cudaStream_t stream, bool pdl = false);

/// Gated RMSNorm over groups of `group_size` channels (D % group_size == 0), per row t and group:
///   norm_before_gate = false: out = rmsnorm_g(y * silu(z)) * w;  true: out = rmsnorm_g(y) * w * silu(z).
///   y: [T, D] fp32 (row stride y_stride); z: [T, D] fp32 (row stride z_stride); weight: [D] fp32;
///   out: [T, D] in out_dtype (F32 or BF16), row stride out_stride (may alias y when fp32 with y's stride).
cudaError_t gated_rms_norm(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                           float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, void* out,
                           DType out_dtype, int64_t out_stride, cudaStream_t stream);

/// Row-wise copy with conversion: out[r, c] = in[r, c] for r < rows, c < cols (fp32 in; out F32 or BF16,
/// rounded to nearest even), e.g. an fp32 activation slice into the bf16 input of the next GEMM.
/// pdl: Programmatic Dependent Launch.
cudaError_t cast_rows(const float* in, int64_t in_stride, int64_t rows, int64_t cols, void* out, DType out_dtype,
                      int64_t out_stride, cudaStream_t stream, bool pdl = false);

/// Row gather: out[i, :] = in[idx[i], :] for i < n (fp32, cols wide); idx: [n] int32 device, in range.
cudaError_t gather_rows(const float* in, int64_t in_stride, const int32_t* idx, int64_t n, int64_t cols, float* out,
                        int64_t out_stride, cudaStream_t stream);

}  // namespace ssmserve::cuda
