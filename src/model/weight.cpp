// Owns Weight construction from checkpoint tensors (see weight.h).
#include "model/weight.h"

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

}  // namespace ssmserve
