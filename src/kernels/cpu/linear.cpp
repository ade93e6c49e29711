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

namespace ssmserve::cpu {
namespace {

#if defined(__AVX512F__)

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline float scalar(float v) { return v; }
inline float scalar(uint16_t v) { return bf16_to_f32(v); }

/// y[m][r] for NR weight rows (stride K) x MT input rows: NR * MT accumulators, each weight vector loaded once.
template <int NR, int MT, typename T>
inline void tile(const T* w, int64_t K, const float* x, int64_t x_stride, const float* bias, float* y, int64_t y_stride) {
  __m512 acc[MT][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if constexpr (MT <= 2 && sizeof(T) == 2) {
      // Few input rows: the weights stream from memory. Prefetch the group 8 rows ahead (the groups are
      // contiguous), 2 cache lines per 16 columns of 4 bf16 rows. Measured: decode 56 -> 85 tok/s (130M).
      const char* ahead = reinterpret_cast<const char*>(w + 8 * K + 4 * k);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
    }
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) wv[r] = load16(w + r * K + k);
#pragma GCC unroll 8
    for (int m = 0; m < MT; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * x_stride + k);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_fmadd_ps(wv[r], xv, acc[m][r]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < NR; ++r) {
      float v = _mm512_reduce_add_ps(acc[m][r]);
      for (int64_t kk = k; kk < K; ++kk) v = std::fma(scalar(w[r * K + kk]), x[m * x_stride + kk], v);
      y[m * y_stride + r] = v + (bias ? bias[r] : 0.0f);
    }
}

/// The decode case (one input row, 4 bf16 weight rows streaming from memory): tile<4, 1> written out by hand,
/// the same arithmetic in the same order, with the prefetch interleaved ~25% faster than the generic tile.
inline void tile_4x1_bf16(const uint16_t* w, int64_t K, const float* x, const float* bias, float* y) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(w + 8 * K + 4 * k), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + 8 * K + 4 * k + 32), _MM_HINT_T0);
    const __m512 xv = _mm512_loadu_ps(x + k);
    a0 = _mm512_fmadd_ps(load16(w + k), xv, a0);
    a1 = _mm512_fmadd_ps(load16(w + K + k), xv, a1);
    a2 = _mm512_fmadd_ps(load16(w + 2 * K + k), xv, a2);
    a3 = _mm512_fmadd_ps(load16(w + 3 * K + k), xv, a3);
  }
  const __m512 acc[4] = {a0, a1, a2, a3};
  for (int r = 0; r < 4; ++r) {
    float v = _mm512_reduce_add_ps(acc[r]);
    for (int64_t kk = k; kk < K; ++kk) v = std::fma(scalar(w[r * K + kk]), x[kk], v);
    y[r] = v + (bias ? bias[r] : 0.0f);
  }
}

/// Rows [0, M) of x against NR weight rows, in tiles of up to 6 input rows.
template <int NR, typename T>
void rows_block(const T* w, int64_t K, const float* x, int64_t M, int64_t x_stride, const float* bias, float* y,
                int64_t y_stride) {
  if constexpr (NR == 4 && sizeof(T) == 2) {
    if (M == 1) return tile_4x1_bf16(w, K, x, bias, y);
  }
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) tile<NR, 6>(w, K, x + m * x_stride, x_stride, bias, y + m * y_stride, y_stride);
  const float* xm = x + m * x_stride;
  float* ym = y + m * y_stride;
  switch (M - m) {
    case 5: tile<NR, 5>(w, K, xm, x_stride, bias, ym, y_stride); break;
    case 4: tile<NR, 4>(w, K, xm, x_stride, bias, ym, y_stride); break;
    case 3: tile<NR, 3>(w, K, xm, x_stride, bias, ym, y_stride); break;
    case 2: tile<NR, 2>(w, K, xm, x_stride, bias, ym, y_stride); break;
    case 1: tile<NR, 1>(w, K, xm, x_stride, bias, ym, y_stride); break;
    default: break;
  }
}

template <typename T>
void group(const T* w, int nr, int64_t K, const float* x, int64_t M, int64_t x_stride, const float* bias, float* y,
           int64_t y_stride) {
  switch (nr) {
    case 4: rows_block<4>(w, K, x, M, x_stride, bias, y, y_stride); break;
    case 3: rows_block<3>(w, K, x, M, x_stride, bias, y, y_stride); break;
    case 2: rows_block<2>(w, K, x, M, x_stride, bias, y, y_stride); break;
    case 1: rows_block<1>(w, K, x, M, x_stride, bias, y, y_stride); break;
    default: break;
  }
}

#else  // portable fallback: one element at a time, still independent of the batch

template <typename T>
void group(const T* w, int nr, int64_t K, const float* x, int64_t M, int64_t x_stride, const float* bias, float* y,
           int64_t y_stride) {
  for (int64_t m = 0; m < M; ++m)
    for (int r = 0; r < nr; ++r) {
      float v = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float wv = sizeof(T) == 2 ? bf16_to_f32(static_cast<uint16_t>(w[r * K + k])) : static_cast<float>(w[r * K + k]);
        v = std::fma(wv, x[m * x_stride + k], v);
      }
      y[m * y_stride + r] = v + (bias ? bias[r] : 0.0f);
    }
}

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

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Panel (broadcast) kernel for packed weights.
namespace {

constexpr int64_t kPanel = 32;  // output columns per panel

int64_t num_panels(int64_t N) { return (N + kPanel - 1) / kPanel; }

// Position of column j (0..31) inside a bf16 panel row: dword i holds columns i (low half) and 16 + i (high
// half), so one 512-bit load becomes two fp32 vectors with a shift and a mask (no widening pass).
inline int64_t bf16_slot(int64_t j) { return j < 16 ? 2 * j : 2 * (j - 16) + 1; }

#if defined(__AVX512F__)

template <bool kBf16>
inline void load_panel_row(const void* panel, int64_t k, __m512& w0, __m512& w1) {
  if constexpr (kBf16) {
    const __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(panel) + k * kPanel);
    w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    w1 = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else {
    const float* p = static_cast<const float*>(panel) + k * kPanel;
    w0 = _mm512_loadu_ps(p);
    w1 = _mm512_loadu_ps(p + 16);
  }
}

// Software prefetch distance of the streaming panel pass, in bytes ahead of the row being read. The panels of a
// thread are contiguous, so near a panel's end this reaches into the next one. The hardware streamer stops at
// every 4 KiB boundary (huge pages or not); the prefetch keeps the stream going across them.
constexpr int64_t kPanelPrefetchBytes = 4096;

/// y[m][0..ncols) for MR input rows against one panel ([K][32]): MR x 2 accumulators, one chain per element.
/// kPrefetch: the pass that streams the panel from memory (the first row tile) prefetches ahead of itself;
/// prefetches do not change the arithmetic.
template <int MR, bool kBf16, bool kPrefetch>
inline void panel_tile(const void* panel, int64_t K, const float* x, int64_t x_stride, int ncols, const float* bias,
                       float* y, int64_t y_stride) {
  constexpr int64_t kRowBytes = kPanel * (kBf16 ? 2 : 4);
  __m512 acc[MR][2];
#pragma GCC unroll 12
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    if constexpr (kPrefetch) {
      const char* ahead = static_cast<const char*>(panel) + k * kRowBytes + kPanelPrefetchBytes;
      _mm_prefetch(ahead, _MM_HINT_T0);
      if constexpr (!kBf16) _mm_prefetch(ahead + 64, _MM_HINT_T0);
    }
    __m512 w0, w1;
    load_panel_row<kBf16>(panel, k, w0, w1);
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * x_stride + k]);
      acc[m][0] = _mm512_fmadd_ps(w0, xb, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(w1, xb, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    alignas(64) float out[kPanel];
    _mm512_store_ps(out, acc[m][0]);
    _mm512_store_ps(out + 16, acc[m][1]);
    float* ym = y + m * y_stride;
    for (int j = 0; j < ncols; ++j) ym[j] = out[j] + (bias ? bias[j] : 0.0f);
  }
}

constexpr int kTileRows = 12;  // MR: 24 accumulators + 2 weight vectors of the 32 zmm registers

template <bool kBf16>
void panel_rows(const void* panel, int64_t K, const float* x, int64_t M, int64_t x_stride, int ncols,
                const float* bias, float* y, int64_t y_stride) {
  int64_t m = 0;
  // The first tile streams the panel from memory (prefetching ahead); the others find it in L2.
  if (M >= kTileRows) {
    panel_tile<kTileRows, kBf16, true>(panel, K, x, x_stride, ncols, bias, y, y_stride);
    m = kTileRows;
  }
  for (; m + kTileRows <= M; m += kTileRows)
    panel_tile<kTileRows, kBf16, false>(panel, K, x + m * x_stride, x_stride, ncols, bias, y + m * y_stride, y_stride);
  const float* xm = x + m * x_stride;
  float* ym = y + m * y_stride;
  const bool first = m == 0;
  switch (M - m) {
#define SSM_PANEL_TAIL(R)                                                                   \
  case R:                                                                                   \
    if (first) panel_tile<R, kBf16, true>(panel, K, xm, x_stride, ncols, bias, ym, y_stride); \
    else panel_tile<R, kBf16, false>(panel, K, xm, x_stride, ncols, bias, ym, y_stride);      \
    break;
    SSM_PANEL_TAIL(11) SSM_PANEL_TAIL(10) SSM_PANEL_TAIL(9) SSM_PANEL_TAIL(8) SSM_PANEL_TAIL(7) SSM_PANEL_TAIL(6)
    SSM_PANEL_TAIL(5) SSM_PANEL_TAIL(4) SSM_PANEL_TAIL(3) SSM_PANEL_TAIL(2) SSM_PANEL_TAIL(1)
#undef SSM_PANEL_TAIL
    default: break;
  }
}

#else  // portable fallback: the same per-element chain

template <bool kBf16>
void panel_rows(const void* panel, int64_t K, const float* x, int64_t M, int64_t x_stride, int ncols,
                const float* bias, float* y, int64_t y_stride) {
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < ncols; ++j) {
      float v = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float wv = kBf16 ? bf16_to_f32(static_cast<const uint16_t*>(panel)[k * kPanel + bf16_slot(j)])
                               : static_cast<const float*>(panel)[k * kPanel + j];
        v = std::fma(wv, x[m * x_stride + k], v);
      }
      y[m * y_stride + j] = v + (bias ? bias[j] : 0.0f);
    }
}

#endif

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

}  // namespace ssmserve::cpu
