// Owns the declarations of the GPU module factories (one file each in src/runtime/modules/), listed in
// cuda_module_registry.cpp.
#pragma once
#include <memory>

#include "kernels/cuda/causal_conv1d.h"
#include "runtime/cuda_module.h"

namespace ssmserve::cuda {

std::unique_ptr<CudaModule> make_cuda_mamba1(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_mamba2(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_lightning(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_gated_delta(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_attention(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_moe(const CudaModuleArgs& args);
std::unique_ptr<CudaModule> make_cuda_mlp(const CudaModuleArgs& args);
/// A recurrent mixer's in_proj, proj [T, PW] (row stride PW) = normed [T, hidden] in_proj^T, with its decode conv in
/// the GEMM's epilogue (CudaModelOptions::decode_conv_epilogue; skinny_gemm.h SkinnyConvEpilogue): the conv over
/// proj's columns [conv_col0, conv_col0 + conv.dim) of the step's plain decode rows [0, nd) into conv_out (row stride
/// conv_out_stride), bit-identical to conv1d_update_dual over the written proj. Returns true when the conv ran so;
/// false when the step has no decode rows, has verify rows, its GEMM is off the skinny kernel or the option is off: the
/// GEMM alone ran and the caller launches the conv. Throws Error on a launch failure.
bool in_proj_with_decode_conv(const CudaRunnerContext& ctx, const CudaStep& st, const void* normed, int64_t hidden,
                              const DevWeight& in_proj, float* proj, int64_t PW, int64_t nd, int64_t conv_col0,
                              const ConvParams& conv, float* conv_out, int64_t conv_out_stride);
/// Mamba-1's whole-stack decode path (the dataflow kernel, CudaModelOptions::dataflow_decode).
CudaStackDecodeFn cuda_mamba1_stack_decode();

}  // namespace ssmserve::cuda
