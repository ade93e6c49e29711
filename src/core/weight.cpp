// Owns Weight's owned storage (see weight.h).
#include "core/weight.h"

#include "core/error.h"

namespace ssmserve {

Weight Weight::allocate(DType dtype, int64_t rows, int64_t cols) {
  SSM_CHECK(dtype != DType::F16, "Weight::allocate: F16 weights are stored as F32");
  Weight w;
  w.dtype = dtype;
  w.rows = rows;
  w.cols = cols;
  w.owned = std::make_shared<HugeByteBuffer>(static_cast<size_t>(rows * cols) * dtype_size(dtype));
  w.data = w.owned->data();
  return w;
}

}  // namespace ssmserve
