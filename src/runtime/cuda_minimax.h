// Owns the MiniMax loader of the GPU backend (issue 8): MiniMaxForCausalLM's DecoderSpec on the one GPU runner
// (runtime/cuda_decoder.h): lightning and paged softmax attention with MiniMax's scaled residuals, sparse MoE, the
// lightning states and KV blocks in the device mirror of the engine's block pool.
#pragma once
#include <memory>

#include "model/causal_lm.h"
#include "runtime/cuda_options.h"

namespace ssmserve::cuda {

/// Loads a MiniMax model onto the GPU (the same dummy values as the CPU model). Throws Error on any checkpoint /
/// config defect, when no GPU is usable, or for shapes the GPU kernels do not cover (head_dim other than 64 / 128,
/// block_size > 1024, more than 16 query heads per KV head, more than 256 experts or top_k > 8, hidden / intermediate
/// sizes not multiples of 8).
std::unique_ptr<CausalLM> load_minimax_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt = {});

}  // namespace ssmserve::cuda
