// Owns the two-pass form of the gated delta rule's varlen prefill on the GPU (gated_delta_prefill_two_pass in
// kernels/cuda/gated_delta.h): the state-independent part of every chunk is computed chunk-parallel first, so the
// sequential walk over a sequence's chunks does only the products with the state.
//   0. offsets:  per sequence the index of its first chunk (null rows and empty sequences have none);
//   1. WY pass:  per (chunk, value head), 256 threads: A = strictly lower (beta_i e^{c_i - c_j} k_i . k_j),
//                T = (I + A)^{-1} (forward substitution on the identity), W = T diag(beta e^c) K [64, Dk],
//                U = T diag(beta) V [64, Dv], P = lower (e^{c_i - c_j} q_i . k_j) [64, 64], stored in the workspace;
//   2. walk:     per (sequence, value head, 64-column tile), the fused kernel's loop without its K K^T, Q K^T and
//                solve: V~ = U - W S, O = diag(e^c) Q S + P V~, S <- e^{c_m} S + K^T diag(e^{c_m - c}) V~.
// Same math as gated_delta_prefill.cu (V~ = U - W S is the CPU's form); the tile products are the same TF32
// mma.sync tiles (3xTF32 by default). The workspace slot also keeps the chunk's decay factors E = [e^c, e^{c_m - c}].
//
// Napkin math (Dk = Dv = 128, per chunk of 64 tokens and value head): pass 1 does K K^T, Q K^T (0.5 M MACs each),
// T W-RHS, T V (0.5 M each) once per head instead of once per column tile; pass 2 does W S, Q S, K^T V~ (0.5 M each
// per 64 columns) and P V~ (0.25 M). The workspace is 64 (Dk + Dv + 66) floats per chunk and value head (1.35 GB at
// 32k tokens x 32 heads): pass 1 writes it once and pass 2 reads it once (0.3 + 0.3 ms of HBM at 4.8 TB/s).
//
// Pass 2 has three forms (KernelTuning::gdn_walk). The previous one (0) was latency-bound, not tensor-bound (the
// 3xTF32 / TF32 ratio of 1.19 at 32k; ~48 us per chunk where the products need ~5): each chunk summed its decays
// in one lane (64 dependent global loads), and every one of its 14 block_gemm slices of 32 loaded its operands from
// global memory one slice ahead (W, P from the HBM-sized workspace). The prefetching walk (1) reads the decays
// from pass 1 and prefetches the next chunk into the L2; the shared-memory walk (2, the default) keeps the chunk's
// operands in shared memory (cp.async, a chunk ahead) and feeds mma.sync from there (its comment below). Pass 1 sums
// the decays by a warp scan and copies its keys with cp.async.
#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cooperative_launch.cuh"  // sm_count
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/gated_delta_common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/gated_delta_wy.cuh"

namespace ssmserve::cuda {
namespace {

using detail::block_gemm;
using detail::kGdChunk;
using detail::kTileSmemFloats;
using detail::kTileThreads;
using detail::TileAcc;
using namespace wy;

constexpr int kCols = 64, kLd = kCols + 8, kMaxDk = 128;


/// Shared memory (floats) of pass 1 (sK, sA, sT, staging, factors) and pass 2 (sS, sX, staging, factors), plus
/// 64 doubles of decay sums.
inline size_t wy_smem_bytes(int dk) {
  return (static_cast<size_t>(kGdChunk) * dk + 2 * kGdChunk * kLd + kTileSmemFloats + 3 * kGdChunk) * 4 + kGdChunk * 8;
}
inline size_t walk_smem_bytes(int dk, int ncols) {
  const size_t ld = ncols + 8;
  return (static_cast<size_t>(dk) * ld + kGdChunk * ld + kTileSmemFloats + 3 * kGdChunk) * 4 + kGdChunk * 8;
}

__global__ void offsets_kernel(const int32_t* __restrict__ qsl, const int32_t* __restrict__ nc,
                               const int32_t* __restrict__ idx, int num_seqs, int C, int32_t* __restrict__ off) {
  if (threadIdx.x != 0) return;
  int32_t acc = 0;
  off[0] = 0;
  for (int s = 0; s < num_seqs; ++s) {
    acc += idx[s] != 0 ? detail::gd_num_chunks(nc[s], qsl[s + 1] - qsl[s], C) : 0;
    off[s + 1] = acc;
  }
}


template <bool kExact>
__global__ void __launch_bounds__(kTileThreads, 2)
    wy_kernel(GatedDeltaInputs in, GatedDeltaParams p, const int32_t* __restrict__ qsl,
              const int32_t* __restrict__ num_computed, int num_seqs, float* __restrict__ ws, bool fast, bool qk_vec) {
  extern __shared__ __align__(16) float smem[];
  const int q = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  const int32_t* off = reinterpret_cast<const int32_t*>(ws);
  if (q >= off[num_seqs]) return;
  // 1. Which sequence and chunk.
  const WyChunk ch(off, num_seqs, q, qsl, num_computed, p.chunk_size);
  const int m = ch.m, Dk = p.head_k_dim, Dv = p.head_v_dim;
  const int64_t row0 = ch.row0;
  const int kh = h / (p.num_v_heads / p.num_k_heads);
  float *sK = smem, *sA = sK + kGdChunk * Dk, *sTm = sA + kGdChunk * kLd, *sT = sTm + kGdChunk * kLd;
  float *sEc = sT + kTileSmemFloats, *sBeta = sEc + kGdChunk, *sDm = sBeta + kGdChunk;
  double* sC = reinterpret_cast<double*>(sDm + kGdChunk);
  float* W = ws + offsets_floats(num_seqs) + (static_cast<int64_t>(q) * p.num_v_heads + h) * slot_floats(Dk, Dv);
  float *U = W + kGdChunk * Dk, *P = U + kGdChunk * Dv;
  const float* kp = in.k + static_cast<int64_t>(kh) * Dk;
  const float* qp = in.q + static_cast<int64_t>(kh) * Dk;
  const float* vp = in.v + static_cast<int64_t>(h) * Dv;
  // 2. Keys (rows >= m zero), decays, T = I. fast: the keys by cp.async (all in flight at once), the query and value
  // rows (read by the Q K^T and U products below) into the L2 meanwhile.
  if (fast) {
    if (tid < m) detail::gd_prefetch_l2(qp + (row0 + tid) * in.q_stride, Dk, 0, 1);
    else if (tid >= 64 && tid < 64 + m) detail::gd_prefetch_l2(vp + (row0 + tid - 64) * in.v_stride, Dv, 0, 1);
    sm_copy_rows(sK, Dk, kp + row0 * in.k_stride, in.k_stride, Dk, m, qk_vec);
    detail::cp_async_commit();
  } else {
    for (int e = tid; e < kGdChunk * Dk; e += kTileThreads) {
      const int i = e / Dk, d = e % Dk;
      sK[e] = i < m ? kp[(row0 + i) * in.k_stride + d] : 0.0f;
    }
  }
  for (int e = tid; e < kGdChunk * kGdChunk; e += kTileThreads) {
    const int i = e / kGdChunk, j = e % kGdChunk;
    sTm[i * kLd + j] = i == j ? 1.0f : 0.0f;
  }
  if (tid < 32) detail::gd_chunk_decays(in, row0, h, m, sC, sEc, sBeta, sDm, /*serial=*/!fast);
  if (fast) detail::cp_async_wait<0>();
  __syncthreads();
  if (tid < kGdChunk) {  // E: the walk's decay factors
    float* E = P + kGdChunk * kGdChunk;
    E[tid] = sEc[tid];
    E[kGdChunk + tid] = sDm[tid];
  }
  const auto dec = [&](int i, int j) { return static_cast<float>(exp(sC[i] - sC[j])); };
  // 3. A from K K^T; P from Q K^T (stored).
  TileAcc acc;
  acc.zero();
  block_gemm<kExact, false, false>(
      acc, Dk, [&](int i, int d) { return sK[i * Dk + d]; }, [&](int d, int j) { return sK[j * Dk + d]; }, sT);
  acc.for_each([&](int i, int j, float x) { sA[i * kLd + j] = j < i && i < m ? sBeta[i] * dec(i, j) * x : 0.0f; });
  acc.zero();
  block_gemm<kExact, false, false>(
      acc, Dk, [&](int i, int d) { return i < m ? qp[(row0 + i) * in.q_stride + d] : 0.0f; },
      [&](int d, int j) { return sK[j * Dk + d]; }, sT);
  acc.for_each([&](int i, int j, float x) { P[i * kGdChunk + j] = j <= i && i < m ? dec(i, j) * x : 0.0f; });
  __syncthreads();
  // 4. T = (I + A)^{-1}: rows >= m stay identity rows (their A rows are zero).
  detail::gd_forward_substitute(sA, sTm, kLd, m);
  __syncthreads();
  // 5. W = T diag(beta e^c) K and U = T diag(beta) V in 64-column parts (only rows / columns j < m of T are used).
  for (int d0 = 0; d0 < Dk; d0 += kCols) {
    acc.zero();
    block_gemm<kExact, false, true>(
        acc, m, [&](int i, int j) { return sTm[i * kLd + j]; },
        [&](int j, int d) { return d0 + d < Dk ? sBeta[j] * sEc[j] * sK[j * Dk + d0 + d] : 0.0f; }, sT);
    acc.for_each([&](int i, int d, float x) {
      if (d0 + d < Dk) W[i * Dk + d0 + d] = x;
    });
  }
  for (int c0 = 0; c0 < Dv; c0 += kCols) {
    acc.zero();
    block_gemm<kExact, false, true>(
        acc, m, [&](int i, int j) { return sTm[i * kLd + j]; },
        [&](int j, int c) { return c0 + c < Dv ? sBeta[j] * vp[(row0 + j) * in.v_stride + c0 + c] : 0.0f; }, sT);
    acc.for_each([&](int i, int c, float x) {
      if (c0 + c < Dv) U[i * Dv + c0 + c] = x;
    });
  }
}

/// Pass 2, per (sequence, value head, kNc-column tile of Dv). fast: the decays e^c and e^{c_m - c} come from the
/// slot (pass 1 stored them) and the next chunk's slot, U columns, query and key rows are prefetched into the L2
/// while this chunk computes; !fast: the previous walk (decays recomputed by one lane, no prefetch; kNc = 64).
template <class TS, bool kExact, int kNc>
__global__ void __launch_bounds__(kTileThreads)
    walk_kernel(GatedDeltaInputs in, GatedDeltaParams p, float* __restrict__ out, int64_t out_stride,
                const int32_t* __restrict__ qsl, const int32_t* __restrict__ num_computed,
                const int32_t* __restrict__ state_indices, int num_seqs, const float* __restrict__ ws,
                DevStateStores stores, bool fast) {
  constexpr int kLdS = kNc + 8;  // row stride of sS / sX (the kNc-column tile product's B stride)
  extern __shared__ __align__(16) float smem[];
  const int s = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kNc, tid = threadIdx.x;
  const int Dk = p.head_k_dim, Dv = p.head_v_dim, C = p.chunk_size;
  const int kh = h / (p.num_v_heads / p.num_k_heads), ncols = min(kNc, Dv - col0);
  float *sS = smem, *sX = sS + Dk * kLdS, *sT = sX + kGdChunk * kLdS;
  float *sEc = sT + kTileSmemFloats, *sBeta = sEc + kGdChunk, *sDm = sBeta + kGdChunk;
  double* sC = reinterpret_cast<double*>(sDm + kGdChunk);
  const int64_t tok0 = qsl[s];
  const int len = qsl[s + 1] - static_cast<int>(tok0);
  const int32_t idx = state_indices[s];
  const int64_t head_out = static_cast<int64_t>(h) * Dv + col0;
  if (idx == 0) {  // null row: zero outputs, no state I/O
    for (int64_t e = tid; e < static_cast<int64_t>(len) * ncols; e += kTileThreads)
      out[(tok0 + e / ncols) * out_stride + head_out + e % ncols] = 0.0f;
    return;
  }
  const int nc = num_computed[s];
  const int32_t first_chunk = reinterpret_cast<const int32_t*>(ws)[s];
  const float* slots = ws + offsets_floats(num_seqs);
  const float* kp = in.k + static_cast<int64_t>(kh) * Dk;
  const float* qp = in.q + static_cast<int64_t>(kh) * Dk;
  const int64_t slot_n = slot_floats(Dk, Dv);
  const auto slot = [&](int k) { return slots + (static_cast<int64_t>(first_chunk + k) * p.num_v_heads + h) * slot_n; };
  // The L2 prefetch of chunk k (from sequence token t0): W, P and the decays (whole), this tile's U columns, the
  // query and key rows. ~1.2k lines (Dk = Dv = 128), ~5 per thread.
  const auto prefetch = [&](int k, int t0) {
    if (t0 >= len) return;
    const int m = detail::gd_chunk_len(nc, t0, len, C);
    const float* W = slot(k);
    detail::gd_prefetch_l2(W, static_cast<int64_t>(kGdChunk) * Dk, tid, kTileThreads);
    detail::gd_prefetch_l2(W + kGdChunk * (Dk + Dv), kGdChunk * (kGdChunk + 2), tid, kTileThreads);
    if (tid < m) {
      detail::gd_prefetch_l2(W + kGdChunk * Dk + static_cast<int64_t>(tid) * Dv + col0, ncols, 0, 1);
    } else if (tid >= 64 && tid < 64 + 2 * m) {
      const int i = (tid - 64) >> 1;
      const float* base = (tid & 1) ? kp : qp;
      detail::gd_prefetch_l2(base + (tok0 + t0 + i) * ((tid & 1) ? in.k_stride : in.q_stride), Dk, 0, 1);
    }
  };
  if (fast) prefetch(0, 0);
  TS* S = static_cast<TS*>(p.states.data) + idx * p.states.block_stride + static_cast<int64_t>(h) * Dk * Dv + col0;
  for (int e = tid; e < Dk * kNc; e += kTileThreads) {
    const int d = e / kNc, c = e % kNc;
    sS[d * kLdS + c] = nc > 0 && c < ncols ? detail::load(S + static_cast<int64_t>(d) * Dv + c) : 0.0f;
  }
  // "all" mode: the next store of this sequence (row offset `next`, -1: none left); offsets end chunks (the caller
  // checks), so the state after the chunk ending there is written into the store's block.
  int si = 0, si_end = 0;
  if (stores.num > 0) si = stores.start[s], si_end = stores.start[s + 1];
  int next = si < si_end ? stores.offset[si] : -1;
  for (int t0 = 0, k = 0; t0 < len; ++k) {
    const int m = detail::gd_chunk_len(nc, t0, len, C);
    const int64_t row0 = tok0 + t0;
    const float* W = slot(k);
    const float *U = W + kGdChunk * Dk + col0, *P = W + kGdChunk * (Dk + Dv), *E = P + kGdChunk * kGdChunk;
    __syncthreads();  // the previous chunk's readers of sX and the factors and its writes of sS are done
    if (fast) {
      prefetch(k + 1, t0 + m);
      if (tid < kGdChunk) sEc[tid] = E[tid], sDm[tid] = E[kGdChunk + tid];
    } else if (tid < 32) {
      detail::gd_chunk_decays(in, row0, h, m, sC, sEc, sBeta, sDm, /*serial=*/true);
    }
    // 1. V~ = U - W S (rows >= m and columns >= ncols zero).
    detail::TileAccT<kNc> acc, acc_o;
    acc.zero();
    block_gemm<kExact, false, true>(
        acc, Dk, [&](int i, int d) { return W[i * Dk + d]; }, [&](int d, int c) { return sS[d * kLdS + c]; }, sT);
    acc.for_each([&](int i, int c, float x) { sX[i * kLdS + c] = i < m && c < ncols ? U[i * Dv + c] - x : 0.0f; });
    // 2. O = diag(e^c) Q S + P V~ (the block_gemm's first barrier orders the factors written above).
    acc_o.zero();
    block_gemm<kExact, false, true>(
        acc_o, Dk, [&](int i, int d) { return i < m ? sEc[i] * qp[(row0 + i) * in.q_stride + d] : 0.0f; },
        [&](int d, int c) { return sS[d * kLdS + c]; }, sT);
    __syncthreads();
    block_gemm<kExact, false, true>(
        acc_o, m, [&](int i, int j) { return P[i * kGdChunk + j]; }, [&](int j, int c) { return sX[j * kLdS + c]; },
        sT);
    acc_o.for_each([&](int i, int c, float x) {
      if (i < m && c < ncols) out[(row0 + i) * out_stride + head_out + c] = x;
    });
    // 3. S <- e^{c_m} S + K^T diag(e^{c_m - c}) V~ in 64-row parts of Dk.
    const float ecm = sEc[m - 1];
    for (int d0 = 0; d0 < Dk; d0 += kGdChunk) {
      acc.zero();
      block_gemm<kExact, true, true>(
          acc, m, [&](int d, int j) { return d0 + d < Dk ? sDm[j] * kp[(row0 + j) * in.k_stride + d0 + d] : 0.0f; },
          [&](int j, int c) { return sX[j * kLdS + c]; }, sT);
      acc.for_each([&](int d, int c, float x) {
        if (d0 + d < Dk) sS[(d0 + d) * kLdS + c] = fmaf(ecm, sS[(d0 + d) * kLdS + c], x);
      });
    }
    t0 += m;
    while (next >= 0 && next <= t0) {  // uniform over the block
      if (next == t0) {
        __syncthreads();  // the update's writes of sS are done (the next chunk's first barrier orders these reads)
        TS* dst = static_cast<TS*>(p.states.data) + stores.block[si] * p.states.block_stride +
                  static_cast<int64_t>(h) * Dk * Dv + col0;
        for (int e = tid; e < Dk * ncols; e += kTileThreads) {
          const int d = e / ncols, c = e % ncols;
          detail::store(dst + static_cast<int64_t>(d) * Dv + c, sS[d * kLdS + c]);
        }
      }
      ++si;
      next = si < si_end ? stores.offset[si] : -1;
    }
  }
  __syncthreads();
  for (int e = tid; e < Dk * ncols; e += kTileThreads) {
    const int d = e / ncols, c = e % ncols;
    detail::store(S + static_cast<int64_t>(d) * Dv + c, sS[d * kLdS + c]);
  }
}

// ---- the shared-memory walk (KernelTuning::gdn_walk 2): every operand of a chunk in shared memory ----------------
//
// Per (sequence, value head, 32-column tile), Dk a multiple of 32: the chunk's W, Q ([64][Dk + 4]), K ([64][Dk + 8]),
// P ([64][68]), this tile's U columns ([64][40]) and decay factors are copied into shared memory with cp.async
// while the previous part of the walk computes, and the warps take their mma.sync fragments straight from these
// arrays (row strides chosen so the fragment loads are free of bank conflicts: Dk + 4 and 68 give banks 4g + t for
// row-major A, Dk + 8 and 40 give 8t + g for the transposed K and for B), so a chunk has no per-slice staging and
// three barriers. Copies in flight are two groups per chunk:
//   A(k) = W, Q, U, E of chunk k: issued once chunk k-1's V~ and Q S are done, waited at the top of chunk k;
//   B(k) = P, K of chunk k: issued at the top of chunk k, waited after chunk k's V~ and Q S.
// Chunk k: 1. V~ = U - W S and Q S in one pass over Dk (both share S's fragments; 64 x 32: 4 x 2 warps of 16 x 16),
// X~ = diag(e^{c_m - c}) V~ kept beside V~; 2. O = diag(e^c) Q S + P V~ (stored); 3. S <- e^{c_m} S + K^T X~
// (Dk x 32: 4 x 2 warps of 32 x 16). The L2 prefetch of chunk k + 2 runs at the top of chunk k.
//
// Napkin math (H200, Dk = Dv = 128, one 32k sequence: 128 blocks on 132 SMs, 512 chunks each): per chunk and
// block 0.92 M MACs of products (W S, Q S 0.26 M each, P V~ 0.13 M, K^T X~ 0.26 M) = 2.7 k mma.sync m16n8k8 in
// 3xTF32 (0.9 k in TF32): at ~1 mma per SM clock (the dense TF32 rate) ~1.5 us per chunk, ~0.8 ms for 512 chunks.
// Operands: ~120 KB per chunk and block (W, Q, K 32 KB each, P 16 KB, U 8 KB) from the L2 (the prefetch brings
// them from HBM: 3.5 MB of distinct lines per chunk step, the four column tiles of a head sharing W, P, U and the
// two heads of a key head Q, K): 15 MB per chunk step over the grid, ~2 us at ~8 TB/s of L2 bandwidth, so L2 and
// tensor cores bound the walk about equally: ~1-1.5 ms at 32k (the previous walk: ~20 ms).
//
constexpr int kSmN = 32, kSmLd = kSmN + 8;

/// Shared-memory layout of the shared-memory walk (floats), Dk = dk (a multiple of 32, <= 128).
struct SmWalk {
  int dk;
  __host__ __device__ int lda() const { return dk + 4; }   // sW, sQ row stride
  __host__ __device__ int ldk() const { return dk + 8; }   // sK row stride
  __host__ __device__ int x() const { return dk * kSmLd; }                    // sS [dk][40] first, then sX [64][40]
  __host__ __device__ int xd() const { return x() + kGdChunk * kSmLd; }       // sXd [64][40]
  __host__ __device__ int w() const { return xd() + kGdChunk * kSmLd; }       // sW [64][dk + 4]
  __host__ __device__ int q() const { return w() + kGdChunk * lda(); }        // sQ [64][dk + 4]
  __host__ __device__ int k() const { return q() + kGdChunk * lda(); }        // sK [64][dk + 8]
  __host__ __device__ int p() const { return k() + kGdChunk * ldk(); }        // sP [64][68]
  __host__ __device__ int u() const { return p() + kGdChunk * (kGdChunk + 4); }  // sU [64][40]
  __host__ __device__ int e() const { return u() + kGdChunk * kSmLd; }        // sE [2][64]: e^c, e^{c_m - c}
  __host__ __device__ size_t bytes() const { return static_cast<size_t>(e() + 2 * kGdChunk) * 4; }
};


/// Pass 2 on shared-memory operands (the comment above), per (sequence, value head, 32-column tile). Dk a multiple
/// of 32; qk_vec: q / k rows 16-byte aligned (16-byte copies, else 4-byte ones).
template <class TS, bool kExact>
__global__ void __launch_bounds__(kTileThreads, 1)
    walk_sm_kernel(GatedDeltaInputs in, GatedDeltaParams p, float* __restrict__ out, int64_t out_stride,
                   const int32_t* __restrict__ qsl, const int32_t* __restrict__ num_computed,
                   const int32_t* __restrict__ state_indices, int num_seqs, const float* __restrict__ ws,
                   DevStateStores stores, bool qk_vec) {
  extern __shared__ __align__(16) float smem[];
  const int s = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kSmN, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int Dk = p.head_k_dim, Dv = p.head_v_dim, C = p.chunk_size;
  const int kh = h / (p.num_v_heads / p.num_k_heads), ncols = min(kSmN, Dv - col0);
  const SmWalk L{Dk};
  float *sS = smem, *sX = smem + L.x(), *sXd = smem + L.xd(), *sW = smem + L.w(), *sQ = smem + L.q();
  float *sK = smem + L.k(), *sP = smem + L.p(), *sU = smem + L.u(), *sE = smem + L.e();
  const int lda = L.lda(), ldk = L.ldk();
  const int64_t tok0 = qsl[s];
  const int len = qsl[s + 1] - static_cast<int>(tok0);
  const int32_t idx = state_indices[s];
  const int64_t head_out = static_cast<int64_t>(h) * Dv + col0;
  if (idx == 0) {  // null row: zero outputs, no state I/O
    for (int64_t e = tid; e < static_cast<int64_t>(len) * ncols; e += kTileThreads)
      out[(tok0 + e / ncols) * out_stride + head_out + e % ncols] = 0.0f;
    return;
  }
  const int nc = num_computed[s];
  const int32_t first_chunk = reinterpret_cast<const int32_t*>(ws)[s];
  const float* slots = ws + offsets_floats(num_seqs);
  const float* kp = in.k + static_cast<int64_t>(kh) * Dk;
  const float* qp = in.q + static_cast<int64_t>(kh) * Dk;
  const int64_t slot_n = slot_floats(Dk, Dv);
  const auto slot = [&](int k) { return slots + (static_cast<int64_t>(first_chunk + k) * p.num_v_heads + h) * slot_n; };
  const auto prefetch = [&](int k, int t0) {  // chunk k (from token t0) into the L2, ~5 lines per thread
    if (t0 >= len) return;
    const int m = detail::gd_chunk_len(nc, t0, len, C);
    const float* W = slot(k);
    detail::gd_prefetch_l2(W, static_cast<int64_t>(kGdChunk) * Dk, tid, kTileThreads);
    detail::gd_prefetch_l2(W + kGdChunk * (Dk + Dv), kGdChunk * (kGdChunk + 2), tid, kTileThreads);
    if (tid < m) {
      detail::gd_prefetch_l2(W + kGdChunk * Dk + static_cast<int64_t>(tid) * Dv + col0, ncols, 0, 1);
    } else if (tid >= 64 && tid < 64 + 2 * m) {
      const int i = (tid - 64) >> 1;
      const float* base = (tid & 1) ? kp : qp;
      detail::gd_prefetch_l2(base + (tok0 + t0 + i) * ((tid & 1) ? in.k_stride : in.q_stride), Dk, 0, 1);
    }
  };
  // The copy groups (see above): A = W, Q, U, E; B = P, K, of chunk k from token t0 (m tokens).
  const auto issue_a = [&](int k, int t0, int m) {
    const float* W = slot(k);
    sm_copy_rows(sW, lda, W, Dk, Dk, kGdChunk, true);
    sm_copy_rows(sQ, lda, qp + (tok0 + t0) * in.q_stride, in.q_stride, Dk, m, qk_vec);
    sm_copy_rows(sU, kSmLd, W + kGdChunk * Dk + col0, Dv, ncols, kGdChunk, true);
    if (tid < 2 * kGdChunk / 4) cp_async16(sE + 4 * tid, W + kGdChunk * (Dk + Dv + kGdChunk) + 4 * tid, true);
    detail::cp_async_commit();
  };
  const auto issue_b = [&](int k, int t0, int m) {
    const float* W = slot(k);
    sm_copy_rows(sP, kGdChunk + 4, W + kGdChunk * (Dk + Dv), kGdChunk, kGdChunk, kGdChunk, true);
    sm_copy_rows(sK, ldk, kp + (tok0 + t0) * in.k_stride, in.k_stride, Dk, m, qk_vec);
    detail::cp_async_commit();
  };
  if (len > 0) {
    prefetch(0, 0);
    const int m0 = detail::gd_chunk_len(nc, 0, len, C);
    prefetch(1, m0);
    issue_a(0, 0, m0);
  }
  TS* S = static_cast<TS*>(p.states.data) + idx * p.states.block_stride + static_cast<int64_t>(h) * Dk * Dv + col0;
  for (int e = tid; e < Dk * kSmN; e += kTileThreads) {
    const int d = e / kSmN, c = e % kSmN;
    sS[d * kSmLd + c] = nc > 0 && c < ncols ? detail::load(S + static_cast<int64_t>(d) * Dv + c) : 0.0f;
  }
  // "all" mode: the next store of this sequence (row offset `next`, -1: none left); offsets end chunks.
  int si = 0, si_end = 0;
  if (stores.num > 0) si = stores.start[s], si_end = stores.start[s + 1];
  int next = si < si_end ? stores.offset[si] : -1;
  // Warp tiles: V~ / O (64 x 32) rows wm1, columns wn; the state update (Dk x 32) rows wm2, columns wn.
  const int wm1 = (warp & 3) * 16, wm2 = (warp & 3) * 32, wn = (warp >> 2) * 16;
  for (int t0 = 0, k = 0; t0 < len; ++k) {
    const int m = detail::gd_chunk_len(nc, t0, len, C), m8 = (m + 7) & ~7;
    const int64_t row0 = tok0 + t0;
    detail::cp_async_wait<0>();  // A(k) landed (this thread's copies)
    __syncthreads();             // everyone's; the previous chunk's readers of sP, sK, sX, sXd and writers of sS done
    issue_b(k, t0, m);
    prefetch(k + 2, t0 + m + (t0 + m < len ? detail::gd_chunk_len(nc, t0 + m, len, C) : 0));
    // 1. V~ = U - W S and Q S over Dk.
    float acc_v[1][2][4] = {}, acc_o[1][2][4] = {};
#pragma unroll 2
    for (int kk = 0; kk < Dk; kk += 8) {
      uint32_t wh[4], wl[4], qh[4], ql[4], bh[2][2], bl[2][2];
      sm_frag_a<kExact, false>(sW, lda, wm1, kk, wh, wl);
      sm_frag_a<kExact, false>(sQ, lda, wm1, kk, qh, ql);
#pragma unroll
      for (int j = 0; j < 2; ++j) sm_frag_b<kExact>(sS, kSmLd, wn + 8 * j, kk, bh[j], bl[j]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sm_mma<kExact>(acc_v[0][j], wh, wl, bh[j], bl[j]);
        sm_mma<kExact>(acc_o[0][j], qh, ql, bh[j], bl[j]);
      }
    }
    const float ecm = sE[m - 1];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = wm1 + g + (r >= 2 ? 8 : 0), c = wn + 8 * j + 2 * t + (r & 1);
        const float x = i < m && c < ncols ? sU[i * kSmLd + c] - acc_v[0][j][r] : 0.0f;
        sX[i * kSmLd + c] = x;
        sXd[i * kSmLd + c] = sE[kGdChunk + i] * x;
        acc_o[0][j][r] *= sE[i];
      }
    detail::cp_async_wait<0>();  // B(k) landed
    __syncthreads();             // sX, sXd, sP, sK complete; sW, sQ, sU, sE free
    if (t0 + m < len) issue_a(k + 1, t0 + m, detail::gd_chunk_len(nc, t0 + m, len, C));
    // 2. O += P V~, stored.
    sm_gemm<kExact, false, 1>(acc_o, sP, kGdChunk + 4, wm1, sX, kSmLd, wn, m8);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = wm1 + g + (r >= 2 ? 8 : 0), c = wn + 8 * j + 2 * t + (r & 1);
        if (i < m && c < ncols) out[(row0 + i) * out_stride + head_out + c] = acc_o[0][j][r];
      }
    // 3. S <- e^{c_m} S + K^T X~ (this warp's rows of the state only).
    if (wm2 < Dk) {
      float acc_s[2][2][4] = {};
      sm_gemm<kExact, true, 2>(acc_s, sK, ldk, wm2, sXd, kSmLd, wn, m8);
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int d = wm2 + 16 * i2 + g + (r >= 2 ? 8 : 0), c = wn + 8 * j + 2 * t + (r & 1);
            sS[d * kSmLd + c] = fmaf(ecm, sS[d * kSmLd + c], acc_s[i2][j][r]);
          }
    }
    t0 += m;
    while (next >= 0 && next <= t0) {  // uniform over the block
      if (next == t0) {
        __syncthreads();  // the update's writes of sS are done (the next chunk's first barrier orders these reads)
        TS* dst = static_cast<TS*>(p.states.data) + stores.block[si] * p.states.block_stride +
                  static_cast<int64_t>(h) * Dk * Dv + col0;
        for (int e = tid; e < Dk * ncols; e += kTileThreads) {
          const int d = e / ncols, c = e % ncols;
          detail::store(dst + static_cast<int64_t>(d) * Dv + c, sS[d * kSmLd + c]);
        }
      }
      ++si;
      next = si < si_end ? stores.offset[si] : -1;
    }
  }
  detail::cp_async_wait<0>();
  __syncthreads();
  for (int e = tid; e < Dk * ncols; e += kTileThreads) {
    const int d = e / ncols, c = e % ncols;
    detail::store(S + static_cast<int64_t>(d) * Dv + c, sS[d * kSmLd + c]);
  }
}

/// The walk of KernelTuning::gdn_walk: 0 the previous walk (64 columns, serial decays, no prefetch); 1 the
/// prefetching tile-product walk on 32 columns when the 64-column grid would leave SMs idle (fewer than two blocks
/// per SM: one long sequence is Hv x Dv / 64 = 64 blocks on the H200's 132 SMs), else on 64; 2 (default) the
/// shared-memory walk (32 columns) when Dk is a multiple of 32, else as 1.
template <class TS, bool kExact>
cudaError_t launch(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                   const int32_t* qsl, const int32_t* nc, const int32_t* idx, int num_seqs, int64_t num_tokens,
                   float* ws, cudaStream_t stream, const DevStateStores& stores) {
  static std::atomic<uint64_t> wy_opted{0}, walk64_opted{0}, walk32_opted{0}, walk_sm_opted{0};
  const int mode = kernel_tuning().gdn_walk;
  const bool fast = mode != 0;
  auto* wy = wy_kernel<kExact>;
  auto* walk64 = walk_kernel<TS, kExact, 64>;
  auto* walk32 = walk_kernel<TS, kExact, 32>;
  auto* walk_sm = walk_sm_kernel<TS, kExact>;
  if (cudaError_t e = detail::opt_in_dynamic_smem(wy, wy_smem_bytes(kMaxDk), wy_opted); e != cudaSuccess) return e;
  if (cudaError_t e = detail::opt_in_dynamic_smem(walk64, walk_smem_bytes(kMaxDk, 64), walk64_opted); e != cudaSuccess)
    return e;
  if (cudaError_t e = detail::opt_in_dynamic_smem(walk32, walk_smem_bytes(kMaxDk, 32), walk32_opted); e != cudaSuccess)
    return e;
  if (cudaError_t e = detail::opt_in_dynamic_smem(walk_sm, SmWalk{kMaxDk}.bytes(), walk_sm_opted); e != cudaSuccess)
    return e;
  detail::LaunchProfile prof(stream);  // SSMSERVE_KERNEL_PROFILE=1: per-pass times on stderr
  offsets_kernel<<<1, 32, 0, stream>>>(qsl, nc, idx, num_seqs, p.chunk_size, reinterpret_cast<int32_t*>(ws));
  prof.mark("gdn offsets");
  const int64_t chunks = max_chunks(num_tokens, num_seqs, p.chunk_size);
  const int Dk = p.head_k_dim, Dv = p.head_v_dim;
  // q / k rows 16-byte aligned: 16-byte cp.async copies of them (else 4-byte ones).
  const auto a16 = [](const float* x, int64_t stride) {
    return reinterpret_cast<uintptr_t>(x) % 16 == 0 && stride % 4 == 0;
  };
  const bool qk_vec = a16(in.q, in.q_stride) && a16(in.k, in.k_stride) && Dk % 4 == 0;
  if (fast && kernel_tuning().gdn_wy_grouped && wy_grouped_supported(p)) {
    if (cudaError_t e = launch_wy_grouped(kExact, in, p, qsl, nc, num_seqs, chunks, ws, qk_vec, stream); e != cudaSuccess)
      return e;
    prof.mark("gdn wy per key head (pass 1)");
  } else {
    wy<<<dim3(static_cast<unsigned>(chunks), p.num_v_heads), kTileThreads, wy_smem_bytes(Dk), stream>>>(
        in, p, qsl, nc, num_seqs, ws, fast, qk_vec);
    prof.mark("gdn wy (pass 1)");
  }
  if (mode == 2 && Dk % 32 == 0 && Dk <= kMaxDk) {
    walk_sm<<<dim3(num_seqs, p.num_v_heads, detail::ceil_div(Dv, kSmN)), kTileThreads, SmWalk{Dk}.bytes(), stream>>>(
        in, p, out, out_stride, qsl, nc, idx, num_seqs, ws, stores, qk_vec);
    const cudaError_t e = detail::launch_status();
    prof.mark("gdn walk sm (pass 2)");
    return e;
  }
  const int64_t blocks64 = static_cast<int64_t>(num_seqs) * p.num_v_heads * detail::ceil_div(Dv, 64);
  if (mode != 0 && blocks64 < 2 * static_cast<int64_t>(std::max(1, detail::sm_count()))) {
    walk32<<<dim3(num_seqs, p.num_v_heads, detail::ceil_div(Dv, 32)), kTileThreads, walk_smem_bytes(Dk, 32),
             stream>>>(in, p, out, out_stride, qsl, nc, idx, num_seqs, ws, stores, true);
  } else {
    walk64<<<dim3(num_seqs, p.num_v_heads, detail::ceil_div(Dv, 64)), kTileThreads, walk_smem_bytes(Dk, 64),
             stream>>>(in, p, out, out_stride, qsl, nc, idx, num_seqs, ws, stores, fast);
  }
  const cudaError_t e = detail::launch_status();
  prof.mark("gdn walk (pass 2)");
  return e;
}

}  // namespace

size_t gated_delta_prefill_workspace_floats(int64_t num_tokens, int num_seqs, const GatedDeltaParams& p) {
  if (num_tokens < 0 || num_seqs < 0 || p.chunk_size <= 0 || p.num_v_heads <= 0) return 0;
  return static_cast<size_t>(offsets_floats(num_seqs) + max_chunks(num_tokens, num_seqs, p.chunk_size) *
                                                            p.num_v_heads * slot_floats(p.head_k_dim, p.head_v_dim));
}

cudaError_t gated_delta_prefill_two_pass(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                                         int64_t out_stride, const int32_t* query_start_loc,
                                         const int32_t* num_computed, const int32_t* state_indices, int num_seqs,
                                         int64_t num_tokens, float* workspace, cudaStream_t stream,
                                         GatedDeltaPrecision precision, const DevStateStores& stores) {
  const int64_t qk = static_cast<int64_t>(p.num_k_heads) * p.head_k_dim;
  const int64_t vw = static_cast<int64_t>(p.num_v_heads) * p.head_v_dim;
  if (!gated_delta_prefill_supported(p) || num_seqs < 0 || num_tokens < 0 || in.q_stride < qk || in.k_stride < qk ||
      in.v_stride < vw || in.g_stride < p.num_v_heads || in.beta_stride < p.num_v_heads || out_stride < vw ||
      p.num_v_heads > 65535 || max_chunks(num_tokens, num_seqs, p.chunk_size) >= (int64_t{1} << 31) ||
      workspace == nullptr || (stores.num > 0 && (!stores.start || !stores.offset || !stores.block)))
    return cudaErrorInvalidValue;
  if (num_seqs == 0) return cudaSuccess;
  return detail::visit_dtype(p.states.dtype, [&](auto tag) -> cudaError_t {
    using TS = decltype(tag);
    return precision == GatedDeltaPrecision::kTf32
               ? launch<TS, false>(in, p, out, out_stride, query_start_loc, num_computed, state_indices, num_seqs,
                                   num_tokens, workspace, stream, stores)
               : launch<TS, true>(in, p, out, out_stride, query_start_loc, num_computed, state_indices, num_seqs,
                                  num_tokens, workspace, stream, stores);
  });
}

}  // namespace ssmserve::cuda
