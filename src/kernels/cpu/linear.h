// Owns the dense matrix product y = x W^T (+ bias) on the CPU: our own batch-invariant GEMM over bf16 or fp32
// weights (decode reads every weight once per step; prefill is blocked so inputs stay in L2).
#pragma once
#include <cstdint>

#include "core/weight.h"

namespace ssmserve::cpu {

/// Repacks a [N, K] F32/BF16 weight into column panels for the broadcast GEMM kernel (`w.cpu_panels`; the
/// row-major `data` stays valid). Afterwards `linear` computes every element of y as one fp32 FMA chain over
/// k = 0..K-1 (then + bias): the same arithmetic for any M, so still batch-invariant, at ~2x the throughput of
/// the row-major kernel for M >= 12. Costs N * K * dtype_size extra bytes. Idempotent.
/// Throws Error on an F16 weight.
void pack_for_linear(Weight& w);

/// pack_for_linear, then the panels become the only copy: the row-major storage is given up (`w.data` = null,
/// `w.owned` released; the pages of a view into a mapped checkpoint are advised out, MADV_PAGEOUT, which keeps
/// their contents). Rows stay readable through weight_row_to_f32 (the embedding lookup of a tied LM head).
/// Idempotent. Throws Error as pack_for_linear.
void pack_for_linear_only(Weight& w);

/// Row r of w [N, K] as float into dst[0..K): from the row-major data, or from the panels of a weight packed by
/// pack_for_linear_only (the same values, bit for bit). Requires 0 <= r < N.
void weight_row_to_f32(const Weight& w, int64_t r, float* dst);

/// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]).
///   x: [M, K] fp32 with row stride x_stride (>= K);  w: [N, K] F32 or BF16 (K = w.cols, N = w.rows);
///   bias: [N] fp32 or nullptr;  y: [M, N] fp32 with row stride y_stride (>= N); y must not alias x.
/// Accumulates in fp32. Batch-invariant: row m of y is bit-identical whatever M is and whatever other rows
/// x holds (each element is reduced in one fixed order; see linear.cpp). Threads split the weight rows.
/// Packed weights (pack_for_linear) take the panel kernel, others the row-major one; the two round differently.
/// With w.round_input_bf16 (a GPU reference mode, Weight::round_input_bf16) x is first rounded to bf16, element
/// by element (a copy; x itself is not changed): the result is then that of the pre-rounded x.
/// Throws Error on strides smaller than the row lengths or an F16 weight (converted to F32 at load).
void linear(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride);

/// Output columns [begin, end) of one part of `linear` (see linear_part).
struct LinearColumns {
  int64_t begin = 0;
  int64_t end = 0;
};

/// The output columns that part `part` of `num_parts` computes in linear_part: contiguous, in order, covering
/// [0, N) over the parts (whole 32-column panels when packed, whole 4-row groups otherwise; a part may be empty).
/// Requires 0 <= part < num_parts.
LinearColumns linear_part_columns(const Weight& w, int part, int num_parts);

/// `linear` restricted to the output columns linear_part_columns(w, part, num_parts), with no OpenMP region of
/// its own: the threads of an enclosing region call it with their own part (the split `linear` itself uses).
/// Same arithmetic as `linear`, element for element (w.round_input_bf16 included: each part rounds its own copy).
/// Arguments as for `linear`; it checks nothing (call
/// check_linear_part first, outside the region: nothing may throw inside one).
void linear_part(const float* x, int64_t M, int64_t x_stride, const Weight& w, const float* bias, float* y, int64_t y_stride,
                 int part, int num_parts);

/// Throws Error when `linear` would (strides smaller than the row lengths, an F16 weight).
void check_linear_part(const Weight& w, int64_t x_stride, int64_t y_stride);

/// Convenience overload for contiguous x [M, K] and y [M, N].
inline void linear(const float* x, int64_t M, const Weight& w, const float* bias, float* y) {
  linear(x, M, w.cols, w, bias, y, w.rows);
}

}  // namespace ssmserve::cpu
