// Owns the Mamba-2 mixer's decode step between its two projections in one launch (mamba2_decode_fused): the causal
// conv1d update + SiLU over xBC, the SSD state update and the gated RMSNorm into out_proj's input, which otherwise
// take three launches (conv1d_update_dual, ssd_state_update, gated_rms_norm_pdl). Each block computes its x rows' and
// its group's B / C conv outputs from the windows, the SSD update of its head_dim rows, and writes y; the last block
// of each (row, group) to finish (an arrival counter) writes the group's B / C windows and runs the group's norm. The
// arithmetic of each part is the separate kernel's (decode_math.cuh, ssd_decode_math.cuh, gated_norm_vec.cuh), so
// the results are theirs bit for bit. Math: transformers' Mamba2Mixer.torch_forward for one token (kernels/cpu).
// Framework-free: device pointers, sizes, row strides (elements), a stream; each returns the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/ssd.h"

namespace ssmserve::cuda {

/// Most decode rows one launch takes (the counters' rows; larger decode batches take the wide SSD kernel).
inline constexpr int kMamba2FusedMaxRows = 16;

/// One Mamba-2 layer's plain decode rows (one token each, state blocks updated in place; block 0: a padding row, whose
/// out row is written as zeros, no state read or written).
struct Mamba2DecodeArgs {
  const float* proj = nullptr;  ///< [rows, proj_stride] fp32: z (d_inner) | xBC (conv.dim) | dt (num_heads) per row
  int64_t proj_stride = 0;
  ConvParams conv;              ///< conv.dim = d_inner + 2 * n_groups * d_state; apply_silu
  SsdParams ssd;                ///< heads, head_dim, groups, d_state <= 256, A, D, dt_bias, ssm_states
  const int32_t* state_indices = nullptr;  ///< [rows] state block of each row (device)
  float* y = nullptr;           ///< [rows, d_inner] fp32 scratch: the SSD output before the norm
  const float* norm_weight = nullptr;  ///< [d_inner] fp32, the gated RMSNorm's weight
  float eps = 1e-6f;
  bool norm_before_gate = false;
  void* out = nullptr;          ///< [rows, out_stride] in out_dtype (BF16): out_proj's input
  int64_t out_stride = 0;
  DType out_dtype = DType::BF16;
  /// [kMamba2FusedMaxRows * n_groups] int32 device, all 0 (each launch leaves them 0); two launches of one layer must not
  /// overlap (a stream runs them one after the other).
  int32_t* counters = nullptr;
};

/// Whether mamba2_decode_fused takes `rows` rows of this layer: 1..kMamba2FusedMaxRows rows, d_state <= 256,
/// head_dim <= 4096, conv width 1..8, conv and SSM states of one dtype (F32 or BF16), a BF16 out, and the gated norm's
/// vectorized form (gated_norm_vec_plan: 16-byte aligned rows and weights, strides and the group a multiple of 4,
/// group <= 8192), with the norm's group d_inner / n_groups (the SSD's groups). Else the three kernels run.
bool mamba2_decode_fused_fits(const Mamba2DecodeArgs& a, int rows);

/// The decode step of `rows` rows (see the file comment): bit-identical to conv1d_update_dual (fp32 xBC out) +
/// ssd_state_update + gated_rms_norm_pdl over the same rows, conv and SSM states updated in place. pdl: the kernel
/// waits on its predecessor (the in_proj GEMM) after loading the rows' windows, states and weights, which no kernel
/// of the step writes before it. cudaErrorInvalidValue outside mamba2_decode_fused_fits.
cudaError_t mamba2_decode_fused(const Mamba2DecodeArgs& a, int rows, cudaStream_t stream, bool pdl);

}  // namespace ssmserve::cuda
