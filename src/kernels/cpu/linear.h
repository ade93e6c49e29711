// Owns the dense matrix product y = x W^T (+ bias) on the CPU: OpenBLAS sgemm for many rows, our own
// bf16-weight GEMV for few rows (decode), where reading the weights is the whole cost.
#pragma once
#include <cstdint>

#include "model/weight.h"

namespace ssmserve::cpu {

/// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]).
///   x: [M, K] fp32 with row stride x_stride (>= K);  w: [N, K] F32 or BF16 (K = w.cols, N = w.rows);
///   bias: [N] fp32 or nullptr;  y: [M, N] fp32 with row stride y_stride (>= N); y must not alias x.
/// Accumulates in fp32. Rows M <= kGemvMaxRows use a threaded GEMV that converts bf16 on the fly;
/// larger M converts the weight to fp32 in panels and calls cblas_sgemm.
void linear(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride);

/// Convenience overload for contiguous x [M, K] and y [M, N].
inline void linear(const float* x, int64_t M, const Weight& w, const float* bias, float* y) {
  linear(x, M, w.cols, w, bias, y, w.rows);
}

/// Largest row count served by the GEMV path.
inline constexpr int64_t kGemvMaxRows = 32;

}  // namespace ssmserve::cpu
