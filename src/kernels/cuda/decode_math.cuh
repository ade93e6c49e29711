// Owns the per-element math the decode kernels share, so that a fused kernel computes exactly (bit for bit) what
// the separate kernels it replaces compute: the bf16 tensor-core step of the skinny GEMM (mma.sync m16n8k16 with
// its 8-value loads), the causal-conv1d decode update of one channel, and the selective state update of one
// (row, channel) over a group of lanes. Device-only helpers; included by skinny_gemm.cu and decode_ops.cu.
#pragma once
#include "kernels/cuda/common.cuh"

#include <cstdint>

namespace ssmserve::cuda::detail {

/// c += A B on tensor cores (m16n8k16, bf16 operands, fp32 accumulators).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// 8 consecutive bf16 of `row` from column k (zeros past `K` or when !ok). VEC: one 16-byte load (row and k
/// 16-byte aligned, K % 8 == 0); STREAM: weights read once, bypassing L1.
template <bool VEC, bool STREAM>
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* row, int k, int K, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!ok || k >= K) return v;
  if constexpr (VEC) {
    if constexpr (STREAM) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(row + k));
    } else {
      v = *reinterpret_cast<const uint4*>(row + k);
    }
  } else {
    uint16_t h[8];
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = k + i < K ? r[k + i] : 0;
    v.x = h[0] | (uint32_t(h[1]) << 16), v.y = h[2] | (uint32_t(h[3]) << 16);
    v.z = h[4] | (uint32_t(h[5]) << 16), v.w = h[6] | (uint32_t(h[7]) << 16);
  }
  return v;
}

/// The two mma steps of one 32-wide k chunk (the skinny GEMM's fixed k order): a0 / a1 the 8 values of W rows
/// g and g + 8, b the 8 values of the x row, all at k = chunk * 32 + 8 t.
__device__ __forceinline__ void mma_chunk(float (&c)[4], const uint4& a0, const uint4& a1, const uint4& b) {
  mma_bf16(c, a0.x, a1.x, a0.y, a1.y, b.x, b.y);
  mma_bf16(c, a0.z, a1.z, a0.w, a1.w, b.z, b.w);
}

constexpr int kConvMaxWidth = 8;

/// The decode conv of one channel from its window in registers: win[0..S) (S = width - 1, oldest first), the taps
/// w[0..width), the new input xv. Order: bias, then taps oldest to newest (causal_conv1d.cu's), then SiLU.
__device__ __forceinline__ float conv_window_output(const float (&w)[kConvMaxWidth], float bias,
                                                   const float (&win)[kConvMaxWidth], int width, float xv,
                                                   bool apply_silu) {
  const int S = width - 1;
  float acc = bias;
#pragma unroll
  for (int k = 0; k < kConvMaxWidth; ++k) {  // static indices: w and win stay in registers
    if (k > S) break;
    acc = fmaf(w[k], k < S ? win[k] : xv, acc);
  }
  return apply_silu ? silu(acc) : acc;
}

/// causal_conv1d_update for one channel c of one row: window = src[0..S) (S = width - 1, element k at src[k * dim]),
/// new input xv; returns the (SiLU'd) output (conv_window_output) and writes the shifted window to dst (dst == src:
/// in place; a speculative verify token writes the next column's window).
template <class TS>
__device__ __forceinline__ float conv_update_channel(const TS* src, TS* dst, int64_t dim, int width, const float* w_row,
                                                     float bias, float xv, bool apply_silu) {
  const int S = width - 1;
  float win[kConvMaxWidth], w[kConvMaxWidth];
#pragma unroll
  for (int k = 0; k < kConvMaxWidth; ++k) {
    if (k > S) break;
    w[k] = w_row[k];
    if (k < S) win[k] = load(src + k * dim);
  }
  const float out = conv_window_output(w, bias, win, width, xv, apply_silu);
#pragma unroll
  for (int k = 0; k < kConvMaxWidth - 1; ++k) {
    if (k >= S) break;
    store(dst + k * dim, k + 1 < S ? win[k + 1] : xv);
  }
  return out;
}
/// The in-place form (a plain decode row).
template <class TS>
__device__ __forceinline__ float conv_update_channel(TS* state, int64_t dim, int width, const float* w_row, float bias,
                                                     float xv, bool apply_silu) {
  return conv_update_channel(static_cast<const TS*>(state), state, dim, width, w_row, bias, xv, apply_silu);
}

constexpr int kScanMaxPerLane = 8;

/// Selective state update of one (row, channel) by a group of `lanes` lanes (a power of two <= 32, >= N / 8;
/// every lane of the warp must call it: the sum uses shuffles): dst[n] = exp(dt A[n]) src[n] + dt B[n] u
/// for n = lane + k * lanes, returns sum_n dst[n] C[n] (valid on every lane of the group). dt already has its
/// bias and softplus. dst == src: in place; a speculative verify token writes the next column. on = false: no
/// loads / stores, returns 0.
template <class TS>
__device__ __forceinline__ float scan_update_channel(const TS* src, TS* dst, const float* A_row, const float* Bt,
                                                     const float* Ct, int N, float dt, float u, int lane, int lanes,
                                                     bool on) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kScanMaxPerLane; ++k) {
    const int n = lane + k * lanes;
    if (n < N) {
      const float a = on ? A_row[n] : 0.0f;
      const float st = on ? load(src + n) : 0.0f;
      const float sn = expf(dt * a) * st + dt * Bt[n] * u;
      if (on) store(dst + n, sn);
      acc += sn * Ct[n];
    }
  }
  for (int o = lanes >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o, lanes);
  return acc;
}
/// The in-place form (a plain decode row).
template <class TS>
__device__ __forceinline__ float scan_update_channel(TS* state, const float* A_row, const float* Bt, const float* Ct,
                                                     int N, float dt, float u, int lane, int lanes, bool on) {
  return scan_update_channel(static_cast<const TS*>(state), state, A_row, Bt, Ct, N, dt, u, lane, lanes, on);
}

/// L2 prefetch of bytes [0, bytes) of `base` spread over the whole grid (128-byte lines; a hint: never faults
/// beyond what a load of the same address would).
__device__ __forceinline__ void prefetch_l2_grid(const void* base, size_t bytes) {
  if (!base || bytes == 0) return;
  const size_t lines = (bytes + 127) / 128;
  const size_t nthreads = static_cast<size_t>(gridDim.x) * gridDim.y * gridDim.z * blockDim.x;
  const size_t tid = (static_cast<size_t>(blockIdx.z) * gridDim.y * gridDim.x +
                      static_cast<size_t>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const char* b = static_cast<const char*>(base);
  for (size_t l = tid; l < lines; l += nthreads) asm volatile("prefetch.global.L2 [%0];" ::"l"(b + l * 128));
}

}  // namespace ssmserve::cuda::detail
