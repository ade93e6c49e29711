// Owns the per-token arithmetic of the Mamba-2 SSD recurrence on the GPU (the sequential walk of ssd.cu's kernel and
// the fused decode step of mamba2_decode.cu), so that both compute a token bit for bit alike. Math: Mamba-2's
// selective state update (transformers' Mamba2Mixer.torch_forward, one token): dt = clamp(softplus(dt_raw + dt_bias)),
// dA = exp(dt A), state = dA state + dt x B, y = state . C + D x, per head_dim row.
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ssd.h"

namespace ssmserve::cuda::detail {

constexpr int kSsdRowsPerWarp = 4;  // head_dim rows per warp
constexpr int kSsdMaxPerLane = 8;   // d_state <= 256: lane l holds states n = l + 32 k

/// The token's step size and decay for head h from its raw dt (dt_raw: the input projection's column).
__device__ __forceinline__ void ssd_dt(const SsdParams& p, int h, float dt_raw, float& dt, float& dA) {
  const float bias = p.dt_bias ? p.dt_bias[h] : 0.0f;
  dt = softplus(dt_raw + bias);
  dt = fminf(fmaxf(dt, p.time_step_min), p.time_step_max);
  const float e = dt * p.A[h];
  dA = e < -60.0f ? 0.0f : expf(e);
}

/// One token for rows [p0, p0 + kSsdRowsPerWarp) of a head (every lane of the warp calls it): st[r][k] is row p0 + r's
/// state n = lane + 32 k (n < N). xw: the x of rows p0.. (xw[r], read where p0 + r < P); Bg / Cg: the group's B / C
/// (N each); Dh: the head's D. Updates st and returns, on lane r, row p0 + r's y (state . C summed by warp_sum, + Dh x).
__device__ __forceinline__ float ssd_token_rows(float (&st)[kSsdRowsPerWarp][kSsdMaxPerLane], int N, int P, int p0,
                                                int lane, float dt, float dA, float Dh, const float* xw,
                                                const float* Bg, const float* Cg) {
  float b[kSsdMaxPerLane], c[kSsdMaxPerLane];
#pragma unroll
  for (int k = 0; k < kSsdMaxPerLane; ++k) {
    const int n = lane + 32 * k;
    b[k] = n < N ? Bg[n] : 0.0f;
    c[k] = n < N ? Cg[n] : 0.0f;
  }
  float mine = 0.0f;  // lane r keeps row r's output
#pragma unroll
  for (int r = 0; r < kSsdRowsPerWarp; ++r) {
    const int pr = p0 + r;
    const float xv = pr < P ? xw[r] : 0.0f;
    const float dtx = dt * xv;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kSsdMaxPerLane; ++k) {
      if (32 * k < N) {  // uniform over the warp
        const float s = dA * st[r][k] + dtx * b[k];
        st[r][k] = s;
        acc += s * c[k];
      }
    }
    acc = warp_sum(acc) + Dh * xv;
    if (lane == r) mine = acc;
  }
  return mine;
}

}  // namespace ssmserve::cuda::detail
