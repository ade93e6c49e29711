// Owns the dequantization of FP8 checkpoint matrices (e4m3 weights with per-block, per-channel or per-tensor scales;
// config/quantization_config.h) into the F32 / BF16 Weights the kernels read.
#pragma once
#include <string>
#include <vector>

#include "config/quantization_config.h"
#include "core/weight.h"
#include "model/checkpoint.h"

namespace ssmserve {

/// The name of the scales of FP8 matrix `name`: name + quant.scale_suffix ("X.weight" -> "X.weight_scale_inv" or
/// "X.weight_scale"; a fused 3-D experts tensor "mlp.experts.gate_up_proj" -> "mlp.experts.gate_up_proj_scale_inv").
std::string fp8_scale_name(const std::string& name, const Fp8Quantization& quant);

/// The scale grid of an FP8 matrix of `shape` [..., N, K] (at least 2 dims): [..., ceil(N / block_n),
/// ceil(K / block_k)], a block size of 0 covering the whole dimension ([..., 1, 1] for one scale per matrix).
std::vector<int64_t> fp8_scale_shape(const std::vector<int64_t>& shape, const Fp8Quantization& quant);

/// Dequantizes FP8 matrix `q` (F8_E4M3 [..., N, K], at least 2 dims) with its scales `scale_inv` (F32 / BF16 / F16,
/// as many elements as fp8_scale_shape(q.shape) has, in any shape: [1] or [] for one scale, [N, 1] per channel):
/// W[..., r, c] = fp8(q[..., r, c]) x scale_inv[..., r / block_n, c / block_k], the product in fp32 and rounded once
/// to `out` (F32 or BF16), as transformers' FP8 dequantization (integrations/finegrained_fp8.py) computes it.
/// Returns an owned Weight [shape[0], prod(shape[1:])] (weight_from_tensor's view). Throws Error naming the tensors
/// when q is not F8_E4M3, has fewer than 2 dims, or the scale count does not match the grid.
Weight dequantize_fp8(const TensorRef& q, const TensorRef& scale_inv, const Fp8Quantization& quant, DType out);

}  // namespace ssmserve
