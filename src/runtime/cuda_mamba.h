// Owns the GPU backend's entry points: the loaders the tests and tools name per family (each a DecoderSpec on the one
// GPU runner, runtime/cuda_decoder.h), the tensor-parallel loader and the registration of device "cuda".
#pragma once
#include <memory>

#include "dist/communicator.h"
#include "model/causal_lm.h"
#include "runtime/cuda_options.h"

namespace ssmserve::cuda {

/// Loads a Mamba-1 model onto the GPU (checkpoint or dummy weights). Throws Error on any checkpoint / config defect,
/// when no GPU is usable, or for features the GPU does not have (in_proj / out_proj biases, d_conv > 8). With
/// tp.world > 1: rank tp.rank's shard on the current GPU (channels split, x_proj / out_proj all-reduced, LM head
/// vocab-parallel, embedding replicated; decode steps in CUDA graphs with the all-reduces captured).
std::unique_ptr<CausalLM> load_mamba_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt = {},
                                          const dist::TpRank& tp = {});

/// Loads a Mamba-2 model onto the GPU (the same dummy values as the CPU model). Throws Error as load_mamba_cuda
/// (use_bias, conv_kernel > 8, state_size > 256, no GPU). With tp.world > 1: heads and groups split as on the CPU
/// (n_groups == 1 is refused there), out_proj all-reduced.
std::unique_ptr<CausalLM> load_mamba2_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt = {},
                                           const dist::TpRank& tp = {});

/// Loads `config` over GPUs 0..tensor_parallel_size-1 (one runner shard each, through an NCCL group) as one
/// CausalLM (a TensorParallelLM). Throws Error when NCCL is missing, too few GPUs are visible, or a shard fails.
std::unique_ptr<CausalLM> load_cuda_tensor_parallel(const ModelConfig& config, LoadFormat format, int tensor_parallel_size,
                                                    CudaModelOptions opt = {});

/// Registers the NCCL tensor-parallel loader of every architecture (cuda_tensor_parallel.cpp).
void register_cuda_tensor_parallel();

/// Registers the GPU runner with the model registry (device "cuda") for every architecture; the app calls it once at
/// start.
void register_cuda_backend();

}  // namespace ssmserve::cuda
