// Owns the per-token arithmetic of the gated delta rule's one-token update on the GPU (token_step_core) and its
// state element helpers, shared by the decode kernel and the sequential prefill (gated_delta.cu) and the fused decode
// step (gated_delta_decode_fused.cu), so that all compute a token bit for bit alike. Math in kernels/cuda/gated_delta.h.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/gated_delta.h"

namespace ssmserve::cuda::gdn {

// ---- 4-element state loads / stores (16 bytes for fp32, 8 for the 16-bit types) ---------------------------------

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
/// load4 through the L2 (ld.global.cg; l2_loads.cuh): state another grid wrote, read before a PDL wait.
__device__ __forceinline__ float4 load4_cg(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load4_cg(const __nv_bfloat16* p) {
  const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void store4(__half* p, float4 v) {
  const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

constexpr int kRowsPerThread = 4;

/// Rounds 4 values to the state dtype and back: the values load4 reads after store4 wrote v.
__device__ __forceinline__ float4 round4(float4 v, float) { return v; }
__device__ __forceinline__ float4 round4(float4 v, __nv_bfloat16) {
  const float2 a = __bfloat1622float2(__floats2bfloat162_rn(v.x, v.y));
  const float2 b = __bfloat1622float2(__floats2bfloat162_rn(v.z, v.w));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 round4(float4 v, __half) {
  const float2 a = __half22float2(__floats2half2_rn(v.x, v.y)), b = __half22float2(__floats2half2_rn(v.z, v.w));
  return make_float4(a.x, a.y, b.x, b.y);
}

/// Shared memory of one block of the one-token update (block of (kCols / 4) * (kDk / 4) threads).
template <int kDk, int kCols>
struct StepSmem {
  static constexpr int kWarps = (kCols / 4) * (kDk / kRowsPerThread) / 32;
  float sq[kDk], sk[kDk];
  float red[kWarps][2 * kCols + 1];
  float su[kCols];
};

/// The arithmetic of one token of the delta rule on a block's [kDk, kCols] slice (value head h, columns col0..), shared
/// by the decode kernel, the sequential prefill and the fused decode step (gated_delta_decode_fused.cu) so all do the
/// same arithmetic per token: with this token's q, k of key head kh in sm.sq / sm.sk (every thread past a barrier
/// since they were written), e^g, beta and the slice's v (vcols[c], c < kCols), thread t holds the 4 columns cg * 4
/// .. +3 (cg = t % (kCols / 4)) of the key rows rg + (kDk / 4) i in s (in), writes this token's outputs o [kCols]
/// (threads < kCols) and returns the new state (not rounded to the state dtype) in n.
template <int kDk, int kCols>
__device__ __forceinline__ void token_step_core(float eg, float beta, const float* vcols, float* o,
                                                const float4 (&s)[kRowsPerThread], float4 (&n)[kRowsPerThread],
                                                StepSmem<kDk, kCols>& sm) {
  constexpr int kCG = kCols / 4, kRG = kDk / kRowsPerThread, kThreads = kCG * kRG, kWarps = kThreads / 32;
  static_assert(kThreads % 32 == 0 && kCG <= 32, "a warp holds whole row groups");
  const int tid = threadIdx.x, cg = tid % kCG, rg = tid / kCG;
  // 2. Partial k^T S, q^T S over this thread's rows, and q . k (the same in every column group).
  float a[4] = {0, 0, 0, 0}, bq[4] = {0, 0, 0, 0}, qk = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const float kv = sm.sk[rg + kRG * i], qv = sm.sq[rg + kRG * i];
    const float e[4] = {s[i].x, s[i].y, s[i].z, s[i].w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      a[c] = fmaf(e[c], kv, a[c]);
      bq[c] = fmaf(e[c], qv, bq[c]);
    }
    qk = fmaf(qv, kv, qk);
  }
  // 3. Reduce over the row groups: lanes of one column group within the warp, then across warps.
#pragma unroll
  for (int off = kCG; off < 32; off <<= 1) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      a[c] += __shfl_xor_sync(0xffffffffu, a[c], off);
      bq[c] += __shfl_xor_sync(0xffffffffu, bq[c], off);
    }
    qk += __shfl_xor_sync(0xffffffffu, qk, off);
  }
  const int lane = tid & 31, warp = tid >> 5;
  if (lane < kCG) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      sm.red[warp][cg * 4 + c] = a[c];
      sm.red[warp][kCols + cg * 4 + c] = bq[c];
    }
    if (lane == 0) sm.red[warp][2 * kCols] = qk;
  }
  __syncthreads();
  // 4. Per column c: u_c = beta (v_c - e^g (k^T S)_c), o_c = e^g (q^T S)_c + u_c (q . k).
  if (tid < kCols) {
    float at = 0.0f, bt = 0.0f, qkt = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      at += sm.red[w][tid];
      bt += sm.red[w][kCols + tid];
      qkt += sm.red[w][2 * kCols];
    }
    const float v = vcols[tid];
    const float u = beta * (v - eg * at);
    sm.su[tid] = u;
    o[tid] = fmaf(u, qkt, eg * bt);
  }
  __syncthreads();
  // 5. S <- e^g S + k u^T.
  const float u[4] = {sm.su[cg * 4], sm.su[cg * 4 + 1], sm.su[cg * 4 + 2], sm.su[cg * 4 + 3]};
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const float kv = sm.sk[rg + kRG * i];
    n[i] = make_float4(fmaf(kv, u[0], eg * s[i].x), fmaf(kv, u[1], eg * s[i].y), fmaf(kv, u[2], eg * s[i].z),
                       fmaf(kv, u[3], eg * s[i].w));
  }
}


/// One token of the delta rule on a block's [kDk, kCols] slice (value head h, columns col0..), as token_step_core, with
/// this token's q, k, e^g, beta and v read from `in` (token row r). after_previous: a token ran before on this block
/// (wait until it is done with the shared memory).
template <int kDk, int kCols>
__device__ __forceinline__ void token_step(const GatedDeltaInputs& in, int64_t r, int h, int kh, int col0, int Dv,
                                           float* o, const float4 (&s)[kRowsPerThread], float4 (&n)[kRowsPerThread],
                                           StepSmem<kDk, kCols>& sm, bool after_previous) {
  constexpr int kThreads = (kCols / 4) * (kDk / kRowsPerThread);
  const int tid = threadIdx.x;
  if (after_previous) __syncthreads();  // the previous token is done with sq, sk, red and su
  // 1. This token's q, k (key head kh), decay and learning rate.
  for (int i = tid; i < kDk; i += kThreads) {
    sm.sq[i] = in.q[r * in.q_stride + static_cast<int64_t>(kh) * kDk + i];
    sm.sk[i] = in.k[r * in.k_stride + static_cast<int64_t>(kh) * kDk + i];
  }
  const float eg = expf(in.g[r * in.g_stride + h]);
  const float beta = in.beta[r * in.beta_stride + h];
  __syncthreads();
  token_step_core<kDk, kCols>(eg, beta, in.v + r * in.v_stride + static_cast<int64_t>(h) * Dv + col0, o, s, n, sm);
}

}  // namespace ssmserve::cuda::gdn
