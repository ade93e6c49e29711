// Owns the GPU lightning-attention kernels (see lightning.h): block KV, state passing and output for the varlen
// prefill (tensor cores through WMMA, bf16 operands with hi/lo splits, fp32 accumulation), and the decode update.
#include <mma.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/lightning_common.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;  // 8 warps
constexpr int kTile = 64;      // query / key tile rows
constexpr int kMaxBlockSize = 1024;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAcol = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBcol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ void round4(const float4 x, bf16* dst) {
  reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(x.x, x.y);
  reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(x.z, x.w);
}

/// Loads rows [0, nvalid) of a 64-row tile (token rows row0.., columns col..col+D of qkv) into dst [64][D + 8]
/// as bf16; rows >= nvalid are zero.
template <int D>
__device__ __forceinline__ void load_tile(const float* __restrict__ qkv, int64_t stride, int64_t row0, int nvalid,
                                          int64_t col, bf16* dst) {
  constexpr int V = D / 4, LD = D + 8;
  for (int idx = threadIdx.x; idx < kTile * V; idx += kThreads) {
    const int r = idx / V, c4 = idx % V;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < nvalid) x = *reinterpret_cast<const float4*>(qkv + (row0 + r) * stride + col + c4 * 4);
    round4(x, dst + r * LD + c4 * 4);
  }
}

/// 1. Grid (num_blocks, H). KV_b = sum_j e^{-s(m-1-j)} k_j^T v_j -> ws[b, h] ([D, D] fp32).
template <int D>
__global__ void __launch_bounds__(kThreads) block_kv_kernel(const float* __restrict__ qkv, int64_t qs,
                                                            LightningDevParams p, LightningPlanDev plan,
                                                            float* __restrict__ ws) {
  constexpr int LD = D + 8, RT = D / 16, CG = 8 / RT, NC = RT / CG, V = D / 4;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Khi = reinterpret_cast<bf16*>(smem);
  bf16* Klo = Khi + kTile * LD;
  bf16* Vs = Klo + kTile * LD;
  float* kd = reinterpret_cast<float*>(Vs + kTile * LD);
  const int b = blockIdx.x, h = blockIdx.y;
  const int tok0 = plan.blocks[3 * b], m = plan.blocks[3 * b + 1], seq = plan.blocks[3 * b + 2];
  if (plan.state_indices[seq] == 0) return;
  const float s = p.slopes[h];
  const int warp = threadIdx.x / 32, rt = warp % RT, c0 = (warp / RT) * NC;
  FragC acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) wmma::fill_fragment(acc[c], 0.0f);
  const int64_t kcol = static_cast<int64_t>(h) * 3 * D + D, vcol = kcol + D;
  for (int j0 = 0; j0 < m; j0 += kTile) {
    const int nv = min(kTile, m - j0);
    if (threadIdx.x < kTile) kd[threadIdx.x] = threadIdx.x < nv ? decay(s, static_cast<double>(m - 1 - (j0 + threadIdx.x))) : 0.0f;
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * V; idx += kThreads) {
      const int r = idx / V, c4 = idx % V;
      float4 k = make_float4(0.f, 0.f, 0.f, 0.f), v = k;
      if (r < nv) {
        const float* row = qkv + static_cast<int64_t>(tok0 + j0 + r) * qs;
        k = *reinterpret_cast<const float4*>(row + kcol + c4 * 4);
        v = *reinterpret_cast<const float4*>(row + vcol + c4 * 4);
      }
      // k is rounded to bf16 first (the operand every path sees), then scaled by its decay in fp32.
      const float f = kd[r];
      const float kv[4] = {__bfloat162float(__float2bfloat16_rn(k.x)) * f, __bfloat162float(__float2bfloat16_rn(k.y)) * f,
                           __bfloat162float(__float2bfloat16_rn(k.z)) * f, __bfloat162float(__float2bfloat16_rn(k.w)) * f};
      split4(kv, Khi + r * LD + c4 * 4, Klo + r * LD + c4 * 4);
      round4(v, Vs + r * LD + c4 * 4);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragAcol ahi, alo;  // K^T [D, 64] viewed column-major from K [64][LD]
      wmma::load_matrix_sync(ahi, Khi + kk * 16 * LD + rt * 16, LD);
      wmma::load_matrix_sync(alo, Klo + kk * 16 * LD + rt * 16, LD);
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        FragB bv;
        wmma::load_matrix_sync(bv, Vs + kk * 16 * LD + (c0 + c) * 16, LD);
        wmma::mma_sync(acc[c], ahi, bv, acc[c]);
        wmma::mma_sync(acc[c], alo, bv, acc[c]);
      }
    }
    __syncthreads();
  }
  float* dst = ws + (static_cast<int64_t>(b) * p.num_heads + h) * D * D;
#pragma unroll
  for (int c = 0; c < NC; ++c) wmma::store_matrix_sync(dst + rt * 16 * D + (c0 + c) * 16, acc[c], D, wmma::mem_row_major);
}

/// Shared memory of the output kernel (bytes): Q, K, V tiles, the score / output region, the decay table.
template <int D>
constexpr size_t out_region_bytes() {
  constexpr size_t p = kTile * (kTile + 4) * 4 + 2 * kTile * (kTile + 8) * 2, o = kTile * (D + 4) * 4;
  return p > o ? p : o;
}
template <int D>
size_t output_smem(int block_size) {
  return 3 * kTile * (D + 8) * 2 + out_region_bytes<D>() + (block_size + kTile + 1) * sizeof(float);
}

/// 3. Grid (num_qtiles, H). o_i = e^{-s(i+1)} q_i S_b + sum_{j<=i} e^{-s(i-j)} (q_i . k_j) v_j for the tile's
/// 64 query rows; warp w owns rows 16 (w % 4).. and columns (w / 4) D/2.. of the output.
template <int D>
__global__ void __launch_bounds__(kThreads, 2) output_kernel(const float* __restrict__ qkv, int64_t qs,
                                                          float* __restrict__ out, int64_t os, LightningDevParams p,
                                                          LightningPlanDev plan, const bf16* __restrict__ sin) {
  constexpr int LD = D + 8, LP = kTile + 4, LPB = kTile + 8, LO = D + 4, NC = D / 32, V = D / 4;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kTile * LD;  // phase 1: S_b rows, hi part
  bf16* Vs = Ks + kTile * LD;  // phase 1: S_b rows, lo part
  unsigned char* region = reinterpret_cast<unsigned char*>(Vs + kTile * LD);
  float* P = reinterpret_cast<float*>(region);                       // [64][LP] scores
  bf16* Phi = reinterpret_cast<bf16*>(P + kTile * LP);               // [64][LPB]
  bf16* Plo = Phi + kTile * LPB;                                     // [64][LPB]
  float* O = reinterpret_cast<float*>(region);                       // [64][LO] output staging (aliases P)
  float* dd = reinterpret_cast<float*>(region + out_region_bytes<D>());  // [row0 + 65] e^{-s k}

  const int qt = blockIdx.x, h = blockIdx.y;
  const int b = plan.qtiles[2 * qt], row0 = plan.qtiles[2 * qt + 1];
  const int tok0 = plan.blocks[3 * b], m = plan.blocks[3 * b + 1], seq = plan.blocks[3 * b + 2];
  const int nq = min(kTile, m - row0);
  float* outb = out + static_cast<int64_t>(tok0 + row0) * os + static_cast<int64_t>(h) * D;
  if (plan.state_indices[seq] == 0) {
    for (int idx = threadIdx.x; idx < nq * V; idx += kThreads)
      *reinterpret_cast<float4*>(outb + static_cast<int64_t>(idx / V) * os + (idx % V) * 4) = make_float4(0.f, 0.f, 0.f, 0.f);
    return;
  }
  const float s = p.slopes[h];
  for (int k = threadIdx.x; k <= row0 + kTile; k += kThreads) dd[k] = decay(s, static_cast<double>(k));
  const int64_t qcol = static_cast<int64_t>(h) * 3 * D;
  load_tile<D>(qkv, qs, tok0 + row0, nq, qcol, Qs);
  const int warp = threadIdx.x / 32, rt = warp % 4, cb = (warp / 4) * (D / 2);
  FragC acc[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) wmma::fill_fragment(acc[c], 0.0f);

  // Phase 1: inter-block term e^{-s(i+1)} q_i S_b (skipped when S_b is zero: a sequence's first block without
  // an initial state).
  if (b != plan.seq_first_block[seq] || plan.num_computed[seq] > 0) {
    const bf16* Shi = sin + 2 * (static_cast<int64_t>(b) * p.num_heads + h) * D * D;
    const bf16* Slo = Shi + D * D;
    for (int d0 = 0; d0 < D; d0 += kTile) {
      for (int idx = threadIdx.x; idx < kTile * (D / 8); idx += kThreads) {
        const int r = idx / (D / 8), c8 = (idx % (D / 8)) * 8;
        const int64_t src = static_cast<int64_t>(d0 + r) * D + c8;
        *reinterpret_cast<uint4*>(Ks + r * LD + c8) = *reinterpret_cast<const uint4*>(Shi + src);
        *reinterpret_cast<uint4*>(Vs + r * LD + c8) = *reinterpret_cast<const uint4*>(Slo + src);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA a;
        wmma::load_matrix_sync(a, Qs + rt * 16 * LD + d0 + kk * 16, LD);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          FragB bh, bl;
          wmma::load_matrix_sync(bh, Ks + kk * 16 * LD + cb + c * 16, LD);
          wmma::load_matrix_sync(bl, Vs + kk * 16 * LD + cb + c * 16, LD);
          wmma::mma_sync(acc[c], a, bh, acc[c]);
          wmma::mma_sync(acc[c], a, bl, acc[c]);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) wmma::store_matrix_sync(O + rt * 16 * LO + cb + c * 16, acc[c], LO, wmma::mem_row_major);
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTile * D; idx += kThreads) {
      const int r = idx / D, c = idx % D;
      O[r * LO + c] *= dd[row0 + r + 1];
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < NC; ++c) wmma::load_matrix_sync(acc[c], O + rt * 16 * LO + cb + c * 16, LO, wmma::mem_row_major);
    __syncthreads();  // O aliases the score buffers
  }

  // Phase 2: intra-block term over key tiles j0 <= row0.
  const int prt = warp % 4, pc0 = (warp / 4) * 2;
  for (int j0 = 0; j0 <= row0; j0 += kTile) {
    const int nk = min(kTile, m - j0);
    load_tile<D>(qkv, qs, tok0 + j0, nk, qcol + D, Ks);
    load_tile<D>(qkv, qs, tok0 + j0, nk, qcol + 2 * D, Vs);
    __syncthreads();
    {
      FragC sc[2];
      wmma::fill_fragment(sc[0], 0.0f);
      wmma::fill_fragment(sc[1], 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        wmma::load_matrix_sync(a, Qs + prt * 16 * LD + kk * 16, LD);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          FragBcol bk;  // K^T [D, 64] viewed column-major from K [64][LD]
          wmma::load_matrix_sync(bk, Ks + (pc0 + c) * 16 * LD + kk * 16, LD);
          wmma::mma_sync(sc[c], a, bk, sc[c]);
        }
      }
      wmma::store_matrix_sync(P + prt * 16 * LP + pc0 * 16, sc[0], LP, wmma::mem_row_major);
      wmma::store_matrix_sync(P + prt * 16 * LP + (pc0 + 1) * 16, sc[1], LP, wmma::mem_row_major);
    }
    __syncthreads();
    for (int idx = threadIdx.x * 4; idx < kTile * kTile; idx += kThreads * 4) {
      const int i = idx / kTile, j = idx % kTile, ii = row0 + i;
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int jj = j0 + j + u;
        v[u] = (i < nq && j + u < nk && jj <= ii) ? P[i * LP + j + u] * dd[ii - jj] : 0.0f;
      }
      split4(v, Phi + i * LPB + j, Plo + i * LPB + j);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      FragA ah, al;
      wmma::load_matrix_sync(ah, Phi + rt * 16 * LPB + kk * 16, LPB);
      wmma::load_matrix_sync(al, Plo + rt * 16 * LPB + kk * 16, LPB);
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        FragB bv;
        wmma::load_matrix_sync(bv, Vs + kk * 16 * LD + cb + c * 16, LD);
        wmma::mma_sync(acc[c], ah, bv, acc[c]);
        wmma::mma_sync(acc[c], al, bv, acc[c]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int c = 0; c < NC; ++c) wmma::store_matrix_sync(O + rt * 16 * LO + cb + c * 16, acc[c], LO, wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < nq * V; idx += kThreads) {
    const int r = idx / V, c4 = idx % V;
    *reinterpret_cast<float4*>(outb + static_cast<int64_t>(r) * os + c4 * 4) =
        *reinterpret_cast<const float4*>(O + r * LO + c4 * 4);
  }
}

/// One token's update of key row d in a thread's 4 state columns, shared by the decode kernel and the sequential
/// prefill so both do the same arithmetic: x <- e^{-s} x + k_d v (dec = e^{-s}), then acc += q_d x with the updated
/// x (before any rounding to the state dtype).
__device__ __forceinline__ void row_step(float (&x)[4], float (&acc)[4], float dec, float kd, float qd,
                                         const float (&vx)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[i] = dec * x[i] + kd * vx[i];
    acc[i] += qd * x[i];
  }
}

/// One token's outputs from the threads' partial sums (thread (r0, c4) holds rows r0, r0 + R, ... of columns
/// c4 * 4 .. +3): o[c] = the R row groups' sums added in order (threads < D write). after_previous: a token ran
/// before on this block (its sums must be read before `red` is overwritten).
template <int D, int R>
__device__ __forceinline__ void out_step(float (&red)[R][D], const float (&acc)[4], int r0, int c4, float* o,
                                         bool after_previous) {
  if (after_previous) __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) red[r0][c4 * 4 + i] = acc[i];
  __syncthreads();
  if (threadIdx.x < D) {
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < R; ++g) sum += red[g][threadIdx.x];
    o[threadIdx.x] = sum;
  }
}

/// The 4 state elements at `row` as fp32, and their store in the state dtype.
template <class TS>
__device__ __forceinline__ void load_row4(const TS* row, float (&x)[4]) {
  if constexpr (sizeof(TS) == 4) {
    const float4 tv = *reinterpret_cast<const float4*>(row);
    x[0] = tv.x, x[1] = tv.y, x[2] = tv.z, x[3] = tv.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = load(row + i);
  }
}
template <class TS>
__device__ __forceinline__ void store_row4(TS* row, const float (&x)[4]) {
  if constexpr (sizeof(TS) == 4) {
    *reinterpret_cast<float4*>(row) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) store(row + i, x[i]);
  }
}
/// x rounded to the state dtype and back (what store then load give).
__device__ __forceinline__ float round_state(float x, float) { return x; }
__device__ __forceinline__ float round_state(float x, __nv_bfloat16) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float round_state(float x, __half) { return __half2float(__float2half_rn(x)); }

/// Decode. Grid (batch, H); thread t owns 4 value columns (t % (D/4)) and every (256/(D/4))-th key row, in every
/// state column of the row (device_decode_rows.h: a verify row's token j reads column j - 1, writes column j).
template <class TS, int D>
__global__ void __launch_bounds__(kThreads) decode_kernel(const float* __restrict__ qkv, int64_t qs,
                                                          float* __restrict__ out, int64_t os, LightningDevParams p,
                                                          DeviceDecodeRows rows) {
  constexpr int L = D / 4, R = kThreads / L;
  __shared__ float red[R][D];
  const int b = blockIdx.x, h = blockIdx.y;
  const int nt = rows.num_tokens(b);
  const int64_t t0 = rows.first_token(b);
  if (rows.is_null(b)) {
    for (int j = 0; j < nt; ++j)
      if (threadIdx.x < D) out[(t0 + j) * os + static_cast<int64_t>(h) * D + threadIdx.x] = 0.0f;
    return;
  }
  const int c4 = threadIdx.x % L, r0 = threadIdx.x / L;
  const float dec = decay(p.slopes[h], 1.0);
  TS* const base = static_cast<TS*>(p.states.data) + static_cast<int64_t>(h) * D * D + c4 * 4;
  for (int j = 0; j < nt; ++j) {
    const int64_t t = t0 + j;
    float* o = out + t * os + static_cast<int64_t>(h) * D;
    const float* q = qkv + t * qs + static_cast<int64_t>(h) * 3 * D;
    const float *k = q + D, *v = q + 2 * D;
    const float4 vv = *reinterpret_cast<const float4*>(v + c4 * 4);
    const float vx[4] = {vv.x, vv.y, vv.z, vv.w};
    const TS* S_in = base + rows.src_block(b, j) * p.states.block_stride;
    TS* S = base + rows.dst_block(b, j) * p.states.block_stride;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int d = r0; d < D; d += R) {
      float x[4];
      load_row4(S_in + d * D, x);
      row_step(x, acc, dec, k[d], q[d], vx);
      store_row4(S + d * D, x);
    }
    out_step<D, R>(red, acc, r0, c4, o, j > 0);
  }
}

/// Sequential prefill (batch-invariant mode). Grid (num_seqs, H), the decode kernel's thread layout; the block walks
/// its sequence's tokens (the plan's blocks in order) one by one with row_step / out_step, the state held in
/// registers and rounded to the state dtype after every token (as decode stores and reloads it), so every token's
/// output and state are the decode kernel's bits. Starts from the sequence's block when num_computed > 0 (else
/// zeros); the state after a plan block with a store goes to plan.block_store[b]; the final state to the block.
template <class TS, int D>
__global__ void __launch_bounds__(kThreads) sequential_prefill_kernel(const float* __restrict__ qkv, int64_t qs,
                                                                      float* __restrict__ out, int64_t os,
                                                                      LightningDevParams p, LightningPlanDev plan) {
  constexpr int L = D / 4, R = kThreads / L, kRows = D / R;
  __shared__ float red[R][D];
  const int seq = blockIdx.x, h = blockIdx.y;
  const int b0 = plan.seq_first_block[seq], b1 = plan.seq_first_block[seq + 1];
  const int32_t sb = plan.state_indices[seq];
  if (sb == 0) {  // null row: zero outputs, no state I/O
    for (int b = b0; b < b1; ++b)
      for (int j = 0; j < plan.blocks[3 * b + 1]; ++j)
        if (threadIdx.x < D)
          out[(plan.blocks[3 * b] + int64_t{j}) * os + static_cast<int64_t>(h) * D + threadIdx.x] = 0.0f;
    return;
  }
  if (b0 == b1) return;
  const int c4 = threadIdx.x % L, r0 = threadIdx.x / L;
  const float dec = decay(p.slopes[h], 1.0);
  TS* const base = static_cast<TS*>(p.states.data) + static_cast<int64_t>(h) * D * D + c4 * 4;
  float x[kRows][4];
  if (plan.num_computed[seq] > 0) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) load_row4(base + sb * p.states.block_stride + (r0 + i * R) * D, x[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kRows; ++i) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.0f;
  }
  auto write_state = [&](int32_t blk) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) store_row4(base + blk * p.states.block_stride + (r0 + i * R) * D, x[i]);
  };
  bool first = true;
  for (int b = b0; b < b1; ++b) {
    const int64_t row0 = plan.blocks[3 * b];
    const int m = plan.blocks[3 * b + 1];
    for (int j = 0; j < m; ++j) {
      const int64_t t = row0 + j;
      float* o = out + t * os + static_cast<int64_t>(h) * D;
      const float* q = qkv + t * qs + static_cast<int64_t>(h) * 3 * D;
      const float *k = q + D, *v = q + 2 * D;
      const float4 vv = *reinterpret_cast<const float4*>(v + c4 * 4);
      const float vx[4] = {vv.x, vv.y, vv.z, vv.w};
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int d = r0 + i * R;
        row_step(x[i], acc, dec, k[d], q[d], vx);
#pragma unroll
        for (int c = 0; c < 4; ++c) x[i][c] = round_state(x[i][c], TS{});
      }
      out_step<D, R>(red, acc, r0, c4, o, !first);
      first = false;
    }
    if (plan.block_store && plan.block_store[b] > 0) write_state(plan.block_store[b]);
  }
  write_state(sb);
}

bool valid(const LightningDevParams& p) {
  return p.num_heads > 0 && (p.head_dim == 64 || p.head_dim == 128) && p.block_size > 0 &&
         p.block_size <= kMaxBlockSize && p.slopes != nullptr && p.states.data != nullptr;
}

template <int D>
cudaError_t prefill_d(const float* qkv, int64_t qs, float* out, int64_t os, const LightningDevParams& p,
                      const LightningPlanDev& plan, float* ws, cudaStream_t stream) {
  const int H = p.num_heads;
  if (plan.num_blocks > 0) {
    const size_t smem_kv = 3 * kTile * (D + 8) * 2 + kTile * sizeof(float);
    cudaError_t e = cudaFuncSetAttribute(block_kv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_kv));
    if (e != cudaSuccess) return e;
    block_kv_kernel<D><<<dim3(plan.num_blocks, H), kThreads, smem_kv, stream>>>(qkv, qs, p, plan, ws);
    if ((e = launch_status()) != cudaSuccess) return e;
  }
  bf16* sin = reinterpret_cast<bf16*>(ws + static_cast<int64_t>(plan.num_blocks) * H * D * D);
  const dim3 scan_grid(ceil_div(static_cast<int64_t>(D) * D / 4, kThreads), H, plan.num_seqs);
  cudaError_t e = visit_dtype(p.states.dtype, [&](auto tag) {
    state_scan_kernel<decltype(tag), true><<<scan_grid, kThreads, 0, stream>>>(p, plan, ws, sin);
    return launch_status();
  });
  if (e != cudaSuccess || plan.num_qtiles == 0) return e;
  const size_t smem_out = output_smem<D>(p.block_size);
  e = cudaFuncSetAttribute(output_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_out));
  if (e != cudaSuccess) return e;
  output_kernel<D><<<dim3(plan.num_qtiles, H), kThreads, smem_out, stream>>>(qkv, qs, out, os, p, plan, sin);
  return launch_status();
}

}  // namespace

cudaError_t lightning_prefill(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                              const LightningDevParams& p, const LightningPlanDev& plan, float* workspace,
                              cudaStream_t stream) {
  if (!valid(p) || qkv_stride % 4 != 0 || out_stride % 4 != 0 || qkv_stride < 3LL * p.num_heads * p.head_dim ||
      out_stride < static_cast<int64_t>(p.num_heads) * p.head_dim || plan.num_seqs < 0 || plan.num_blocks < 0)
    return cudaErrorInvalidValue;
  if (plan.num_seqs == 0) return cudaSuccess;
  if (plan.num_blocks > 0 && (qkv == nullptr || out == nullptr || workspace == nullptr)) return cudaErrorInvalidValue;
  return p.head_dim == 64 ? prefill_d<64>(qkv, qkv_stride, out, out_stride, p, plan, workspace, stream)
                          : prefill_d<128>(qkv, qkv_stride, out, out_stride, p, plan, workspace, stream);
}

cudaError_t lightning_prefill_sequential(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                                         const LightningDevParams& p, const LightningPlanDev& plan,
                                         cudaStream_t stream) {
  if (!valid(p) || qkv_stride % 4 != 0 || qkv_stride < 3LL * p.num_heads * p.head_dim ||
      out_stride < static_cast<int64_t>(p.num_heads) * p.head_dim || plan.num_seqs < 0 || plan.num_blocks < 0 ||
      p.num_heads > 65535)
    return cudaErrorInvalidValue;
  if (plan.num_seqs == 0) return cudaSuccess;
  if (plan.num_blocks > 0 && (qkv == nullptr || out == nullptr || plan.blocks == nullptr)) return cudaErrorInvalidValue;
  if (!plan.seq_first_block || !plan.state_indices || !plan.num_computed) return cudaErrorInvalidValue;
  return visit_dtype(p.states.dtype, [&](auto tag) {
    using TS = decltype(tag);
    const dim3 grid(plan.num_seqs, p.num_heads);
    if (p.head_dim == 64)
      sequential_prefill_kernel<TS, 64><<<grid, kThreads, 0, stream>>>(qkv, qkv_stride, out, out_stride, p, plan);
    else
      sequential_prefill_kernel<TS, 128><<<grid, kThreads, 0, stream>>>(qkv, qkv_stride, out, out_stride, p, plan);
    return launch_status();
  });
}

cudaError_t lightning_decode(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                             const LightningDevParams& p, DeviceDecodeRows rows, int batch, cudaStream_t stream) {
  if (!valid(p) || batch < 0 || !rows.state_indices || rows.cols < 1 || qkv_stride % 4 != 0 || qkv_stride < 3LL * p.num_heads * p.head_dim ||
      out_stride < static_cast<int64_t>(p.num_heads) * p.head_dim)
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  return visit_dtype(p.states.dtype, [&](auto tag) {
    using TS = decltype(tag);
    if (p.head_dim == 64)
      decode_kernel<TS, 64><<<dim3(batch, p.num_heads), kThreads, 0, stream>>>(qkv, qkv_stride, out, out_stride, p, rows);
    else
      decode_kernel<TS, 128><<<dim3(batch, p.num_heads), kThreads, 0, stream>>>(qkv, qkv_stride, out, out_stride, p, rows);
    return launch_status();
  });
}

}  // namespace ssmserve::cuda
