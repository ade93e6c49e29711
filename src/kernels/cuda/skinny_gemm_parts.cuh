// Owns the device-side parts of the skinny GEMM (skinny_gemm.cu, the only includer): its launch parameters, the W and
// x loads of a chunk, the x input forms computed in the loads (SkinnyEwInput: elementwise, e.g. the MLP activation;
// SkinnyGatedNormInput: the gated RMSNorm, with its per-block prologue) and the output epilogue form (SkinnyConvEpilogue: the Mamba-2 conv
// update). Each form computes exactly what the separate kernel it replaces computes (the shared per-element math of
// common.cuh, decode_math.cuh and gated_norm_vec.cuh), so a fused GEMM gives the unfused path's bits.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/gated_norm_vec.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve::cuda::skinny {
using namespace detail;

constexpr int kChunk = 32;  // k per chunk: two m16n8k16 steps

/// The kernel's fused forms (its FORM template argument): where x comes from and what the epilogue adds.
enum Form : int {
  kPlain = 0,         ///< x read as bf16 rows
  kEwSiluMul = 1,     ///< x = silu(a) * b (SkinnyEwInput)
  kEwRelu2 = 2,       ///< x = relu(a)^2 (SkinnyEwInput)
  kGatedNorm = 3,     ///< x = the gated RMSNorm of y, z (SkinnyGatedNormInput), after the block's prologue
  kConvEpilogue = 4,  ///< x read as bf16 rows; the conv update of y's xBC columns (SkinnyConvEpilogue)
  kEwCopy = 5,        ///< x = a (SkinnyEwInput: the cast)
  kEwSigmoidGate = 6, ///< x = a * sigmoid(b) (SkinnyEwInput)
};
/// Whether FORM is an elementwise input, and whether it reads b rows.
constexpr bool ew_form(int form) { return form == kEwSiluMul || form == kEwRelu2 || form == kEwCopy || form == kEwSigmoidGate; }
constexpr bool ew_reads_b(int form) { return form == kEwSiluMul || form == kEwSigmoidGate; }
/// Whether FORM reads x as bf16 rows.
constexpr bool plain_x(int form) { return form == kPlain || form == kConvEpilogue; }

struct Params {
  const __nv_bfloat16* x;
  int64_t xs;
  const __nv_bfloat16* w;
  int64_t ws;
  void* y;
  int64_t ys;
  bool y_bf16;
  __nv_bfloat16* y2;
  int64_t y2s;
  int M, N, K;
  int splits, chunks, chunks_per_split, tiles_per_cta, prefetch_chunks;
  int cta_splits, groups, tiles;  // splits per block; blocks (split groups) per tile; 16-row tiles
  float* partials;                // groups > 1: [m-blocks, tiles, groups, MT * 4, 32] group sums
  unsigned* counters;             // groups > 1: [m-blocks, tiles] arrivals, zero between launches
  const float* gu;    // elementwise forms: the a rows instead of x; kGatedNorm: the norm's y rows
  int64_t gus;
  const float* eb;    // elementwise forms reading b: the b rows
  int64_t ebs;
  // kGatedNorm (SkinnyGatedNormInput): z rows, weight, eps, group size and count, norm_before_gate, and the norm
  // kernel's launch shape (gated_norm_vec_plan: runs per thread, threads) whose reduction the prologue reproduces.
  const float* nz;
  int64_t nzs;
  const float* nw;
  float neps;
  int ngroup, nG, nvpt, nthreads;
  bool nbg;
  // kConvEpilogue (SkinnyConvEpilogue): the conv, y's column of channel 0, the rows' state blocks, the outputs.
  ConvParams cv;
  int64_t cv_col0;
  const int32_t* cv_idx;
  int cv_rows;
  float* cv_out;
  int64_t cv_os;
  bool late_trigger;  // PDL trigger after the main loop (SSMSERVE_SKINNY_LATE_TRIGGER=1) instead of after the wait
  bool preload;       // the first U chunks of W loaded before the PDL wait (SSMSERVE_SKINNY_PRELOAD=0: after it)
};

/// Loads of U chunks from chunk c (predicated off past c1) of W rows g / g + 8 (constant weights: may be issued
/// before the PDL wait).
template <bool VEC, int U>
__device__ __forceinline__ void load_w_chunks(uint4 (&a0)[U], uint4 (&a1)[U], const __nv_bfloat16* w0,
                                              const __nv_bfloat16* w1, bool r0ok, bool r1ok, int c, int c1, int t,
                                              int K) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = (c + u) * kChunk + 8 * t;
    const bool on = c + u < c1;
    a0[u] = load8<VEC, true>(w0, k, K, on && r0ok);
    a1[u] = load8<VEC, true>(w1, k, K, on && r1ok);
  }
}

/// Loads of U chunks from chunk c (predicated off past c1) of the MT x rows (the previous kernel's output: after
/// the PDL wait).
template <int MT, bool VEC, int U>
__device__ __forceinline__ void load_x_chunks(uint4 (&b)[U][MT], const __nv_bfloat16* const (&xr)[MT],
                                              const bool (&xok)[MT], int c, int c1, int t, int K) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = (c + u) * kChunk + 8 * t;
    const bool on = c + u < c1;
#pragma unroll
    for (int j = 0; j < MT; ++j) b[u][j] = load8<VEC, false>(xr[j], k, K, on && xok[j]);
  }
}

/// 8 bf16 x values at column k of an elementwise input (FORM: SkinnyEwInput's op on a row ar and b row br),
/// zeros past K or when !ok: the op's per-element arithmetic (mlp_act_value, sigmoid_gate_value: the replaced kernel's)
/// rounded to nearest, that kernel's bits. 16-byte loads.
template <int FORM>
__device__ __forceinline__ uint4 load8_ew(const float* ar, const float* br, int k, int K, bool ok) {
  if (!ok || k >= K) return make_uint4(0, 0, 0, 0);
  const float4 a0 = *reinterpret_cast<const float4*>(ar + k), a1 = *reinterpret_cast<const float4*>(ar + k + 4);
  float4 b0 = make_float4(0.f, 0.f, 0.f, 0.f), b1 = b0;
  if constexpr (ew_reads_b(FORM))
    b0 = *reinterpret_cast<const float4*>(br + k), b1 = *reinterpret_cast<const float4*>(br + k + 4);
  const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if constexpr (FORM == kEwSiluMul) v[i] = mlp_act_value(av[i], bv[i], true);
    else if constexpr (FORM == kEwRelu2) v[i] = mlp_act_value(av[i], 0.0f, false);
    else if constexpr (FORM == kEwSigmoidGate) v[i] = sigmoid_gate_value(av[i], bv[i]);
    else v[i] = av[i];
  }
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// Most (row, group) pairs of a block's gated-norm prologue and most warps of the norm kernel it reproduces.
constexpr int kNormPairs = 128, kNormWarps = detail::kGatedNormVecMaxThreads / 32;

/// FORM 3's prologue (after the PDL wait): inv[r * G + group] = 1 / sqrt(mean of squares + eps) for the block's rows
/// r < min(8 MT, M - m0) and every group, by the norm kernel's arithmetic (gated_norm_vec_kernel with its plan's
/// threads and runs per thread): virtual thread v sums its runs v, v + threads, ... in order (gated_norm_run); each
/// virtual warp's warp_sum, then warp_sum of the virtual warps' sums with zeros past them (block_sum's tree). Tasks
/// (pair, virtual warp) spread over the block's warps; two block barriers (every thread of the block reaches them).
template <int MT>
__device__ __forceinline__ void gated_norm_prologue(const Params& p, int m0, float* part, float* inv) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int rows = min(8 * MT, p.M - m0), G = p.nG, pairs = rows * G, nvw = p.nthreads / 32, n4 = p.ngroup / 4;
  for (int task = warp; task < pairs * nvw; task += nwarps) {
    const int pair = task / nvw, vw = task - pair * nvw, r = pair / G, grp = pair - r * G;
    const int64_t col = static_cast<int64_t>(grp) * p.ngroup;
    const float4* y4 = reinterpret_cast<const float4*>(p.gu + static_cast<int64_t>(m0 + r) * p.gus + col);
    const float4* z4 = reinterpret_cast<const float4*>(p.nz + static_cast<int64_t>(m0 + r) * p.nzs + col);
    float ss = 0.0f;
    for (int j = 0; j < p.nvpt; ++j) {
      const int i = vw * 32 + lane + j * p.nthreads;
      if (i >= n4) continue;
      float4 g, h;
      ss += detail::gated_norm_run(y4[i], z4[i], p.nbg, g, h);
    }
    ss = warp_sum(ss);
    if (lane == 0) part[pair * kNormWarps + vw] = ss;
  }
  __syncthreads();
  for (int pair = warp; pair < pairs; pair += nwarps) {
    float r = lane < nvw ? part[pair * kNormWarps + lane] : 0.0f;
    r = warp_sum(r);
    if (lane == 0) inv[pair] = 1.0f / sqrtf(r / static_cast<float>(p.ngroup) + p.neps);
  }
  __syncthreads();
}

/// 8 bf16 x values of a gated-norm row at column k (its y row yr, z row zr, the row's inverse rms per group invr):
/// gated_norm_out rounded to nearest, the bits gated_norm_vec_kernel stores; zeros past K or when !ok.
__device__ __forceinline__ uint4 load8_norm(const Params& p, const float* yr, const float* zr, const float* invr, int k,
                                            int K, bool ok) {
  if (!ok || k >= K) return make_uint4(0, 0, 0, 0);
  const float inv = invr[k / p.ngroup];
  uint32_t w[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float4 yv = *reinterpret_cast<const float4*>(yr + k + 4 * h), zv = *reinterpret_cast<const float4*>(zr + k + 4 * h);
    float4 g, hv;
    (void)detail::gated_norm_run(yv, zv, p.nbg, g, hv);
    const float4 v = detail::gated_norm_out(hv, g, inv, *reinterpret_cast<const float4*>(p.nw + k + 4 * h), p.nbg);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    w[2 * h] = *reinterpret_cast<const uint32_t*>(&lo), w[2 * h + 1] = *reinterpret_cast<const uint32_t*>(&hi);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// Where a warp's x rows come from: bf16 rows (plain_x forms), elementwise rows (a, and b when the op reads it),
/// gated-norm rows (a = y, b = z, inv = the row's inverse rms per group).
template <int MT>
struct XRows {
  const __nv_bfloat16* x[MT];
  const float* a[MT];
  const float* b[MT];
  const float* inv[MT];
  bool ok[MT];
};

/// The x loads of U chunks for the kernel's input form FORM (see XRows).
template <int MT, bool VEC, int U, int FORM>
__device__ __forceinline__ void load_x_form(uint4 (&b)[U][MT], const XRows<MT>& r, const Params& p, int c, int c1,
                                            int t) {
  if constexpr (plain_x(FORM)) {
    load_x_chunks<MT, VEC, U>(b, r.x, r.ok, c, c1, t, p.K);
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = (c + u) * kChunk + 8 * t;
      const bool on = c + u < c1;
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        if constexpr (FORM == kGatedNorm) b[u][j] = load8_norm(p, r.a[j], r.b[j], r.inv[j], k, p.K, on && r.ok[j]);
        else b[u][j] = load8_ew<FORM>(r.a[j], r.b[j], k, p.K, on && r.ok[j]);
      }
    }
  }
}


/// kConvEpilogue's step for y[m, n] = v: when n is channel c = n - col0 of the conv and m one of its rows with a state
/// block, conv1d_update_dual's update of that channel on v (conv_update_channel, in place) into cv_out[m, c].
__device__ __forceinline__ void conv_epilogue(const Params& p, int m, int n, float v) {
  const int64_t c = n - p.cv_col0;
  if (c < 0 || c >= p.cv.dim || m >= p.cv_rows) return;
  const int32_t blk = p.cv_idx[m];
  if (blk == 0) return;  // a padding row
  const float* w = p.cv.weight + c * p.cv.width;
  const float bias = p.cv.bias ? p.cv.bias[c] : 0.0f;
  const int64_t at = static_cast<int64_t>(blk) * p.cv.conv_states.block_stride + c;
  float r;
  if (p.cv.conv_states.dtype == DType::BF16)
    r = conv_update_channel(static_cast<__nv_bfloat16*>(p.cv.conv_states.data) + at, p.cv.dim, p.cv.width, w, bias, v,
                            p.cv.apply_silu);
  else
    r = conv_update_channel(static_cast<float*>(p.cv.conv_states.data) + at, p.cv.dim, p.cv.width, w, bias, v,
                            p.cv.apply_silu);
  p.cv_out[static_cast<int64_t>(m) * p.cv_os + c] = r;
}

}  // namespace ssmserve::cuda::skinny
