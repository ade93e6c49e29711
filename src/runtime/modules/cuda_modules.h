// Owns the declarations of the GPU module factories (one file each in src/runtime/modules/), listed in
// cuda_module_registry.cpp.
#pragma once
#include <memory>

#include "runtime/cuda_module.h"

namespace ssmserve::cuda {

std::unique_ptr<CudaModule> make_cuda_mamba1(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_mamba2(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_lightning(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_gated_delta(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_attention(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_moe(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_mlp(const CudaModuleArgs& args);
/// Mamba-1's whole-stack decode path (the dataflow kernel, CudaModelOptions::dataflow_decode).
CudaStackDecodeFn cuda_mamba1_stack_decode();

}  // namespace ssmserve::cuda
