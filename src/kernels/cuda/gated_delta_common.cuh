// Owns the pieces the gated delta rule's two prefill paths share (gated_delta_prefill.cu, the fused walk;
// gated_delta_prefill_wy.cu, the two-pass form): the chunk geometry and the per-chunk decay factors.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gated_delta.h"

namespace ssmserve::cuda::detail {

constexpr int kGdChunk = 64;  // rows of every chunk tile (the largest chunk_size)

/// Length of the chunk starting at sequence-relative token t0 of a sequence with nc tokens already computed and
/// len tokens in this step: chunks end where (nc + t) % C == 0 (sequence-aligned, as on the CPU).
__host__ __device__ inline int gd_chunk_len(int nc, int t0, int len, int C) { return min(len - t0, C - (nc + t0) % C); }

/// Number of chunks of such a sequence (0 when len == 0).
__host__ __device__ inline int gd_num_chunks(int nc, int len, int C) {
  return len <= 0 ? 0 : (nc + len - 1) / C - nc / C + 1;
}

/// Warp 0 of the block (the caller: `if (threadIdx.x < 32)`): chunk-local cumulative log decays c_i of value head h
/// for the m tokens from packed row row0 in double (sC[i]; entries i >= m hold c_{m-1}), and the factors
/// sEc[i] = e^{c_i}, sBeta[i] = beta_i, sDm[i] = e^{c_{m-1} - c_i} (zeros for i >= m). The caller synchronizes the
/// block before use. Every lane loads its two tokens' g at once and the sums are a warp scan in double (the loads
/// are not a chain of 64 dependent global reads, which cost ~20 us per chunk on the H200's walk); serial: lane 0
/// adds the g one after another (the previous form, kept for the legacy walk of KernelTuning::gdn_walk = 0). The
/// two differ in the last bits of the double sums only.
__device__ inline void gd_chunk_decays(const GatedDeltaInputs& in, int64_t row0, int h, int m, double* sC, float* sEc,
                                       float* sBeta, float* sDm, bool serial = false) {
  const int lane = threadIdx.x & 31;
  if (serial) {
    if (lane == 0) {
      double c = 0.0;
      for (int i = 0; i < m; ++i) {
        c += static_cast<double>(in.g[(row0 + i) * in.g_stride + h]);
        sC[i] = c;
      }
    }
  } else {
    static_assert(kGdChunk == 64, "two tokens per lane");
    const int i0 = 2 * lane;
    const double a = i0 < m ? static_cast<double>(in.g[(row0 + i0) * in.g_stride + h]) : 0.0;
    const double b = i0 + 1 < m ? static_cast<double>(in.g[(row0 + i0 + 1) * in.g_stride + h]) : 0.0;
    double x = a + b;  // inclusive scan of the pair sums over the lanes
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const double y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    double before = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0) before = 0.0;
    sC[i0] = before + a;
    sC[i0 + 1] = before + a + b;
  }
  __syncwarp();
  for (int i = lane; i < kGdChunk; i += 32) {
    const bool ok = i < m;
    sEc[i] = ok ? static_cast<float>(exp(sC[i])) : 0.0f;
    sBeta[i] = ok ? in.beta[(row0 + i) * in.beta_stride + h] : 0.0f;
    sDm[i] = ok ? static_cast<float>(exp(sC[m - 1] - sC[i])) : 0.0f;
  }
}

/// Hints the L2 to fetch [p, p + n) floats (prefetch.global.L2 per 128-byte line; the caller's threads split the
/// lines: thread `part` of `parts` takes every parts-th). p: global memory.
__device__ __forceinline__ void gd_prefetch_l2(const float* p, int64_t n, int part, int parts) {
  if (n <= 0) return;
  const char* b = reinterpret_cast<const char*>(p);
  const int64_t lines = (reinterpret_cast<uintptr_t>(b + n * 4 - 1) >> 7) - (reinterpret_cast<uintptr_t>(b) >> 7) + 1;
  const char* first = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(b) & ~uintptr_t{127});
  for (int64_t l = part; l < lines; l += parts) asm volatile("prefetch.global.L2 [%0];" ::"l"(first + l * 128));
}

/// Solves (I + A) X = X0 in place for the 64 columns of X ([64][ld], rows >= m untouched), A ([64][ld]) strictly
/// lower triangular, by forward substitution: warp w of the 8 owns columns 8w .. 8w+7, four lanes per column.
/// Needs 256 threads; the caller synchronizes the block before and after.
__device__ inline void gd_forward_substitute(const float* sA, float* sX, int ld, int m) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = warp * 8 + (lane >> 2), part = lane & 3;
  for (int i = 1; i < m; ++i) {
    float sum = 0.0f;
    for (int j = part; j < i; j += 4) sum = fmaf(sA[i * ld + j], sX[j * ld + c], sum);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (part == 0) sX[i * ld + c] -= sum;
    __syncwarp();
  }
}

}  // namespace ssmserve::cuda::detail
