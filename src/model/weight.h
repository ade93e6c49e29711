// Owns the reading of Weights from checkpoint tensors (the Weight type itself: core/weight.h).
#pragma once
#include <vector>

#include "core/weight.h"

namespace ssmserve {

struct TensorRef;

/// Views a checkpoint tensor as a Weight [shape[0], prod(shape[1:])]; F16 is converted to an owned F32 copy. Throws
/// Error naming the tensor when it has no dimensions.
Weight weight_from_tensor(const TensorRef& t);

/// Reads a checkpoint tensor fully into float (for small parameters: norms, biases, A_log, D, conv weights).
std::vector<float> tensor_to_f32(const TensorRef& t);

}  // namespace ssmserve
