// Owns the fused small kernels of the GPU decode path (issue 7, decode latency): each one replaces a kernel plus
// a cast launch of the first version and is launched with Programmatic Dependent Launch (pdl.cuh) so its start
// overlaps the previous kernel's tail. Per row they compute exactly what the kernels they replace compute
// (rms_norm.h, causal_conv1d.h, selective_scan.h: same operation order), plus a bf16 copy for the next GEMM.
// Framework-free: device pointers, sizes, row strides (elements), a stream; each returns the launch status
// (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/device_decode_rows.h"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve::cuda {

/// Rows add_rms_norm_rows adds to its x before the residual step: a MoE layer's shared-expert rows left to the next
/// norm (CudaModule::take_pending_add), each value the one the add's own launch would have stored: x + rows, rounded
/// once (scaled_residual(x, x, 1, rows, 1)). rows: [*, H] fp32 (row stride `stride`), read at the norm's source row r.
/// (Qwen's sigmoid-gated add here too was measured slower, -2.3% on Qwen3.5-35B-A3B, and removed: docs/benchmarks.md
/// session 40.)
struct NormAddend {
  const float* rows = nullptr;  ///< null: nothing added
  int64_t stride = 0;
  /// [rows] per source row r, or null: x + gate[r] * rows[r] rounded once (one FMA: the MoE combine's gated shared add,
  /// sigmoid_gate_rows' s) instead of x + rows[r].
  const float* gate = nullptr;
};

/// Residual add + RMSNorm with a fixed reduction shape (256 threads per row, whatever the number of rows; rows of
/// H % 4 == 0, H <= 8192 with 16-byte aligned rows load as float4 slots, all at once), per
/// output row i with source row r = rows ? rows[i] : i:
///   v = x ? residual_step(residual[r], residual_scale, x[r], x_scale) : residual[r];  if (write_residual) residual[r] = v;
/// (residual_step, common.cuh: residual * residual_scale + x * x_scale as scaled_residual rounds it; the plain sum
/// residual + x with the default scales: a sublayer's scaled residual taken over by the next norm.)
///   out[i] = v / sqrt(mean(v^2) + eps) * weight   (fp32 statistics; out in out_dtype F32 or BF16).
///   x: [*, H] fp32 (row stride x_stride) or nullptr; residual: [*, H] fp32; weight: [H] fp32; rows: [n] int32
///   device (the LM head's logits_indices) or nullptr; out: [n, H], row stride out_stride.
/// write_residual must be false when `rows` is given. pdl: see pdl.cuh. out_bf16: optional [n, H] bf16 copy of an
/// F32 out (row stride out_bf16_stride), each value the bf16 rounding of the stored fp32 one (cast_rows' store):
/// one launch for a sublayer whose modules read both forms. add: rows added to x first (NormAddend; x required).
cudaError_t add_rms_norm_rows(const float* x, int64_t x_stride, float* residual, int64_t res_stride,
                              const float* weight, float eps, const int32_t* rows, int64_t n, int64_t H,
                              bool write_residual, void* out, DType out_dtype, int64_t out_stride, bool pdl,
                              cudaStream_t stream, float residual_scale = 1.0f, float x_scale = 1.0f,
                              void* out_bf16 = nullptr, int64_t out_bf16_stride = 0, const NormAddend& add = {});

/// causal_conv1d_update (causal_conv1d.h) over `batch` decode rows (device_decode_rows.h: a plain row is one input
/// and its window updated in place; a speculative verify row's tokens go one after another, token j reading column
/// j - 1's window and writing column j's) that also writes out_bf16 [tokens, dim] (row stride out_bf16_stride), the
/// bf16 rounding of `out` (x_proj's input), or skips it when out_bf16 is nullptr. x, out: [tokens, dim] (token rows
/// as `rows` gives them). Per token the arithmetic is the CPU kernel's (kernels/cpu/causal_conv1d.h).
cudaError_t conv1d_update_dual(const float* x, int64_t x_stride, float* out, int64_t out_stride, void* out_bf16,
                               int64_t out_bf16_stride, const ConvParams& p, DeviceDecodeRows rows, int batch,
                               bool pdl, cudaStream_t stream);

/// selective_state_update (selective_scan.h: D skip, SiLU(z) gate) over `batch` decode rows (device_decode_rows.h:
/// a plain row's state updated in place; a verify row's tokens one after another, token j reading column j - 1's
/// state and writing column j's) writing y [tokens, dim] in y_dtype (F32 or BF16: out_proj's input), row stride
/// y_stride. Null rows (block 0) are skipped.
cudaError_t selective_state_update_out(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                       int64_t y_stride, DeviceDecodeRows rows, int batch, bool pdl,
                                       cudaStream_t stream);

/// gated_rms_norm (rms_norm.h: the Mamba-2 gated RMSNorm over groups, same operation order) launched with
/// Programmatic Dependent Launch when `pdl` is set.
cudaError_t gated_rms_norm_pdl(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                               float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, void* out,
                               DType out_dtype, int64_t out_stride, bool pdl, cudaStream_t stream);

/// Prefetches the device range [p, p + bytes) into L2 (no result; issue 7: the next GEMM's weights streamed
/// while the decode's latency-bound kernels run on another graph branch). mode 0: one prefetch.global.L2 per
/// 128-byte line; 1: the same with the L2::evict_last policy; 2: TMA bulk prefetches (cp.async.bulk.prefetch.L2,
/// 64 KB pieces). blocks: grid size (>= 1; a few blocks suffice: the prefetches do not wait for the data).
/// cudaErrorInvalidValue for a bad mode / grid; nothing is launched for bytes == 0.
cudaError_t l2_prefetch(const void* p, size_t bytes, int mode, int blocks, cudaStream_t stream);

}  // namespace ssmserve::cuda
