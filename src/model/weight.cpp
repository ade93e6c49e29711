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
