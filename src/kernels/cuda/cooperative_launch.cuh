// Owns the host side of the grid-resident (cooperative) kernels of the dataflow decode
// kernels: the device's SM count and a cooperative launch of one block per SM.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace ssmserve::cuda::detail {

/// SMs of the current device when first called (0 if it cannot be queried); cached for the process.
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 0;
    return v;
  }();
  return n;
}

/// Launches kernel(params) with one block of `threads` threads and `smem` bytes of dynamic shared memory per SM,
/// cooperatively (every block co-resident, so blocks may wait for each other). Errors: the runtime's, or
/// cudaErrorNoDevice without an SM count, cudaErrorInvalidConfiguration when one block does not fit an SM.
template <class Kernel, class Params>
cudaError_t cooperative_launch_per_sm(Kernel kernel, int threads, size_t smem, cudaStream_t stream, const Params& params) {
  const int sms = sm_count();
  if (sms < 1) return cudaErrorNoDevice;
  if (smem > 48 * 1024)
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        e != cudaSuccess)
      return e;
  int per_sm = 0;
  if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem); e != cudaSuccess)
    return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(sms));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, params);
}

}  // namespace ssmserve::cuda::detail
