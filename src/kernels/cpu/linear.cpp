// Owns the CPU dense matrix product (see linear.h): a batch-invariant bf16/fp32-weight GEMM. Every output element
// is computed by the same instruction sequence whatever the number of rows, the tile it falls in or the thread
// that computes it: 16 fp32 lanes accumulate k = 16i + j with FMA in k order, the lanes are summed by one fixed
// reduction, then the k tail and the bias are added. So a token's logits do not depend on what else is batched
// with it (the property vLLM's batch-invariant mode and SGLang's deterministic inference aim for on GPUs).
//
// Packed weights (pack_for_linear) use a second kernel, the classic register-blocked outer product (GotoBLAS /
// BLIS microkernel shape): the weight is stored as column panels [K][32], a tile of MR input rows x 32 output
// columns keeps MR x 2 zmm accumulators, and each k step loads one panel row and broadcasts x[m][k]. Every
// element is then one FMA chain acc = fma(w[n][k], x[m][k], acc) over k = 0..K-1 from 0, then + bias: the same
// chain in every tile shape, tail and thread, and the same chain as the portable fallback.
//
// Both microkernels come per instruction-set variant (kernels/cpu/isa/cpu_isa.h chooses one at run time):
// linear_tiles_avx512.inc (zmm tiles), linear_tiles_avx2.inc (ymm tiles: the 16 lanes as two halves, the panel as
// two 16-column halves) and linear_tiles_scalar.inc (plain loops). All three do each element's operations in the
// same order, so their results are bit-identical; this file owns the blocking, threading and packing around them.
#include "kernels/cpu/linear.h"

#include <immintrin.h>
#include <omp.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

constexpr int64_t kPanel = 32;  // output columns per panel (packed weights)

// Position of column j (0..31) inside a bf16 panel row: dword i holds columns i (low half) and 16 + i (high
// half), so one 512-bit load becomes two fp32 vectors with a shift and a mask (no widening pass).
inline int64_t bf16_slot(int64_t j) { return j < 16 ? 2 * j : 2 * (j - 16) + 1; }

inline float scalar(float v) { return v; }
inline float scalar(uint16_t v) { return bf16_to_f32(v); }

// The microkernels of this variant: group<T> (row-major weights) and panel_rows<kBf16> (packed panels), each
// element computed with the same operations in the same order in all three (so every variant agrees bit for bit).
#if SSM_CPU_AVX512
#include "kernels/cpu/linear_tiles_avx512.inc"
#elif SSM_CPU_AVX2
#include "kernels/cpu/linear_tiles_avx2.inc"
#else
#include "kernels/cpu/linear_tiles_scalar.inc"
#endif

constexpr int64_t kGroupRows = 4;     // weight rows per tile group
constexpr int64_t kRowBlock = 96;     // input rows per cache block (x block stays in L2)
constexpr int64_t kConvertFrom = 12;  // from this many input rows, bf16 groups are widened to fp32 once per block

// Rows [g0, g1) of weight groups against all M input rows, blocked over M.
void run_groups(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y,
                int64_t y_stride, int64_t g0, int64_t g1) {
  const int64_t N = w.rows, K = w.cols;
  thread_local std::vector<float> wide;  // kGroupRows x K fp32 copy of a bf16 group
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t mb = std::min(kRowBlock, M - m0);
    const float* xb = x + m0 * x_stride;
    float* yb = y + m0 * y_stride;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n = g * kGroupRows;
      const int nr = static_cast<int>(std::min(kGroupRows, N - n));
      const float* b = bias ? bias + n : nullptr;
      if (w.dtype == DType::F32) {
        group(w.f32() + n * K, nr, K, xb, mb, x_stride, b, yb + n, y_stride);
      } else if (mb >= kConvertFrom) {  // widening is exact: same values, same results, fewer conversions
        wide.resize(static_cast<size_t>(kGroupRows * K));
        to_f32(DType::BF16, w.bf16() + n * K, wide.data(), static_cast<size_t>(nr * K));
        group(static_cast<const float*>(wide.data()), nr, K, xb, mb, x_stride, b, yb + n, y_stride);
      } else {
        group(w.bf16() + n * K, nr, K, xb, mb, x_stride, b, yb + n, y_stride);
      }
    }
  }
}

// Packed weights: the blocking around panel_rows.
int64_t num_panels(int64_t N) { return (N + kPanel - 1) / kPanel; }

// Panels [p0, p1) against all M rows, blocked over M so a block of x stays in L2 while the panels stream.
void run_panels(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y,
                int64_t y_stride, int64_t p0, int64_t p1) {
  const int64_t N = w.rows, K = w.cols;
  const bool bf16 = w.dtype == DType::BF16;
  const int64_t panel_bytes = K * kPanel * static_cast<int64_t>(dtype_size(w.dtype));
  const int64_t block_rows = std::max<int64_t>(12, (int64_t{1} << 20) / (4 * K) / 12 * 12);  // ~1 MiB of x
  for (int64_t m0 = 0; m0 < M; m0 += block_rows) {
    const int64_t mb = std::min(block_rows, M - m0);
    for (int64_t p = p0; p < p1; ++p) {
      const void* panel = w.cpu_panels->data() + p * panel_bytes;
      const int ncols = static_cast<int>(std::min(kPanel, N - p * kPanel));
      const float* b = bias ? bias + p * kPanel : nullptr;
      float* yp = y + m0 * y_stride + p * kPanel;
      const float* xb = x + m0 * x_stride;
      if (bf16) panel_rows<true>(panel, K, xb, mb, x_stride, ncols, b, yp, y_stride);
      else panel_rows<false>(panel, K, xb, mb, x_stride, ncols, b, yp, y_stride);
    }
  }
}

}  // namespace

namespace {

void check_linear_args(const Weight& w, int64_t x_stride, int64_t y_stride, const char* who) {
  SSM_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16, "{}: weight dtype {} is not F32 or BF16", who, dtype_name(w.dtype));
  SSM_CHECK(x_stride >= w.cols && y_stride >= w.rows, "{}: bad strides (x_stride {} < K {} or y_stride {} < N {})", who, x_stride,
            w.cols, y_stride, w.rows);
}

}  // namespace

LinearColumns linear_part_columns(const Weight& w, int part, int num_parts) {
  // Packed: contiguous panel ranges (each thread streams its own slice of the panels); row-major: contiguous
  // ranges of 4-row groups.
  const int64_t unit = w.cpu_panels ? kPanel : kGroupRows;
  const int64_t units = (w.rows + unit - 1) / unit;
  return {std::min(w.rows, units * part / num_parts * unit), std::min(w.rows, units * (part + 1) / num_parts * unit)};
}

namespace {

/// x [M, K] (row stride x_stride) with every element rounded to bf16 (nearest even), contiguous [M, K] in `out`.
const float* round_rows_bf16(const float* x, int64_t M, int64_t K, int64_t x_stride, std::vector<float>& out) {
  out.resize(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) out[m * K + k] = bf16_to_f32(f32_to_bf16(x[m * x_stride + k]));
  return out.data();
}

/// linear_part on inputs already rounded as w asks.
void linear_part_rounded(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y,
                         int64_t y_stride, int part, int num_parts) {
  if (w.cpu_panels) {
    const int64_t np = num_panels(w.rows);
    run_panels(x, M, x_stride, w, bias, y, y_stride, np * part / num_parts, np * (part + 1) / num_parts);
    return;
  }
  const int64_t num_groups = (w.rows + kGroupRows - 1) / kGroupRows;
  run_groups(x, M, x_stride, w, bias, y, y_stride, num_groups * part / num_parts, num_groups * (part + 1) / num_parts);
}

}  // namespace

void linear_part(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride,
                 int part, int num_parts) {
  if (M <= 0) return;
  if (w.round_input_bf16) {  // each part rounds its own copy (a reference mode: the copy costs M * K per part)
    thread_local std::vector<float> xr;
    x = round_rows_bf16(x, M, w.cols, x_stride, xr), x_stride = w.cols;
  }
  linear_part_rounded(x, M, x_stride, w, bias, y, y_stride, part, num_parts);
}

void check_linear_part(const Weight& w, int64_t x_stride, int64_t y_stride) { check_linear_args(w, x_stride, y_stride, "linear_part"); }

void linear(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride) {
  if (M <= 0) return;
  check_linear_args(w, x_stride, y_stride, "linear");
  std::vector<float> xr;
  if (w.round_input_bf16) x = round_rows_bf16(x, M, w.cols, x_stride, xr), x_stride = w.cols;
  const bool parallel = w.rows * w.cols * std::max<int64_t>(M, 4) > (int64_t{1} << 18);
  // Contiguous ranges per thread (linear_part): each thread streams its own slice of the weight once per row block.
#pragma omp parallel if (parallel)
  linear_part_rounded(x, M, x_stride, w, bias, y, y_stride, omp_get_thread_num(), omp_get_num_threads());
}

void pack_for_linear(Weight& w) {
  if (w.cpu_panels) return;
  SSM_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16, "pack_for_linear: weight dtype {} is not F32 or BF16",
            dtype_name(w.dtype));
  const int64_t N = w.rows, K = w.cols, P = num_panels(N);
  auto out = std::make_shared<HugeByteBuffer>(static_cast<size_t>(P * K * kPanel) * dtype_size(w.dtype));
  if (w.dtype == DType::BF16) {
    auto* dst = reinterpret_cast<uint16_t*>(out->data());
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < kPanel && p * kPanel + j < N; ++j) {
        const uint16_t* src = w.bf16() + (p * kPanel + j) * K;
        for (int64_t k = 0; k < K; ++k) dst[(p * K + k) * kPanel + bf16_slot(j)] = src[k];
      }
  } else {
    auto* dst = reinterpret_cast<float*>(out->data());
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < kPanel && p * kPanel + j < N; ++j) {
        const float* src = w.f32() + (p * kPanel + j) * K;
        for (int64_t k = 0; k < K; ++k) dst[(p * K + k) * kPanel + j] = src[k];
      }
  }
  w.cpu_panels = std::move(out);
}

void pack_for_linear_only(Weight& w) {
  pack_for_linear(w);
  if (!w.data) return;
#if defined(__linux__) && defined(MADV_PAGEOUT)
  if (!w.owned) {  // a view into a mapped checkpoint: its (clean, file-backed) pages may go
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<uintptr_t>(w.data) / page * page;
    const auto end = reinterpret_cast<uintptr_t>(w.data) + static_cast<uintptr_t>(w.rows * w.cols) * dtype_size(w.dtype);
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);  // advice only: a refusal is fine
  }
#endif
  w.owned.reset();
  w.data = nullptr;
}

void weight_row_to_f32(const Weight& w, int64_t r, float* dst) {
  if (w.data || !w.cpu_panels) return w.row_to_f32(r, dst);
  // Row r is column j of panel p: K values kPanel apart (bf16: at the interleaved slot).
  const int64_t K = w.cols, p = r / kPanel, j = r % kPanel;
  if (w.dtype == DType::BF16) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(w.cpu_panels->data()) + p * K * kPanel + bf16_slot(j);
    for (int64_t k = 0; k < K; ++k) dst[k] = bf16_to_f32(src[k * kPanel]);
  } else {
    const float* src = reinterpret_cast<const float*>(w.cpu_panels->data()) + p * K * kPanel + j;
    for (int64_t k = 0; k < K; ++k) dst[k] = src[k * kPanel];
  }
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, pack_for_linear, (Weight& w), (w))
SSM_CPU_DISPATCH(void, pack_for_linear_only, (Weight& w), (w))
SSM_CPU_DISPATCH(void, weight_row_to_f32, (const Weight& w, int64_t r, float* dst), (w, r, dst))
SSM_CPU_DISPATCH(void, linear, (const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias,
                 float* y, int64_t y_stride), (x, M, x_stride, w, bias, y, y_stride))
SSM_CPU_DISPATCH(LinearColumns, linear_part_columns, (const Weight& w, int part, int num_parts), (w, part, num_parts))
SSM_CPU_DISPATCH(void, linear_part, (const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias,
                 float* y, int64_t y_stride, int part, int num_parts),
                 (x, M, x_stride, w, bias, y, y_stride, part, num_parts))
SSM_CPU_DISPATCH(void, check_linear_part, (const Weight& w, int64_t x_stride, int64_t y_stride),
                 (w, x_stride, y_stride))
