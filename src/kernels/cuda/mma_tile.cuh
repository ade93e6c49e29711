// Owns the block-level 64 x 64 fp32-operand matrix product on the tensor cores that the chunked scans use
// (mma.sync m16n8k8 TF32, fp32 accumulate; sm_80+ instructions, run on the H200), and its 64 x 32 form. A block of
// 256 threads (8 warps, each a 32 x 16 eighth of the tile: few registers per thread, so two blocks fit an SM)
// accumulates acc (64 x 64) += A (64 x K) B (K x 64), K walked in slices of
// 32 staged in shared memory through caller-supplied element loaders (so decays, masks and transposes are applied
// on the way in). Exact mode splits every operand x = hi + lo (both TF32) and sums hi*hi + hi*lo + lo*hi
// ("3xTF32", ~fp32 accuracy: relative error ~1e-6 per product); fast mode is one TF32 pass (~5e-4).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace ssmserve::cuda::detail {

constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kTileThreads = 256;
constexpr int kWarpN = 16, kNT = kWarpN / 8;  // warp tile 32 x 16: 2 m16 x 2 n8 fragments
constexpr int kLdA = kTileK + 4;  // sA[m][k]: fragment loads hit banks 4g + t (conflict free)
constexpr int kLdB = kTileN + 8;  // sB[k][n]: banks 8t + g
constexpr int kTileSmemFloats = kTileM * kLdA + kTileK * kLdB;

/// Per-thread accumulators of a warp's part of a 64 x N tile (N = 64 or 32): [m16 tile][n8 tile][4] (mma.sync C
/// fragment layout). The 8 warps form kWarpsM x kWarpsN warp tiles of kWarpRows x 16: N = 64: 2 x 4 warps of 32 x 16
/// (warp w covers rows (w & 1) * 32 and columns (w >> 1) * 16); N = 32: 4 x 2 warps of 16 x 16.
template <int N = kTileN>
struct TileAccT {
  static_assert(N == 64 || N == 32, "64 or 32 columns");
  static constexpr int kWarpsN = N / kWarpN, kWarpsM = 8 / kWarpsN, kWarpRows = kTileM / kWarpsM;
  static constexpr int kMT = kWarpRows / 16;  // m16 fragments per warp
  float v[kMT][kNT][4];
  __device__ static int row0() { return ((threadIdx.x >> 5) % kWarpsM) * kWarpRows; }
  __device__ static int col0() { return ((threadIdx.x >> 5) / kWarpsM) * kWarpN; }
  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) v[i][j][r] = 0.0f;
  }
  /// Calls f(row, col, value) for this thread's elements (row, col within the 64 x N tile).
  template <class F>
  __device__ void for_each(F&& f) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = row0(), wn = col0();
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) f(wm + i * 16 + g + (r >= 2 ? 8 : 0), wn + j * 8 + 2 * t + (r & 1), v[i][j][r]);
  }
};
using TileAcc = TileAccT<>;

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// acc += sA (64 x 32, row stride kLdA) sB (32 x N, row stride N + 8) for this warp's part. Every thread of the
/// block calls it.
template <bool kExact, int N>
__device__ __forceinline__ void tile_mma(TileAccT<N>& acc, const float* sA, const float* sB) {
  constexpr int kMT = TileAccT<N>::kMT, kLdBN = N + 8;  // banks 8t + g for both N
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = TileAccT<N>::row0(), wn = TileAccT<N>::col0();
#pragma unroll
  for (int kk = 0; kk < kTileK; kk += 8) {
    uint32_t ah[kMT][4], al[kMT][4], bh[kNT][2], bl[kNT][2];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const float* p = sA + (wm + i * 16 + g) * kLdA + kk + t;
      const float v[4] = {p[0], p[8 * kLdA], p[4], p[8 * kLdA + 4]};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        ah[i][r] = to_tf32(v[r]);
        if (kExact) al[i][r] = to_tf32(v[r] - __uint_as_float(ah[i][r]));
      }
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      const float* p = sB + (kk + t) * kLdBN + wn + j * 8 + g;
      const float v[2] = {p[0], p[4 * kLdBN]};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        bh[j][r] = to_tf32(v[r]);
        if (kExact) bl[j][r] = to_tf32(v[r] - __uint_as_float(bh[j][r]));
      }
    }
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        if (kExact) {
          mma_tf32(acc.v[i][j], al[i], bh[j]);
          mma_tf32(acc.v[i][j], ah[i], bl[j]);
        }
        mma_tf32(acc.v[i][j], ah[i], bh[j]);
      }
  }
}

/// acc += A (64 x K) B (K x N) with A(m, k) = fa(m, k) and B(k, n) = fb(k, n) for k in [0, K) (loaders return 0
/// outside their valid range); N (64 or 32) from the accumulator's type. kAFastM / kBFastN: which index consecutive
/// threads step through when loading (pick the one contiguous in global memory). smem: kTileSmemFloats floats.
/// Contains __syncthreads.
template <bool kExact, bool kAFastM, bool kBFastN, int N, class FA, class FB>
__device__ void block_gemm(TileAccT<N>& acc, int K, FA&& fa, FB&& fb, float* smem) {
  float* sA = smem;
  float* sB = smem + kTileM * kLdA;
  constexpr int kLdBN = N + 8;
  constexpr int kPerA = kTileM * kTileK / kTileThreads;  // 8 elements of A per thread
  constexpr int kPerB = N * kTileK / kTileThreads;       // 8 (N = 64) or 4 (N = 32) elements of B
  const int tid = threadIdx.x;
  float ra[kPerA], rb[kPerB];
  // Slice k0's elements into registers; issued one slice ahead, so the loads overlap the previous slice's mma.
  const auto fetch = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kPerA; ++i) {
      const int idx = i * kTileThreads + tid;
      const int m = kAFastM ? idx % kTileM : idx / kTileK, ka = kAFastM ? idx / kTileM : idx % kTileK;
      ra[i] = k0 + ka < K ? fa(m, k0 + ka) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kPerB; ++i) {
      const int idx = i * kTileThreads + tid;
      const int n = kBFastN ? idx % N : idx / kTileK, kb = kBFastN ? idx / N : idx % kTileK;
      rb[i] = k0 + kb < K ? fb(k0 + kb, n) : 0.0f;
    }
  };
  if (K > 0) fetch(0);
  for (int k0 = 0; k0 < K; k0 += kTileK) {
    __syncthreads();  // the previous slice is consumed
#pragma unroll
    for (int i = 0; i < kPerA; ++i) {
      const int idx = i * kTileThreads + tid;
      const int m = kAFastM ? idx % kTileM : idx / kTileK, ka = kAFastM ? idx / kTileM : idx % kTileK;
      sA[m * kLdA + ka] = ra[i];
    }
#pragma unroll
    for (int i = 0; i < kPerB; ++i) {
      const int idx = i * kTileThreads + tid;
      const int n = kBFastN ? idx % N : idx / kTileK, kb = kBFastN ? idx / N : idx % kTileK;
      sB[kb * kLdBN + n] = rb[i];
    }
    __syncthreads();
    if (k0 + kTileK < K) fetch(k0 + kTileK);
    tile_mma<kExact>(acc, sA, sB);
  }
}

// ---- multi-stage form: loads kAsyncStages - 1 slices ahead with cp.async ------------------------------------

/// Pipeline depth of block_gemm_async: slices whose raw elements are in flight (one being consumed).
constexpr int kAsyncStages = 4;
/// Dynamic shared memory block_gemm_async needs (floats): per stage and thread its 8 + 8 raw elements.
constexpr int kAsyncSmemFloats = kAsyncStages * 2 * (kTileM * kTileK / kTileThreads) * kTileThreads;

__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool ok) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// block_gemm with the operand loads issued kAsyncStages - 1 slices ahead through cp.async (no registers held
/// while they fly): A(m, k) = xa(m, k, *pa(m, k)) and B(k, n) = xb(k, n, *pb(k, n)), where the address loaders
/// pa / pb return nullptr for a zero element (then nothing is read) and the transforms xa / xb apply decays or
/// scales to the raw value. Each thread copies and later transforms the same elements (its own raw slots in
/// `raw`: kAsyncSmemFloats floats of shared memory, e.g. dynamic), so only the transformed tile in `smem`
/// (kTileSmemFloats) is shared between threads. `dummy`: any valid global address (source of zero elements).
template <bool kExact, bool kAFastM, bool kBFastN, class PA, class XA, class PB, class XB>
__device__ void block_gemm_async(TileAcc& acc, int K, PA&& pa, XA&& xa, PB&& pb, XB&& xb, float* smem, float* raw,
                                 const float* dummy) {
  float* sA = smem;
  float* sB = smem + kTileM * kLdA;
  constexpr int kPer = kTileM * kTileK / kTileThreads;  // 8 elements of A and of B per thread
  const int tid = threadIdx.x;
  const int nslices = (K + kTileK - 1) / kTileK;
  // raw[stage][j][tid], j < 2 * kPer (A's then B's): consecutive threads, consecutive words.
  const auto slot = [&](int stage, int j) { return raw + (stage * 2 * kPer + j) * kTileThreads + tid; };
  const auto issue = [&](int slice) {
    if (slice < nslices) {
      const int k0 = slice * kTileK, stage = slice % kAsyncStages;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int idx = i * kTileThreads + tid;
        const int m = kAFastM ? idx % kTileM : idx / kTileK, ka = kAFastM ? idx / kTileM : idx % kTileK;
        const float* a = k0 + ka < K ? pa(m, k0 + ka) : nullptr;
        cp_async4(slot(stage, i), a ? a : dummy, a != nullptr);
        const int n = kBFastN ? idx % kTileN : idx / kTileK, kb = kBFastN ? idx / kTileN : idx % kTileK;
        const float* b = k0 + kb < K ? pb(k0 + kb, n) : nullptr;
        cp_async4(slot(stage, kPer + i), b ? b : dummy, b != nullptr);
      }
    }
    cp_async_commit();  // empty groups keep the count uniform
  };
#pragma unroll
  for (int s = 0; s < kAsyncStages - 1; ++s) issue(s);
  for (int slice = 0; slice < nslices; ++slice) {
    cp_async_wait<kAsyncStages - 2>();  // this thread's copies of `slice` have landed
    __syncthreads();                    // the previous slice's tile is consumed
    const int k0 = slice * kTileK, stage = slice % kAsyncStages;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = i * kTileThreads + tid;
      const int m = kAFastM ? idx % kTileM : idx / kTileK, ka = kAFastM ? idx / kTileM : idx % kTileK;
      sA[m * kLdA + ka] = k0 + ka < K ? xa(m, k0 + ka, *slot(stage, i)) : 0.0f;
      const int n = kBFastN ? idx % kTileN : idx / kTileK, kb = kBFastN ? idx / kTileN : idx % kTileK;
      sB[kb * kLdB + n] = k0 + kb < K ? xb(k0 + kb, n, *slot(stage, kPer + i)) : 0.0f;
    }
    __syncthreads();
    issue(slice + kAsyncStages - 1);  // into the stage consumed one slice ago (this thread's own slots)
    tile_mma<kExact>(acc, sA, sB);
  }
  cp_async_wait<0>();
}

}  // namespace ssmserve::cuda::detail
