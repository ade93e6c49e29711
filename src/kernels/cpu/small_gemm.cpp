// Owns small_gemm (see small_gemm.h): a BLIS-style broadcast microkernel over MR x 32 register tiles (AVX-512),
// MR x 16 (AVX2) or plain loops (the scalar variant; kernels/cpu/isa/cpu_isa.h chooses), each element the same FMA
// chain in all three: bit-identical results.
#include "kernels/cpu/small_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

#if SSM_CPU_AVX512

constexpr int kTileRows = 12;  // 24 accumulators + 2 B vectors of the 32 zmm registers

/// C[0..MR) x [0..ncols) with ncols <= 32; masked loads/stores on the column tail.
template <int MR>
inline void tile(int64_t K, const float* A, int64_t sm, int64_t sk, const float* B, int64_t ldb, float* C, int64_t ldc,
                 int ncols) {
  const __mmask16 m0 = ncols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << ncols) - 1u);
  const __mmask16 m1 = ncols >= 32 ? __mmask16(0xFFFF) : ncols <= 16 ? __mmask16(0) : __mmask16((1u << (ncols - 16)) - 1u);
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = B + k * ldb;
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
    const float* ak = A + k * sk;
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const __m512 a = _mm512_set1_ps(ak[m * sm]);
      acc[m][0] = _mm512_fmadd_ps(a, b0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(a, b1, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    _mm512_mask_storeu_ps(C + m * ldc, m0, acc[m][0]);
    _mm512_mask_storeu_ps(C + m * ldc + 16, m1, acc[m][1]);
  }
}

void rows(int64_t M, int64_t K, const float* A, int64_t sm, int64_t sk, const float* B, int64_t ldb, float* C,
          int64_t ldc, int ncols) {
  int64_t m = 0;
  for (; m + kTileRows <= M; m += kTileRows) tile<kTileRows>(K, A + m * sm, sm, sk, B, ldb, C + m * ldc, ldc, ncols);
  const float* Am = A + m * sm;
  float* Cm = C + m * ldc;
  switch (M - m) {
#define SSM_GEMM_TAIL(R) \
  case R: tile<R>(K, Am, sm, sk, B, ldb, Cm, ldc, ncols); break;
    SSM_GEMM_TAIL(11) SSM_GEMM_TAIL(10) SSM_GEMM_TAIL(9) SSM_GEMM_TAIL(8) SSM_GEMM_TAIL(7) SSM_GEMM_TAIL(6)
    SSM_GEMM_TAIL(5) SSM_GEMM_TAIL(4) SSM_GEMM_TAIL(3) SSM_GEMM_TAIL(2) SSM_GEMM_TAIL(1)
#undef SSM_GEMM_TAIL
    default: break;
  }
}

#elif SSM_CPU_AVX2

constexpr int kTileRows = 6;  // 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers

/// The _mm256_maskload_ps / _mm256_maskstore_ps mask of lanes [0, n) (n <= 0: none, n >= 8: all).
inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(std::clamp(n, 0, 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// C[0..MR) x [0..ncols) with ncols <= 16 (a half of the AVX-512 kernel's 32 columns, the same chain per element);
/// masked loads / stores on the column tail.
template <int MR>
inline void tile(int64_t K, const float* A, int64_t sm, int64_t sk, const float* B, int64_t ldb, float* C, int64_t ldc,
                 int ncols) {
  const __m256i m0 = lane_mask(ncols), m1 = lane_mask(ncols - 8);
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = B + k * ldb;
    const __m256 b0 = _mm256_maskload_ps(bk, m0);
    const __m256 b1 = _mm256_maskload_ps(bk + 8, m1);
    const float* ak = A + k * sk;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 a = _mm256_broadcast_ss(ak + m * sm);
      acc[m][0] = _mm256_fmadd_ps(a, b0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(a, b1, acc[m][1]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m) {
    _mm256_maskstore_ps(C + m * ldc, m0, acc[m][0]);
    _mm256_maskstore_ps(C + m * ldc + 8, m1, acc[m][1]);
  }
}

/// Rows [0, M) x columns [0, ncols), ncols <= 32, as two 16-column halves.
void rows(int64_t M, int64_t K, const float* A, int64_t sm, int64_t sk, const float* B, int64_t ldb, float* C,
          int64_t ldc, int ncols) {
  for (int c0 = 0; c0 < ncols; c0 += 16) {
    const int n = std::min(16, ncols - c0);
    int64_t m = 0;
    for (; m + kTileRows <= M; m += kTileRows)
      tile<kTileRows>(K, A + m * sm, sm, sk, B + c0, ldb, C + m * ldc + c0, ldc, n);
    const float* Am = A + m * sm;
    float* Cm = C + m * ldc + c0;
    switch (M - m) {
#define SSM_GEMM_TAIL(R) \
  case R: tile<R>(K, Am, sm, sk, B + c0, ldb, Cm, ldc, n); break;
      SSM_GEMM_TAIL(5) SSM_GEMM_TAIL(4) SSM_GEMM_TAIL(3) SSM_GEMM_TAIL(2) SSM_GEMM_TAIL(1)
#undef SSM_GEMM_TAIL
      default: break;
    }
  }
}

#else  // portable fallback: the same chain per element

void rows(int64_t M, int64_t K, const float* A, int64_t sm, int64_t sk, const float* B, int64_t ldb, float* C,
          int64_t ldc, int ncols) {
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < ncols; ++j) {
      float v = 0.0f;
      for (int64_t k = 0; k < K; ++k) v = std::fma(A[m * sm + k * sk], B[k * ldb + j], v);
      C[m * ldc + j] = v;
    }
}

#endif

}  // namespace

void small_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_stride_m, int64_t a_stride_k,
                const float* B, int64_t ldb, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  K = std::max<int64_t>(K, 0);
  // Column panels of 32 outer, rows inner: one B panel (K x 32) stays in L1/L2 across the row tiles.
  for (int64_t n0 = 0; n0 < N; n0 += 32)
    rows(M, K, A, a_stride_m, a_stride_k, B + n0, ldb, C + n0, ldc, static_cast<int>(std::min<int64_t>(32, N - n0)));
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, small_gemm, (int64_t M, int64_t N, int64_t K, const float* A, int64_t a_stride_m,
                 int64_t a_stride_k, const float* B, int64_t ldb, float* C, int64_t ldc),
                 (M, N, K, A, a_stride_m, a_stride_k, B, ldb, C, ldc))
