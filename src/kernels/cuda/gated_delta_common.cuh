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
/// for the m tokens from packed row row0 in double (sC[i]), and the factors sEc[i] = e^{c_i}, sBeta[i] = beta_i,
/// sDm[i] = e^{c_{m-1} - c_i} (zeros for i >= m). The caller synchronizes the block before use.
__device__ inline void gd_chunk_decays(const GatedDeltaInputs& in, int64_t row0, int h, int m, double* sC, float* sEc,
                                       float* sBeta, float* sDm) {
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    double c = 0.0;
    for (int i = 0; i < m; ++i) {
      c += static_cast<double>(in.g[(row0 + i) * in.g_stride + h]);
      sC[i] = c;
    }
  }
  __syncwarp();
  for (int i = lane; i < kGdChunk; i += 32) {
    const bool ok = i < m;
    sEc[i] = ok ? static_cast<float>(exp(sC[i])) : 0.0f;
    sBeta[i] = ok ? in.beta[(row0 + i) * in.beta_stride + h] : 0.0f;
    sDm[i] = ok ? static_cast<float>(exp(sC[m - 1] - sC[i])) : 0.0f;
  }
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
