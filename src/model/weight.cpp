// Owns Weight construction from checkpoint tensors (see weight.h).
#include "model/weight.h"

#include <cstring>

#include "core/error.h"
#include "model/checkpoint.h"

namespace ssmserve {

Weight weight_from_tensor(const TensorRef& t) {
  SSM_CHECK(!t.shape.empty(), "{}: tensor {} has no dimensions", t.file, t.name);
  int64_t rows = t.shape[0], cols = 1;
  for (size_t i = 1; i < t.shape.size(); ++i) cols *= t.shape[i];
  if (t.dtype == DType::F16) {
    Weight w = Weight::allocate(DType::F32, rows, cols);
    to_f32(DType::F16, t.data, reinterpret_cast<float*>(w.owned->data()), static_cast<size_t>(rows * cols));
    return w;
  }
  Weight w;
  w.dtype = t.dtype;
  w.rows = rows;
  w.cols = cols;
  w.data = t.data;
  return w;
}

std::vector<float> tensor_to_f32(const TensorRef& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  to_f32(t.dtype, t.data, out.data(), out.size());
  return out;
}

}  // namespace ssmserve

namespace ssmserve {

Weight scale_rows(const Weight& w, const std::function<float(int64_t)>& row_scale) {
  bool identity = true;
  for (int64_t r = 0; r < w.rows && identity; ++r) identity = row_scale(r) == 1.0f;
  if (identity) return w;
  Weight out = Weight::allocate(DType::F32, w.rows, w.cols);
  auto* dst = reinterpret_cast<float*>(out.owned->data());
  for (int64_t r = 0; r < w.rows; ++r) {
    const float s = row_scale(r);
    for (int64_t c = 0; c < w.cols; ++c) dst[r * w.cols + c] = w.at(r, c) * s;
  }
  return out;
}

Weight stack_rows(const std::vector<RowRun>& runs) {
  SSM_CHECK(!runs.empty(), "stack_rows: no rows");
  const Weight& w0 = *runs[0].w;
  int64_t rows = 0;
  bool same_dtype = true;
  for (const RowRun& r : runs) {
    SSM_CHECK(r.w->cols == w0.cols, "stack_rows: the stacked tensors have {} and {} columns (one projection's pieces must "
              "share the input width)", r.w->cols, w0.cols);
    same_dtype &= r.w->dtype == w0.dtype;
    SSM_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= r.w->rows, "stack_rows: rows [{}, {}) outside [0, {})", r.begin, r.end,
              r.w->rows);
    rows += r.end - r.begin;
  }
  if (!same_dtype) {  // a checkpoint storing the pieces in different dtypes (e.g. one in F32): stacked in F32
    Weight out = Weight::allocate(DType::F32, rows, w0.cols);
    auto* dst = reinterpret_cast<float*>(out.owned->data());
    for (const RowRun& r : runs)
      for (int64_t i = r.begin; i < r.end; ++i, dst += w0.cols) r.w->row_to_f32(i, dst);
    return out;
  }
  Weight out = Weight::allocate(w0.dtype, rows, w0.cols);
  const size_t row_bytes = static_cast<size_t>(w0.cols) * dtype_size(w0.dtype);
  std::byte* dst = out.owned->data();
  for (const RowRun& r : runs) {
    const size_t n = static_cast<size_t>(r.end - r.begin) * row_bytes;
    if (n) std::memcpy(dst, static_cast<const std::byte*>(r.w->data) + r.begin * row_bytes, n);
    dst += n;
  }
  return out;
}

}  // namespace ssmserve
