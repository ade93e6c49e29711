// Owns the dequantization of FP8 block-quantized checkpoint matrices (quantization_config quant_method "fp8":
// e4m3 weights with weight_scale_inv) into the F32 / BF16 Weights the kernels read.
#pragma once
#include "config/model_config.h"
#include "core/weight.h"
#include "model/checkpoint.h"

namespace ssmserve {

/// The name of the scale tensor beside FP8 matrix `name`: name + "_scale_inv" ("X.weight" -> "X.weight_scale_inv",
/// a fused 3-D experts tensor "mlp.experts.gate_up_proj" -> "mlp.experts.gate_up_proj_scale_inv"), as transformers
/// pairs them.
std::string fp8_scale_name(const std::string& name);

/// The scale grid of an FP8 matrix of `shape` [..., N, K] (at least 2 dims): [..., ceil(N / block_n),
/// ceil(K / block_k)], or {} (a single value) for a per-tensor scale (block_n = block_k = 0).
std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape, const Fp8Quantization& quant);

/// Dequantizes FP8 matrix `q` (F8_E4M3 [..., N, K], at least 2 dims) with its scales `scale_inv` (F32 / BF16 / F16,
/// fp8_scale_shape(q.shape) elements; any shape with that many, so [1] or [] for a per-tensor scale):
/// W[..., r, c] = fp8(q[..., r, c]) x scale_inv[..., r / block_n, c / block_k], the product in fp32 and rounded once
/// to `out` (F32 or BF16), as transformers' FP8 dequantization (integrations/finegrained_fp8.py) computes it.
/// Returns an owned Weight [shape[0], prod(shape[1:])] (weight_from_tensor's view). Throws Error naming the tensors
/// when q is not F8_E4M3, has fewer than 2 dims, or the scale count does not match the grid.
Weight dequantize_fp8(const TensorRef& q, const TensorRef& scale_inv, const Fp8Quantization& quant, DType out);

}  // namespace ssmserve
