// Owns the reading of Weights from checkpoint tensors (the Weight type itself: core/weight.h).
#pragma once
#include <functional>
#include <vector>

#include "core/weight.h"

namespace ssmserve {

struct TensorRef;

/// Views a checkpoint tensor as a Weight [shape[0], prod(shape[1:])]; F16 is converted to an owned F32 copy. Throws
/// Error naming the tensor when it has no dimensions.
Weight weight_from_tensor(const TensorRef& t);

/// Reads a checkpoint tensor fully into float (for small parameters: norms, biases, A_log, D, conv weights).
std::vector<float> tensor_to_f32(const TensorRef& t);

/// An owned fp32 copy of w with row r multiplied by row_scale(r) (muP multipliers folded into a projection:
/// Falcon-H1's ssm_multipliers, attention_in / key multipliers, mlp_multipliers). Returns w itself when every scale
/// is 1.
Weight scale_rows(const Weight& w, const std::function<float(int64_t)>& row_scale);

/// Rows [begin, end) of one weight: a piece of a stacked matrix.
struct RowRun {
  const Weight* w = nullptr;
  int64_t begin = 0, end = 0;
};
/// The pieces stacked in the given order into one owned matrix [sum of run sizes, cols] in the pieces' dtype (one
/// projection GEMM for what a checkpoint stores as several tensors, or a checkpoint's interleaved rows put in the
/// order the math reads them); pieces of different dtypes are stacked in F32. Throws Error when the pieces differ in
/// columns or a run is out of range.
Weight stack_rows(const std::vector<RowRun>& runs);

}  // namespace ssmserve
