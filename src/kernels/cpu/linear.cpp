// Owns the CPU dense matrix product (see linear.h).
#include "kernels/cpu/linear.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace ssmserve::cpu {
namespace {

// Dot product of a bf16 weight row with an fp32 vector, fp32 accumulation. bf16 -> fp32 is a 16-bit shift.
inline float dot_bf16(const uint16_t* w, const float* x, int64_t K) {
  int64_t k = 0;
  float acc = 0.0f;
#if defined(__AVX512F__)
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (; k + 32 <= K; k += 32) {
    const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k))), 16));
    const __m512 w1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k + 16))), 16));
    a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), a1);
  }
  acc = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#elif defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps();
  for (; k + 8 <= K; k += 8) {
    const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))), 16));
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), a0);
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, a0);
  for (float v : t) acc += v;
#endif
  for (; k < K; ++k) acc += bf16_to_f32(w[k]) * x[k];
  return acc;
}

inline float dot_f32(const float* w, const float* x, int64_t K) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t k = 0; k < K; ++k) acc += w[k] * x[k];
  return acc;
}

#if defined(__AVX512F__)
// Rows ahead of the current 4-row group that the GEMV prefetches (measured best on the bench machine).
constexpr int64_t kAhead = 8;

inline __m512 load_bf16x16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// out[r] = dot(w[r * K ...], x) for 4 consecutive bf16 rows: 4 independent accumulators share each x load.
inline void dot4_bf16(const uint16_t* w, int64_t K, const float* x, float* out) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    // Prefetch the next 4-row group (the rows are contiguous: w + 4K ... w + 8K) one line per row per step.
    _mm_prefetch(reinterpret_cast<const char*>(w + kAhead * K + 4 * k), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + kAhead * K + 4 * k + 32), _MM_HINT_T0);
    const __m512 xv = _mm512_loadu_ps(x + k);
    a0 = _mm512_fmadd_ps(load_bf16x16(w + k), xv, a0);
    a1 = _mm512_fmadd_ps(load_bf16x16(w + K + k), xv, a1);
    a2 = _mm512_fmadd_ps(load_bf16x16(w + 2 * K + k), xv, a2);
    a3 = _mm512_fmadd_ps(load_bf16x16(w + 3 * K + k), xv, a3);
  }
  out[0] = _mm512_reduce_add_ps(a0), out[1] = _mm512_reduce_add_ps(a1);
  out[2] = _mm512_reduce_add_ps(a2), out[3] = _mm512_reduce_add_ps(a3);
  for (; k < K; ++k)
    for (int r = 0; r < 4; ++r) out[r] += bf16_to_f32(w[r * K + k]) * x[k];
}

// out[m][r] = dot(w row r, x row m) for a 4 x 4 tile of bf16 weight rows and fp32 inputs: 16 accumulators,
// each weight vector converted once and used by 4 FMAs.
inline void dot4x4_bf16(const uint16_t* w, int64_t K, const float* x, int64_t x_stride, float out[4][4]) {
  __m512 a[4][4];
  for (auto& row : a)
    for (auto& v : row) v = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 w0 = load_bf16x16(w + k), w1 = load_bf16x16(w + K + k);
    const __m512 w2 = load_bf16x16(w + 2 * K + k), w3 = load_bf16x16(w + 3 * K + k);
    for (int m = 0; m < 4; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * x_stride + k);
      a[m][0] = _mm512_fmadd_ps(w0, xv, a[m][0]);
      a[m][1] = _mm512_fmadd_ps(w1, xv, a[m][1]);
      a[m][2] = _mm512_fmadd_ps(w2, xv, a[m][2]);
      a[m][3] = _mm512_fmadd_ps(w3, xv, a[m][3]);
    }
  }
  for (int m = 0; m < 4; ++m)
    for (int r = 0; r < 4; ++r) {
      float v = _mm512_reduce_add_ps(a[m][r]);
      for (int64_t kk = k; kk < K; ++kk) v += bf16_to_f32(w[r * K + kk]) * x[m * x_stride + kk];
      out[m][r] = v;
    }
}
#endif

// y[m, n] for n in [n0, n1): each weight row is read once from memory for all M (<= kGemvMaxRows) input rows.
void gemv_rows(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y,
               int64_t y_stride, int64_t n0, int64_t n1) {
  const int64_t K = w.cols;
  int64_t n = n0;
#if defined(__AVX512F__)
  if (w.dtype == DType::BF16) {
    for (; n + 4 <= n1; n += 4) {
      int64_t m = 0;
      for (; M >= 8 && m + 4 <= M; m += 4) {  // the tile pays off from 8 rows (measured)
        float d[4][4];
        dot4x4_bf16(w.bf16() + n * K, K, x + m * x_stride, x_stride, d);
        for (int i = 0; i < 4; ++i)
          for (int r = 0; r < 4; ++r) y[(m + i) * y_stride + n + r] = d[i][r] + (bias ? bias[n + r] : 0.0f);
      }
      for (; m < M; ++m) {
        float d[4];
        dot4_bf16(w.bf16() + n * K, K, x + m * x_stride, d);
        for (int r = 0; r < 4; ++r) y[m * y_stride + n + r] = d[r] + (bias ? bias[n + r] : 0.0f);
      }
    }
  }
#endif
  for (; n < n1; ++n) {
    const float b = bias ? bias[n] : 0.0f;
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * x_stride;
      const float d = w.dtype == DType::BF16 ? dot_bf16(w.bf16() + n * K, xm, K) : dot_f32(w.f32() + n * K, xm, K);
      y[m * y_stride + n] = d + b;
    }
  }
}

void gemv(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride) {
  const int64_t N = w.rows;
  const int64_t block = 16;
#pragma omp parallel for schedule(static) if (N * w.cols > 65536)
  for (int64_t n0 = 0; n0 < N; n0 += block) gemv_rows(x, M, x_stride, w, bias, y, y_stride, n0, std::min(N, n0 + block));
}

}  // namespace

void linear(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride) {
  if (M <= 0) return;
  const int64_t N = w.rows, K = w.cols;
  SSM_CHECK(x_stride >= K && y_stride >= N, "linear: bad strides (x_stride {} < K {} or y_stride {} < N {})", x_stride, K, y_stride, N);
  if (M <= kGemvMaxRows) return gemv(x, M, x_stride, w, bias, y, y_stride);

  // Convert bf16 weights to fp32 in panels of rows (bounded scratch), then one sgemm per panel; OpenBLAS (the
  // OpenMP build) spreads each sgemm over our OpenMP threads.
  thread_local std::vector<float> panel;
  const int64_t panel_rows = w.dtype == DType::F32 ? N : std::max<int64_t>(64, (int64_t{1} << 22) / std::max<int64_t>(K, 1));
  for (int64_t n0 = 0; n0 < N; n0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, N - n0);
    const float* wp = w.f32() + n0 * K;
    if (w.dtype == DType::BF16) {
      panel.resize(static_cast<size_t>(rows * K));
      const uint16_t* src = w.bf16() + n0 * K;
      float* dst = panel.data();  // the calling thread's buffer (thread_local names differ inside the team)
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) to_f32(DType::BF16, src + r * K, dst + r * K, static_cast<size_t>(K));
      wp = dst;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(rows), static_cast<int>(K),
                1.0f, x, static_cast<int>(x_stride), wp, static_cast<int>(K), 0.0f, y + n0, static_cast<int>(y_stride));
  }
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * y_stride + n] += bias[n];
  }
}

}  // namespace ssmserve::cpu
