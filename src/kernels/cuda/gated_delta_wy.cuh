// Owns the pieces the two-pass gated delta rule prefill's kernels share (gated_delta_prefill_wy.cu: the per-value-head
// WY pass and the walks; gated_delta_prefill_wy_group.cu: the WY pass per key head): the workspace layout (chunk
// offsets, then one slot per (chunk, value head)), the cp.async row copies into shared memory, and the mma.sync
// m16n8k8 TF32 products whose fragments come straight from shared memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/gated_delta_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace ssmserve::cuda::wy {

using detail::kGdChunk;
using detail::kTileThreads;

/// Floats before the first chunk slot (the int32 chunk offsets, 64-float aligned).
__host__ __device__ inline int64_t offsets_floats(int num_seqs) {
  return (static_cast<int64_t>(num_seqs) + 1 + 63) / 64 * 64;
}
/// Floats of one (chunk, value head) slot: W [64, Dk], U [64, Dv], P [64, 64], E [2, 64] (e^{c_i}, then
/// e^{c_{m-1} - c_i}; zeros for i >= m).
__host__ __device__ inline int64_t slot_floats(int dk, int dv) {
  return static_cast<int64_t>(kGdChunk) * (dk + dv + kGdChunk + 2);
}
inline int64_t max_chunks(int64_t num_tokens, int num_seqs, int C) { return num_tokens / C + 2LL * num_seqs; }

__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool ok) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}

/// Copies rows [0, 64) x columns [0, n) of src (row stride sld floats) to dst (row stride dld) with cp.async; rows
/// >= rows_ok are zero-filled (nothing read). vec: 16-byte copies (n, sld, src and dst 16-byte multiples / aligned),
/// else 4-byte ones. Every thread of the block calls it.
__device__ __forceinline__ void sm_copy_rows(float* dst, int dld, const float* src, int64_t sld, int n, int rows_ok,
                                             bool vec) {
  const int tid = threadIdx.x;
  if (vec) {
    const int n4 = n >> 2;
    for (int e = tid; e < kGdChunk * n4; e += kTileThreads) {
      const int i = e / n4, c = (e - i * n4) * 4;
      const bool ok = i < rows_ok;
      cp_async16(dst + i * dld + c, ok ? src + i * sld + c : src, ok);
    }
  } else {
    for (int e = tid; e < kGdChunk * n; e += kTileThreads) {
      const int i = e / n, c = e - i * n;
      const bool ok = i < rows_ok;
      detail::cp_async4(dst + i * dld + c, ok ? src + i * sld + c : src, ok);
    }
  }
}

/// Splits x into TF32 hi (and lo = x - hi when kExact).
template <bool kExact>
__device__ __forceinline__ void sm_split(float x, uint32_t& hi, uint32_t& lo) {
  hi = detail::to_tf32(x);
  if (kExact) lo = detail::to_tf32(x - __uint_as_float(hi));
}

/// The warp's fragments of A (16 rows from wm, 8 deep from kk) from shared memory: row-major A(m, k) = a[m * ld + k]
/// or, kTrans, A(m, k) = a[k * ld + m].
template <bool kExact, bool kTrans>
__device__ __forceinline__ void sm_frag_a(const float* a, int ld, int wm, int kk, uint32_t (&hi)[4],
                                          uint32_t (&lo)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float v[4];
  if (kTrans) {
    const float* p = a + (kk + t) * ld + wm + g;
    v[0] = p[0], v[1] = p[8], v[2] = p[4 * ld], v[3] = p[4 * ld + 8];
  } else {
    const float* p = a + (wm + g) * ld + kk + t;
    v[0] = p[0], v[1] = p[8 * ld], v[2] = p[4], v[3] = p[8 * ld + 4];
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) sm_split<kExact>(v[r], hi[r], lo[r]);
}

/// The warp's fragments of B (8 deep from kk, 8 columns from wn) from b[k * ld + n].
template <bool kExact>
__device__ __forceinline__ void sm_frag_b(const float* b, int ld, int wn, int kk, uint32_t (&hi)[2],
                                          uint32_t (&lo)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* p = b + (kk + t) * ld + wn + g;
  sm_split<kExact>(p[0], hi[0], lo[0]);
  sm_split<kExact>(p[4 * ld], hi[1], lo[1]);
}

/// d += a b in the mma.sync m16n8k8 TF32 fragments: 3xTF32 (lo hi + hi lo + hi hi) when kExact, as tile_mma.
template <bool kExact>
__device__ __forceinline__ void sm_mma(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                       const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  if (kExact) {
    detail::mma_tf32(d, al, bh);
    detail::mma_tf32(d, ah, bl);
  }
  detail::mma_tf32(d, ah, bh);
}

/// acc[i][j] (rows wm + 16 i, columns wn + 8 j of the warp's kMT * 16 x 16 tile) += A B over k in [0, kend)
/// (kend a multiple of 8), operands in shared memory (A as sm_frag_a, B as sm_frag_b).
template <bool kExact, bool kTrans, int kMT>
__device__ __forceinline__ void sm_gemm(float (&acc)[kMT][2][4], const float* a, int lda, int wm, const float* b,
                                        int ldb, int wn, int kend) {
#pragma unroll 2
  for (int kk = 0; kk < kend; kk += 8) {
    uint32_t ah[kMT][4], al[kMT][4], bh[2][2], bl[2][2];
#pragma unroll
    for (int i = 0; i < kMT; ++i) sm_frag_a<kExact, kTrans>(a, lda, wm + 16 * i, kk, ah[i], al[i]);
#pragma unroll
    for (int j = 0; j < 2; ++j) sm_frag_b<kExact>(b, ldb, wn + 8 * j, kk, bh[j], bl[j]);
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) sm_mma<kExact>(acc[i][j], ah[i], al[i], bh[j], bl[j]);
  }
}

/// Chunk q of the step (a WY-pass block's blockIdx.x): its sequence s, first token row0 (of the step's rows) and
/// length m. off: the chunk offsets (offsets_kernel, [num_seqs + 1]); q < off[num_seqs]. The sequence is the last
/// one whose first chunk is <= q (empty ones share their offset); its first chunk ends where the cached prefix's
/// chunk does (sequence-aligned chunks, detail::gd_chunk_len).
struct WyChunk {
  int s, m;
  int64_t row0;
  __device__ WyChunk(const int32_t* off, int num_seqs, int q, const int32_t* qsl, const int32_t* num_computed, int C) {
    int lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (off[mid] <= q) lo = mid;
      else hi = mid - 1;
    }
    s = lo;
    const int k = q - off[s], nc = num_computed[s], len = qsl[s + 1] - qsl[s];
    const int first = detail::gd_chunk_len(nc, 0, len, C);
    const int t0 = k == 0 ? 0 : first + (k - 1) * C;
    m = detail::gd_chunk_len(nc, t0, len, C);
    row0 = qsl[s] + t0;
  }
};

/// The warp's fragments of B (8 deep from kk, 8 columns from wn) from a transposed array: B(k, n) = b[n * ld + k]
/// (e.g. K^T from the keys' rows; ld = 4 mod 32 keeps the loads free of bank conflicts).
template <bool kExact>
__device__ __forceinline__ void sm_frag_bt(const float* b, int ld, int wn, int kk, uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* p = b + (wn + g) * ld + kk + t;
  sm_split<kExact>(p[0], hi[0], lo[0]);
  sm_split<kExact>(p[4], hi[1], lo[1]);
}

/// Whether the per-key-head WY pass (launch_wy_grouped) takes these shapes: Dk and Dv multiples of 16, at most 128.
inline bool wy_grouped_supported(const GatedDeltaParams& p) {
  return p.head_k_dim % 16 == 0 && p.head_v_dim % 16 == 0 && p.head_k_dim <= 128 && p.head_v_dim <= 128 &&
         p.num_k_heads > 0 && p.num_v_heads % p.num_k_heads == 0;
}

/// Pass 1 of the two-pass prefill per (chunk, key head) (gated_delta_prefill_wy_group.cu): the same slots as the
/// per-value-head pass, bit for bit. Grid (chunks, num_k_heads); ws: the workspace with the chunk offsets written
/// (offsets_kernel); qk_vec: q / k rows 16-byte aligned. exact: 3xTF32 products, else one TF32 pass.
/// Errors: the launch's; cudaErrorInvalidValue when !wy_grouped_supported(p).
cudaError_t launch_wy_grouped(bool exact, const GatedDeltaInputs& in, const GatedDeltaParams& p, const int32_t* qsl,
                              const int32_t* num_computed, int num_seqs, int64_t chunks, float* ws, bool qk_vec,
                              cudaStream_t stream);

}  // namespace ssmserve::cuda::wy
