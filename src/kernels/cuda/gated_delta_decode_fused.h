// Owns the Gated DeltaNet mixer's decode step between its two projections in one launch (gated_delta_decode_fused):
// the causal conv1d update + SiLU over [q | k | v], the preparation (q, k L2-normalised, g, beta), the delta-rule
// update and the per-value-head gated RMSNorm into out_proj's input, which otherwise take four launches
// (conv1d_update_dual, gated_delta_prepare, gated_delta_decode, gated_rms_norm_pdl). Each block (row, value head,
// column slice) computes its key head's q / k and its columns' v from the windows, prepares them as the prepare
// kernel does, runs the token step of the decode kernel (gated_delta_step.cuh) and writes its outputs; the last block
// of each (row, value head) runs that head's norm, the last of each (row, key head) writes its q / k windows. The
// arithmetic of each part is the separate kernel's, so the results are theirs bit for bit. Math: transformers'
// Qwen3NextGatedDeltaNet for one token (kernels/cpu/gated_delta.h). Framework-free: device pointers, sizes, row
// strides (elements), a stream; each returns the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/gated_delta.h"

namespace ssmserve::cuda {

/// Most decode rows one launch takes (the counters' rows).
inline constexpr int kGdnFusedMaxRows = 16;

/// One Gated DeltaNet layer's plain decode rows (one token each, state blocks updated in place; block 0: a padding
/// row, whose out row is written as zeros (the separate kernels' zeros up to their sign), no state read or written).
struct GdnDecodeArgs {
  const float* proj = nullptr;  ///< [rows, proj_stride] fp32: q | k | v (conv.dim) | z (Hv * Dv) | b (Hv) | a (Hv)
  int64_t proj_stride = 0;
  ConvParams conv;              ///< conv.dim = 2 Hk Dk + Hv Dv (apply_silu honoured, as the separate conv)
  GatedDeltaParams gdn;         ///< heads, head dims, the state pool (chunk_size unused)
  const float* A_log = nullptr;    ///< [Hv]
  const float* dt_bias = nullptr;  ///< [Hv]
  const int32_t* state_indices = nullptr;  ///< [rows] (device)
  float* o = nullptr;           ///< [rows, Hv * Dv] fp32 scratch: the delta rule's output before the norm
  const float* norm_weight = nullptr;  ///< [Hv * Dv] fp32 (the per-head weight repeated)
  float eps = 1e-6f;
  void* out = nullptr;          ///< [rows, out_stride] BF16: out_proj's input
  int64_t out_stride = 0;
  DType out_dtype = DType::BF16;
  /// [kGdnFusedMaxRows * (Hv + Hk)] int32 device, all 0 (each launch leaves them 0); two launches of one layer must not
  /// overlap (a stream runs them one after the other).
  int32_t* counters = nullptr;
};

/// Whether gated_delta_decode_fused takes `rows` rows: 1..kGdnFusedMaxRows rows, gated_delta_decode_supported, conv
/// width 1..8 with SiLU, conv and recurrent states of one dtype (F32 or BF16), a BF16 out, the gated norm's vectorized
/// form over each value head (gated_norm_vec_plan) within the block's threads. Else the four kernels run.
bool gated_delta_decode_fused_fits(const GdnDecodeArgs& a, int rows);

/// The decode step of `rows` rows (see the file comment), outside batch-invariant mode (the decode kernel's column
/// slices of that mode differ): bit-identical to conv1d_update_dual + gated_delta_prepare + gated_delta_decode +
/// gated_rms_norm_pdl (norm before gate) over the same rows, conv and recurrent states updated in place. pdl: the
/// kernel waits on its predecessor (the in_proj GEMM) after loading the windows, states and taps, which no kernel of
/// the step writes before it. cudaErrorInvalidValue outside gated_delta_decode_fused_fits.
cudaError_t gated_delta_decode_fused(const GdnDecodeArgs& a, int rows, cudaStream_t stream, bool pdl);

}  // namespace ssmserve::cuda
