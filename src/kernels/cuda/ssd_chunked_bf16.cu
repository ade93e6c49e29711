// Owns the bf16 tensor-core tiles of the chunked Mamba-2 SSD prefill (SsdParams::bf16_products; math in
// ssd_chunked.cu's header comment). mma.sync m16n8k16 (bf16 operands, fp32 accumulation), operands staged through
// a 3-stage cp.async pipeline (16-byte copies) and read with ldmatrix (mma_bf16.cuh):
//   convert      x, B, C (fp32 rows of the call) -> bf16 copies, head_dim padded to 64 and d_state to 128 with zeros
//                (16-byte aligned rows whatever the input strides), unless the caller passes bf16 copies
//                (SsdInputs::x_h ..., e.g. the conv's bf16 output; ssd_uses_bf16_copies);
//   C B^T        fp32 out, from the bf16 B and C;
//   chunk state  S_c[p, n] = sum_l (x[l, p] w_l) B[l, n], w_l = dt_l exp(cs_last - cs_l): the x fragments (from
//                ldmatrix.trans) scaled by w in fp32 and re-rounded; 64 x 128 output tile per CTA;
//   chunk scan   y[l, p] = exp(cs_l) sum_n C[l, n] s_in[p, n] (row factor applied to the accumulator)
//                         + sum_{s <= l} (CB[l, s] exp(cs_l - cs_s) dt_s) x[s, p] + D x[l, p]  (bf16 x).
//                The decayed CB operand is built in registers from the fp32 C B^T tile, one exponential per
//                element (factoring exp(cs_l - cs_s) into row and column factors per 16-token block measured no
//                faster on the H200: 0.406 vs 0.394 ms for the 1 x 8192 mamba2-2.7b chunk scan; removed).
// Rounding: x, B, C, the decayed CB, x * w and s_in are rounded to bf16 (2^-9 relative each): relative error of y
// ~2e-3 on random inputs (op harness, H200; its bound is 1e-2).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/ssd_chunked_common.cuh"

namespace ssmserve::cuda::detail {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kStages = 3;   // cp.async pipeline depth
constexpr int kSliceK = 32;  // tokens per pipeline slice (two k16 steps)
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// A bf16 pair times (w.x, w.y) in fp32, re-rounded.
__device__ __forceinline__ uint32_t scale_pair(uint32_t v, float2 w) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  return pack_bf16(f.x * w.x, f.y * w.y);
}

/// One warp's [16, 64] tile product: acc[8][4] (m16n8 fragments, columns 8 f..) += A[wr .. wr + 16, 0 .. nk) B^T
/// with A and B bf16 [rows][ld] in shared memory (B's 64 rows are the output columns), nk a multiple of 16.
__device__ __forceinline__ void warp_rows_x_nk(float (&acc)[8][4], const bf16* sA, const bf16* sB, int ld, int wr, int nk) {
  for (int k = 0; k < nk; k += 16) {
    uint32_t a[4];
    load_a(a, sA, ld, wr, k);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t b[4];
      load_b_nk(b, sB, ld, k, 16 * j);
      mma_bf16(acc[2 * j], a, b[0], b[1]);
      mma_bf16(acc[2 * j + 1], a, b[2], b[3]);
    }
  }
}

// ---- convert ----------------------------------------------------------------------------------------------------

/// Grid (nchunks * L), 256 threads: token row t < cu_chunk_seqlen[nchunks], in bf16 pairs.
__global__ void __launch_bounds__(256) convert_kernel(SsdInputs in, SsdParams p, ChunkMetadataDev m, SsdWs ws,
                                                      bf16* __restrict__ xh, bf16* __restrict__ bh,
                                                      bf16* __restrict__ ch) {
  const int64_t t = blockIdx.x;
  if (t >= m.cu_chunk_seqlen[m.nchunks]) return;
  const int H = p.num_heads, P = p.head_dim, G = p.n_groups, N = p.d_state, Pp = ws.Pp, Np = ws.Np;
  const int nx = H * Pp / 2, nb = G * Np / 2;  // pairs per row
  const float* x = in.x.data + t * in.x.stride;
  const float* B = in.B.data + t * in.B.stride;
  const float* C = in.C.data + t * in.C.stride;
  __nv_bfloat162* xo = reinterpret_cast<__nv_bfloat162*>(xh + t * ws.xh_stride);
  __nv_bfloat162* bo = reinterpret_cast<__nv_bfloat162*>(bh + t * ws.bh_stride);
  __nv_bfloat162* co = reinterpret_cast<__nv_bfloat162*>(ch + t * ws.ch_stride);
  for (int i = threadIdx.x; i < nx + 2 * nb; i += 256) {
    float a = 0.0f, b = 0.0f;
    if (i < nx) {
      const int e = 2 * i, h = e / Pp, pp = e - h * Pp;
      if (pp < P) a = x[h * P + pp];
      if (pp + 1 < P) b = x[h * P + pp + 1];
      xo[i] = __floats2bfloat162_rn(a, b);
    } else {
      const bool isc = i >= nx + nb;
      const int j = i - nx - (isc ? nb : 0), e = 2 * j, g = e / Np, n = e - g * Np;
      const float* src = (isc ? C : B) + g * N;
      if (n < N) a = src[n];
      if (n + 1 < N) b = src[n + 1];
      (isc ? co : bo)[j] = __floats2bfloat162_rn(a, b);
    }
  }
}

// ---- chunk state ------------------------------------------------------------------------------------------------

constexpr int kStM = 64, kStN = 128, kStThreads = 256;
constexpr int kStLdX = kStM + 8, kStLdB = kStN + 8;  // bf16 row strides: odd multiples of 16 bytes (ldmatrix)

/// Grid (nchunks, H, (Pp / 64) * (Np / 128)), 256 threads: warp w owns rows (w & 3) * 16 (head_dim) and columns
/// (w >> 2) * 64 (d_state) of the 64 x 128 tile at (p0, n0).
__global__ void __launch_bounds__(kStThreads) chunk_state_kernel(SsdParams p, ChunkMetadataDev m, SsdWs ws) {
  const int c = blockIdx.x, h = blockIdx.y;
  if (!chunk_live(m, c)) return;
  const int P = p.head_dim, N = p.d_state, H = p.num_heads, G = p.n_groups, L = m.chunk_size;
  const int len = chunk_tokens(m, c), Pp = ws.Pp, Np = ws.Np;
  const int pt = Pp / kStM, p0 = (blockIdx.z % pt) * kStM, n0 = (blockIdx.z / pt) * kStN;
  const int g = h / (H / G);
  const int64_t t0 = m.cu_chunk_seqlen[c], ch = static_cast<int64_t>(c) * H + h;
  __shared__ alignas(16) float sw[kSsdMaxChunk];
  __shared__ alignas(16) bf16 sx[kStages][kSliceK][kStLdX];  // [k = token][m = head_dim]
  __shared__ alignas(16) bf16 sb[kStages][kSliceK][kStLdB];  // [k = token][n = d_state]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const float csl = ws.cs_last[ch];
  for (int l = tid; l < kSsdMaxChunk; l += kStThreads)
    sw[l] = l < len ? ws.dt[ch * L + l] * __expf(csl - ws.cs[ch * L + l]) : 0.0f;
  const int nsl = (len + kSliceK - 1) / kSliceK;
  const auto issue = [&](int sl) {
    if (sl < nsl) {
      const int k0 = sl * kSliceK, st = sl % kStages;
      {  // x: 32 rows x 8 pieces of 8 bf16
        const int r = tid >> 3, q = (tid & 7) * 8;
        const bool ok = k0 + r < len;
        const bf16* src = ws.xh + (t0 + k0 + r) * ws.xh_stride + h * Pp + p0 + q;
        cp_async16(&sx[st][r][q], ok ? src : ws.xh, ok ? 16 : 0);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // B: 32 rows x 16 pieces
        const int i = tid + j * kStThreads, r = i >> 4, q = (i & 15) * 8;
        const bool ok = k0 + r < len;
        const bf16* src = ws.bh + (t0 + k0 + r) * ws.bh_stride + g * Np + n0 + q;
        cp_async16(&sb[st][r][q], ok ? src : ws.bh, ok ? 16 : 0);
      }
    }
    cp_async_commit_group();
  };
  float acc[8][4] = {};
  const int m0 = (warp & 3) * 16, nb = (warp >> 2) * 64;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int sl = 0; sl < nsl; ++sl) {
    cp_async_wait_group<kStages - 2>();
    __syncthreads();  // slice sl landed for every thread; slice sl - 1's stage is consumed
    issue(sl + kStages - 1);
    const int st = sl % kStages;
#pragma unroll
    for (int kk = 0; kk < kSliceK; kk += 16) {
      const int k = sl * kSliceK + kk;
      uint32_t a[4];
      load_a_t(a, &sx[st][0][0], kStLdX, m0, kk);
      // a0, a1 hold tokens k + 2t, +1; a2, a3 tokens k + 2t + 8, +9.
      const float2 w0 = *reinterpret_cast<const float2*>(&sw[k + 2 * tq]);
      const float2 w1 = *reinterpret_cast<const float2*>(&sw[k + 2 * tq + 8]);
      a[0] = scale_pair(a[0], w0), a[1] = scale_pair(a[1], w0);
      a[2] = scale_pair(a[2], w1), a[3] = scale_pair(a[3], w1);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[4];
        load_b_kn(b, &sb[st][0][0], kStLdB, kk, nb + 16 * j);
        mma_bf16(acc[2 * j], a, b[0], b[1]);
        mma_bf16(acc[2 * j + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait_group<0>();
  float* out = ws.states + ch * P * N;
  const int gq = lane >> 2;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int pp = p0 + m0 + gq + (r >= 2 ? 8 : 0), n = n0 + nb + 8 * j + 2 * tq + (r & 1);
      if (pp < P && n < N) out[static_cast<int64_t>(pp) * N + n] = acc[j][r];
    }
}

// ---- C B^T ------------------------------------------------------------------------------------------------------

constexpr int kCbThreads = 128, kCbTile = 64;
inline int cb_smem_bytes(int N) { return 2 * kCbTile * ((N + 15) / 16 * 16 + 8) * 2; }

/// Grid (nchunks, G, ceil(L / 64)^2), 128 threads: CB[l, s] = C_l . B_s for the 64 x 64 tiles on or below the
/// diagonal, the whole d_state extent staged at once; warp w owns rows l0 + 16 w .. + 16.
__global__ void __launch_bounds__(kCbThreads) cb_kernel(SsdParams p, ChunkMetadataDev m, SsdWs ws) {
  const int c = blockIdx.x, g = blockIdx.y;
  if (!chunk_live(m, c)) return;
  const int L = m.chunk_size, len = chunk_tokens(m, c), nt = (L + kCbTile - 1) / kCbTile, N = p.d_state;
  const int l0 = (blockIdx.z / nt) * kCbTile, s0 = (blockIdx.z % nt) * kCbTile;
  if (s0 > l0 || l0 >= len) return;
  const int64_t t0 = m.cu_chunk_seqlen[c];
  const int nk = (N + 15) / 16 * 16, ld = nk + 8, pieces = nk / 8, Np = ws.Np;
  extern __shared__ __align__(16) unsigned char dyn[];
  bf16* sC = reinterpret_cast<bf16*>(dyn);  // [64 rows l][ld]
  bf16* sB = sC + kCbTile * ld;             // [64 rows s][ld]
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  for (int i = tid; i < kCbTile * pieces; i += kCbThreads) {
    const int r = i / pieces, q = (i - r * pieces) * 8;  // q < nk <= Np: padded columns are zeros
    const bool okc = l0 + r < len, okb = s0 + r < len;
    cp_async16(sC + r * ld + q, okc ? ws.ch + (t0 + l0 + r) * ws.ch_stride + g * Np + q : ws.ch, okc ? 16 : 0);
    cp_async16(sB + r * ld + q, okb ? ws.bh + (t0 + s0 + r) * ws.bh_stride + g * Np + q : ws.bh, okb ? 16 : 0);
  }
  cp_async_commit_group();
  cp_async_wait_group<0>();
  __syncthreads();
  const int wr = 16 * warp;
  if (l0 + wr >= len) return;
  float acc[8][4] = {};
  warp_rows_x_nk(acc, sC, sB, ld, wr, nk);
  float* out = ws.cb + (static_cast<int64_t>(c) * p.n_groups + g) * L * L;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int l = l0 + wr + gq + (r >= 2 ? 8 : 0), s = s0 + 8 * j + 2 * tq + (r & 1);
      if (l < len && s < len) out[static_cast<int64_t>(l) * L + s] = acc[j][r];
    }
}

// ---- chunk scan -------------------------------------------------------------------------------------------------

constexpr int kScThreads = 128, kScTile = 64;
constexpr int kScLdCb = kSliceK + 8;   // fp32 C B^T slice row stride: float2 fragment reads conflict free
constexpr int kScLdX = kScTile + 8;    // bf16 x slice row stride
constexpr int kScStageBytes = kScTile * kScLdCb * 4 + kSliceK * kScLdX * 2;
/// Dynamic shared memory of the chunk scan: the intra-chunk pipeline, or (first, aliased) the C and s_in tiles.
inline int scan_smem_bytes(int N) {
  const int nk = (N + 15) / 16 * 16;
  const int inter = 2 * kScTile * (nk + 8) * 2;
  return inter > kStages * kScStageBytes ? inter : kStages * kScStageBytes;
}

/// Grid (nchunks, H, ceil(L / 64) * (Pp / 64)), 128 threads: y rows [l0, l0 + 64) x head_dim columns
/// [p0, p0 + 64) of head h; warp w owns rows l0 + 16 w .. + 16 and all 64 columns.
__global__ void __launch_bounds__(kScThreads, 4) chunk_scan_kernel(SsdInputs in, SsdParams p, ChunkMetadataDev m, SsdWs ws,
                                                                float* __restrict__ y, int64_t y_stride) {
  const int c = blockIdx.x, h = blockIdx.y;
  if (!chunk_live(m, c)) return;
  const int P = p.head_dim, N = p.d_state, H = p.num_heads, G = p.n_groups, L = m.chunk_size;
  const int len = chunk_tokens(m, c), nt = (L + kScTile - 1) / kScTile;
  const int l0 = (blockIdx.z % nt) * kScTile, p0 = (blockIdx.z / nt) * kScTile;
  if (l0 >= len) return;
  const int g = h / (H / G), seq = m.seq_idx[c];
  const bool has_state = (c > 0 && m.seq_idx[c - 1] == seq) || m.has_initial_states[seq] != 0;
  const int64_t t0 = m.cu_chunk_seqlen[c], ch = static_cast<int64_t>(c) * H + h;
  const int lmax = min(len, l0 + kScTile), Pp = ws.Pp, Np = ws.Np;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = 16 * warp;                // the warp's first row in the tile
  const bool warp_live = l0 + wr < len;    // else its rows are all past the chunk (not stored)
  __shared__ alignas(16) float scs[kSsdMaxChunk];   // cs * log2(e), 0 past lmax
  __shared__ alignas(16) float sdt[kSsdMaxChunk];   // dt, 0 past lmax
  extern __shared__ __align__(16) unsigned char dyn[];
  for (int l = tid; l < kSsdMaxChunk; l += kScThreads) {
    const bool ok = l < lmax;
    scs[l] = ok ? ws.cs[ch * L + l] * kLog2e : 0.0f;
    sdt[l] = ok ? ws.dt[ch * L + l] : 0.0f;
  }
  __syncthreads();
  float acc[8][4] = {};

  // Inter-chunk: acc = C[l, :] s_in[p, :]^T, then rows times exp(cs_l).
  if (has_state) {
    const int nk = (N + 15) / 16 * 16, ld = nk + 8, pieces = nk / 8;
    bf16* sC = reinterpret_cast<bf16*>(dyn);  // [64 rows][ld]
    bf16* sS = sC + kScTile * ld;             // [64 head_dim rows][ld]
    const bf16* sin = ws.states_h + ch * P * N;
    for (int i = tid; i < kScTile * pieces; i += kScThreads) {
      const int r = i / pieces, q = (i - r * pieces) * 8;
      const bool okc = l0 + r < len;  // Np >= nk: the padded columns are zeros
      cp_async16(sC + r * ld + q, okc ? ws.ch + (t0 + l0 + r) * ws.ch_stride + g * Np + q : ws.ch, okc ? 16 : 0);
      const bool oks = p0 + r < P && q < N;  // N % 8 == 0: whole pieces
      cp_async16(sS + r * ld + q, oks ? sin + static_cast<int64_t>(p0 + r) * N + q : sin, oks ? 16 : 0);
    }
    cp_async_commit_group();
    cp_async_wait_group<0>();
    __syncthreads();
    if (warp_live) {
      warp_rows_x_nk(acc, sC, sS, ld, wr, nk);
      const float e0 = ex2(scs[l0 + wr + gq]), e1 = ex2(scs[l0 + wr + gq + 8]);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j][0] *= e0, acc[j][1] *= e0, acc[j][2] *= e1, acc[j][3] *= e1;
    }
    __syncthreads();  // sC / sS are the pipeline's stages next
  }

  // Intra-chunk: sum over s < lmax, s <= l, of (CB[l, s] 2^(cs_l - cs_s) dt_s) x[s, p].
  const float* cb = ws.cb + (static_cast<int64_t>(c) * G + g) * L * L;
  const int nsl = (lmax + kSliceK - 1) / kSliceK;
  const auto stage_cb = [&](int st) { return reinterpret_cast<float*>(dyn + st * kScStageBytes); };
  const auto stage_x = [&](int st) {
    return reinterpret_cast<bf16*>(dyn + st * kScStageBytes + kScTile * kScLdCb * 4);
  };
  const auto issue = [&](int sl) {
    if (sl < nsl) {
      const int k0 = sl * kSliceK, st = sl % kStages;
      float* scb = stage_cb(st);
      bf16* sx = stage_x(st);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // C B^T: 64 rows x 8 pieces of 4 floats (L % 8 == 0: aligned, in the row)
        const int i = tid + j * kScThreads, r = i >> 3, q = (i & 7) * 4;
        const bool ok = l0 + r < len && k0 + q < lmax;
        cp_async16(scb + r * kScLdCb + q, ok ? cb + static_cast<int64_t>(l0 + r) * L + k0 + q : cb, ok ? 16 : 0);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // x: 32 rows x 8 pieces of 8 bf16
        const int i = tid + j * kScThreads, r = i >> 3, q = (i & 7) * 8;
        const bool ok = k0 + r < len;
        const bf16* src = ws.xh + (t0 + k0 + r) * ws.xh_stride + h * Pp + p0 + q;
        cp_async16(sx + r * kScLdX + q, ok ? src : ws.xh, ok ? 16 : 0);
      }
    }
    cp_async_commit_group();
  };
  const int la = l0 + wr + gq, lb = la + 8;  // this thread's two rows (chunk positions)
  const float csa = scs[la], csb = scs[lb];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  for (int sl = 0; sl < nsl; ++sl) {
    cp_async_wait_group<kStages - 2>();
    __syncthreads();
    issue(sl + kStages - 1);
    const int st = sl % kStages;
    const float* scb = stage_cb(st);
    const bf16* sx = stage_x(st);
#pragma unroll
    for (int kk = 0; kk < kSliceK; kk += 16) {
      const int kb = sl * kSliceK + kk;
      // Causal: blocks past the warp's last row add nothing; the diagonal block is masked.
      if (!warp_live || kb > l0 + wr || kb >= lmax) continue;
      const int ca = kk + 2 * tq;  // slice columns ca, ca + 1 and ca + 8, ca + 9
      const float2 v00 = *reinterpret_cast<const float2*>(scb + (wr + gq) * kScLdCb + ca);
      const float2 v10 = *reinterpret_cast<const float2*>(scb + (wr + gq + 8) * kScLdCb + ca);
      const float2 v01 = *reinterpret_cast<const float2*>(scb + (wr + gq) * kScLdCb + ca + 8);
      const float2 v11 = *reinterpret_cast<const float2*>(scb + (wr + gq + 8) * kScLdCb + ca + 8);
      const int s0 = kb + 2 * tq, s1 = s0 + 8;  // chunk positions of the columns
      // decay * dt per element
      const float2 q0 = *reinterpret_cast<const float2*>(scs + s0), q1 = *reinterpret_cast<const float2*>(scs + s1);
      const float2 d0 = *reinterpret_cast<const float2*>(sdt + s0), d1 = *reinterpret_cast<const float2*>(sdt + s1);
      const float f00x = ex2(csa - q0.x) * d0.x, f00y = ex2(csa - q0.y) * d0.y;
      const float f10x = ex2(csb - q0.x) * d0.x, f10y = ex2(csb - q0.y) * d0.y;
      const float f01x = ex2(csa - q1.x) * d1.x, f01y = ex2(csa - q1.y) * d1.y;
      const float f11x = ex2(csb - q1.x) * d1.x, f11y = ex2(csb - q1.y) * d1.y;
      float a00x = v00.x * f00x, a00y = v00.y * f00y, a10x = v10.x * f10x, a10y = v10.y * f10y;
      float a01x = v01.x * f01x, a01y = v01.y * f01y, a11x = v11.x * f11x, a11y = v11.y * f11y;
      if (kb == l0 + wr) {  // the diagonal block: keep s <= l (selects: the masked products may be inf)
        a00x = s0 <= la ? a00x : 0.0f, a00y = s0 + 1 <= la ? a00y : 0.0f;
        a10x = s0 <= lb ? a10x : 0.0f, a10y = s0 + 1 <= lb ? a10y : 0.0f;
        a01x = s1 <= la ? a01x : 0.0f, a01y = s1 + 1 <= la ? a01y : 0.0f;
        a11x = s1 <= lb ? a11x : 0.0f, a11y = s1 + 1 <= lb ? a11y : 0.0f;
      }
      const uint32_t a[4] = {pack_bf16(a00x, a00y), pack_bf16(a10x, a10y), pack_bf16(a01x, a01y),
                             pack_bf16(a11x, a11y)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t b[4];
        load_b_kn(b, sx, kScLdX, kk, 16 * j);
        mma_bf16(acc[2 * j], a, b[0], b[1]);
        mma_bf16(acc[2 * j + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait_group<0>();
  if (!warp_live) return;
  const float Dh = p.D ? p.D[h] : 0.0f;
  const bf16* x = ws.xh + t0 * ws.xh_stride + h * Pp;  // the D term's x (bf16)
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int l = (r >= 2 ? lb : la), pp = p0 + 8 * j + 2 * tq + (r & 1);
      if (l < len && pp < P)
        y[(t0 + l) * y_stride + static_cast<int64_t>(h) * P + pp] =
            acc[j][r] + Dh * __bfloat162float(x[l * ws.xh_stride + pp]);
    }
}

}  // namespace

cudaError_t ssd_bf16_convert(const SsdInputs& in, const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws,
                             bf16* xh, bf16* bh, bf16* ch, cudaStream_t stream) {
  convert_kernel<<<static_cast<unsigned>(static_cast<int64_t>(m.nchunks) * m.chunk_size), 256, 0, stream>>>(
      in, p, m, ws, xh, bh, ch);
  return launch_status();
}

cudaError_t ssd_bf16_cb(const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws, cudaStream_t stream) {
  const int smem = cb_smem_bytes(p.d_state);
  if (const cudaError_t e =
          cudaFuncSetAttribute(reinterpret_cast<const void*>(cb_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem);
      e != cudaSuccess)
    return e;
  const unsigned nt = static_cast<unsigned>((m.chunk_size + kCbTile - 1) / kCbTile);
  cb_kernel<<<dim3(static_cast<unsigned>(m.nchunks), static_cast<unsigned>(p.n_groups), nt * nt), kCbThreads, smem,
              stream>>>(p, m, ws);
  return launch_status();
}

cudaError_t ssd_bf16_chunk_state(const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(m.nchunks), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>((ws.Pp / kStM) * (ws.Np / kStN)));
  chunk_state_kernel<<<grid, kStThreads, 0, stream>>>(p, m, ws);
  return launch_status();
}

cudaError_t ssd_bf16_chunk_scan(const SsdInputs& in, const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws,
                                float* y, int64_t y_stride, cudaStream_t stream) {
  const int smem = scan_smem_bytes(p.d_state);
  const void* k = reinterpret_cast<const void*>(chunk_scan_kernel);
  // Per call: the attribute belongs to the current device (tensor-parallel ranks).
  if (const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  const int nt = (m.chunk_size + kScTile - 1) / kScTile;
  const dim3 grid(static_cast<unsigned>(m.nchunks), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(nt * (ws.Pp / kScTile)));
  chunk_scan_kernel<<<grid, kScThreads, smem, stream>>>(in, p, m, ws, y, y_stride);
  return launch_status();
}

}  // namespace ssmserve::cuda::detail
