// Owns the fp32 register-blocked product the SSD scan's matrix-shaped steps run on (chunk-sized operands that
// live in cache): C = A · B with A read through arbitrary strides and B row-major.
#pragma once
#include <cstdint>

namespace ssmserve::cpu {

/// C[m, n] = sum_{k < K} A[m, k] * B[k, n]  (overwrites C), all fp32.
///   A: element (m, k) at A[m * a_stride_m + k * a_stride_k] (so a transposed view costs nothing);
///   B: [K, N] row-major with row stride ldb (>= N);  C: [M, N] row-major with row stride ldc (>= N).
/// Every C element is one FMA chain acc = fma(A[m,k], B[k,n], acc) over k = 0..K-1 from 0 — the same for any M,
/// N, tile or tail, so results do not depend on the operands' sizes beyond the data itself. Single-threaded
/// (callers parallelize over independent products). Register tile: 12 rows x 32 columns (BLIS-style
/// broadcast microkernel, Van Zee & van de Geijn, "BLIS", ACM TOMS 2015). M, N, K <= 0 do nothing
/// (K = 0 writes zeros). No errors raised.
void small_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_stride_m, int64_t a_stride_k,
                const float* B, int64_t ldb, float* C, int64_t ldc);

}  // namespace ssmserve::cpu
