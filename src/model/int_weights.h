// Owns the dequantization of GPTQ / AWQ checkpoint matrices (integer codes packed in I32 words with per-group scales
// and zero points; config/quantization_config.h IntQuantization) into the F32 / BF16 Weights the kernels read.
#pragma once
#include <array>
#include <string>

#include "config/quantization_config.h"
#include "core/weight.h"
#include "model/checkpoint.h"

namespace ssmserve {

/// The tensors of one quantized Linear X (GPTQ / AWQ: X.qweight, X.scales, X.qzeros, X.g_idx; pack-quantized:
/// X.weight_packed, X.weight_scale, X.weight_zero_point, X.weight_g_idx).
struct IntQuantizedTensors {
  const TensorRef* qweight = nullptr;  ///< I32, GPTQ [K / pack, N], AWQ [K, N / 8], pack-quantized [N, K / pack]
  const TensorRef* scales = nullptr;   ///< F16 / BF16 / F32 [groups, N] (pack-quantized [N, groups])
  const TensorRef* qzeros = nullptr;   ///< I32 [groups, N / pack] (pack-quantized [N / pack, groups]; nullptr: none)
  const TensorRef* g_idx = nullptr;    ///< I32 [K] each input row's group (nullptr: row k in group k / group_size)
};

/// The checkpoint names of Linear `base`'s tensors in `layout` (qweight, scales, qzeros, g_idx in that order).
std::array<std::string, 4> int_tensor_names(const std::string& base, IntQuantization::Layout layout);

/// Dequantizes Linear `t` of shape [N out, K in] (`n`, `k`: the model's shape of X.weight) into an owned Weight [N, K]
/// of dtype `out` (F32 or BF16): W[r, c] = scale[g, r] x (q[c, r] - zero[g, r]) with g the group of input row c,
/// computed in fp32 (exact: a code times an F16 / BF16 scale) and rounded once to `out`. The codes, zeros and their
/// packing as `quant` describes (IntQuantization). Throws Error naming the tensor and file for a wrong dtype or shape
/// (given the model's [N, K], the group size and the packing), or a g_idx entry outside the groups.
Weight dequantize_int(const IntQuantizedTensors& t, const IntQuantization& quant, int64_t n, int64_t k, DType out);

}  // namespace ssmserve
