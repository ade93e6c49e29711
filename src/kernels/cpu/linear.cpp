// Owns the CPU dense matrix product (see linear.h).
#include "kernels/cpu/linear.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace ssmserve::cpu {
namespace {

// y[m, n] for n in [n0, n1): one pass over each weight row serves every input row (M <= kGemvMaxRows).
template <typename LoadW>
void gemv_rows(const float* x, int64_t M, int64_t x_stride, int64_t K, LoadW load, const float* bias, float* y,
               int64_t y_stride, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    float acc[kGemvMaxRows] = {};
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * x_stride;
      float a = 0.0f;
#pragma omp simd reduction(+ : a)
      for (int64_t k = 0; k < K; ++k) a += load(n, k) * xm[k];
      acc[m] = a;
    }
    const float b = bias ? bias[n] : 0.0f;
    for (int64_t m = 0; m < M; ++m) y[m * y_stride + n] = acc[m] + b;
  }
}

void gemv(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride) {
  const int64_t N = w.rows, K = w.cols;
  const int64_t block = 16;
#pragma omp parallel for schedule(static)
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t n1 = std::min(N, n0 + block);
    if (w.dtype == DType::BF16) {
      const uint16_t* wb = w.bf16();
      gemv_rows(x, M, x_stride, K, [&](int64_t n, int64_t k) { return bf16_to_f32(wb[n * K + k]); }, bias, y, y_stride, n0, n1);
    } else {
      const float* wf = w.f32();
      gemv_rows(x, M, x_stride, K, [&](int64_t n, int64_t k) { return wf[n * K + k]; }, bias, y, y_stride, n0, n1);
    }
  }
}

}  // namespace

void linear(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride) {
  if (M <= 0) return;
  const int64_t N = w.rows, K = w.cols;
  SSM_CHECK(x_stride >= K && y_stride >= N, "linear: bad strides (x_stride {} < K {} or y_stride {} < N {})", x_stride, K, y_stride, N);
  if (M <= kGemvMaxRows) return gemv(x, M, x_stride, w, bias, y, y_stride);

  const float* wf = w.f32();
  std::vector<float> panel;
  // Convert bf16 weights to fp32 in panels of rows so the scratch stays small and cache-friendly.
  const int64_t panel_rows = w.dtype == DType::F32 ? N : std::max<int64_t>(64, (int64_t{1} << 22) / std::max<int64_t>(K, 1));
  for (int64_t n0 = 0; n0 < N; n0 += panel_rows) {
    const int64_t rows = std::min(panel_rows, N - n0);
    const float* wp = wf + n0 * K;
    if (w.dtype == DType::BF16) {
      panel.resize(static_cast<size_t>(rows * K));
      const uint16_t* src = w.bf16() + n0 * K;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < rows * K; ++i) panel[i] = bf16_to_f32(src[i]);
      wp = panel.data();
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
