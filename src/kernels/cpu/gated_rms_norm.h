// Owns the gated RMSNorm of the Mamba-2 mixer on the CPU (transformers' MambaRMSNormGated; mamba_ssm's
// RMSNormGated with group_size = d_inner / n_groups): norm_before_gate = false gives
// out = rmsnorm_g(y * silu(z)) * w, true gives out = rmsnorm_g(y) * w * silu(z); rmsnorm_g normalizes each
// group of `group_size` channels by its own root mean square.
#pragma once
#include <cstdint>

namespace ssmserve::cpu {

/// y: [T, D] (row stride y_stride), z: [T, D] gate (row stride z_stride), weight: [D], out: [T, D] contiguous
/// (may alias y when y_stride == D). D must be a multiple of group_size. fp32 throughout. weight == nullptr: no norm,
/// out = y * silu(z) (Falcon-H1's mamba_rms_norm false).
void gated_rms_norm(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                    float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, float* out);

}  // namespace ssmserve::cpu
