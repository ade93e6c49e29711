// Owns the loader of the MiniMax GPU runner (issue 8): the forward pass of model/archs/minimax.cpp (embedding ->
// N x [RMSNorm -> lightning or paged softmax attention -> scaled residual -> RMSNorm -> sparse MoE -> scaled
// residual] -> RMSNorm -> LM head) with the weights on the device, the lightning states and KV blocks in the device
// mirror of the engine's block pool (same page layout, so block ids and block tables address it directly), one
// metadata upload and one synchronization per step, and CUDA graphs for decode-only steps.
#pragma once
#include <memory>

#include "model/causal_lm.h"
#include "runtime/cuda_mamba.h"

namespace ssmserve::cuda {

/// Loads a MiniMax model onto the GPU (checkpoint or dummy weights; the same dummy values as the CPU model).
/// Throws Error on any checkpoint / config defect, when no GPU is usable, or for shapes the GPU kernels do not
/// cover (head_dim other than 64 / 128, block_size > 1024, more than 16 query heads per KV head, more than 256
/// experts or top_k > 8, hidden / intermediate sizes not multiples of 8).
std::unique_ptr<CausalLM> load_minimax_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt = {});

}  // namespace ssmserve::cuda
