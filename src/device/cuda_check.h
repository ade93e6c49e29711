// Owns the conversion of CUDA runtime / cuBLASLt status codes into ssmserve::Error, so that a failed device call
// surfaces like any other failure (a message naming the call, the code and where it was made).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace ssmserve::cuda {

/// Throws Error "CUDA error <name> (<string>) in <what> at <file>:<line>" when `e` != cudaSuccess.
void check(cudaError_t e, const char* what, const char* file, int line);
/// Throws Error "cuBLASLt error <code> in <what> at <file>:<line>" when `s` != CUBLAS_STATUS_SUCCESS.
void check(cublasStatus_t s, const char* what, const char* file, int line);

}  // namespace ssmserve::cuda

/// SSM_CUDA_CHECK(expr): evaluates a cudaError_t / cublasStatus_t expression and throws ssmserve::Error on failure.
#define SSM_CUDA_CHECK(expr) ::ssmserve::cuda::check((expr), #expr, __FILE__, __LINE__)
