// Owns the dense matrix product of the CUDA backend through cuBLASLt: y[M, N] = x[M, K] W[N, K]^T with fp32
// accumulation (the GPU counterpart of kernels/cpu/linear.h). Operands bf16 x bf16 (tensor cores) or fp32 x fp32
// (exact fp32, no TF32: tests and small models); output fp32 or bf16. Row-major, row strides in elements.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "device/device.h"

namespace ssmserve::cuda {

/// One GEMM's operands (device pointers, row-major).
struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;  ///< [M, K], row stride x_stride >= K
  int64_t x_stride = 0;
  const void* w = nullptr;  ///< [N, K], row stride w_stride >= K (a Linear weight as stored)
  int64_t w_stride = 0;
  DType ab_dtype = DType::BF16;  ///< dtype of x and w: BF16 or F32
  void* y = nullptr;             ///< [M, N], row stride y_stride >= N; must not alias x or w
  int64_t y_stride = 0;
  DType y_dtype = DType::F32;    ///< F32 or BF16
};

/// A cuBLASLt handle with its workspace (32 MiB). Create one per device; not thread-safe.
class GemmHandle {
 public:
  GemmHandle();
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  /// Enqueues y = x W^T on `stream`. Throws Error on bad sizes / dtypes or when cuBLASLt has no algorithm or fails.
  void run(const GemmArgs& a, cudaStream_t stream);

 private:
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace ssmserve::cuda
