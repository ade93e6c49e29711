// Owns the device-side helpers shared by the CUDA kernels: activations with the CPU kernels' conventions, state
// element load/store (fp32 / bf16 / fp16, round to nearest even), warp and block reductions, launch checks.
#pragma once
#include "kernels/cuda/kernel_tuning.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/dtype.h"

namespace ssmserve::cuda::detail {

/// SiLU(x) = x * sigmoid(x) (as cpu::silu).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
/// The dense MLP's activation of one column (cpu: model/ffns/mlp_ffn.cpp): gated: silu(gate) * up; else relu(gate)^2.
__device__ __forceinline__ float mlp_act_value(float gate, float up, bool gated) {
  return gated ? silu(gate) * up : (gate > 0.0f ? gate * gate : 0.0f);
}
/// The attention output gate of one element: o * sigmoid(g) (sigmoid_gate's kernels).
__device__ __forceinline__ float sigmoid_gate_value(float o, float g) { return o * (1.0f / (1.0f + expf(-g))); }
/// softplus(x) = log1p(exp(x)) for x <= 20, else x (PyTorch's threshold, as cpu::softplus).
__device__ __forceinline__ float softplus(float x) { return x <= 20.0f ? log1pf(expf(x)) : x; }

/// State / activation element loads and stores (widen exactly, round to nearest even).
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

/// Calls f(T{}) with T the device element type of `t`: float, __nv_bfloat16 or __half.
template <class F>
cudaError_t visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::BF16: return f(__nv_bfloat16{});
    case DType::F16: return f(__half{});
    case DType::F32: break;
  }
  return f(float{});
}

/// Sum over all lanes of the warp (every lane gets the result).
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// `scratch` is 32 floats of shared memory; the call contains __syncthreads and must be reached by all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(r);
}

/// x a + y b with explicit roundings (y b rounded, then one fused multiply-add): the residual update of every kernel
/// that applies a sublayer's scaled residual (scaled_residual, scaled_residual2 and the residual norms that take the
/// update over), so each gives the same bits; left to the compiler, the contraction of the two products may differ.
/// With a = b = 1 it is the plain sum x + y, rounded once.
__device__ __forceinline__ float residual_step(float x, float a, float y, float b) {
  return __fmaf_rn(x, a, __fmul_rn(y, b));
}

/// sigmoid(x . w) over H columns, computed by the whole block (thread-strided FMA partial sums in ascending column,
/// then block_sum; the same bits for the same blockDim.x): Qwen's shared_expert_gate. Every thread gets the result;
/// it must be reached by all threads (block_sum). scratch: 32 floats of shared memory.
__device__ __forceinline__ float block_sigmoid_dot(const float* __restrict__ x, const float* __restrict__ w, int64_t H,
                                                   float* scratch) {
  float d = 0.0f;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) d = __fmaf_rn(x[c], w[c], d);
  d = block_sum(d, scratch);
  return 1.0f / (1.0f + expf(-d));
}

/// Makes the default stream-ordered memory pool of the current device keep freed memory (so the chunked scans'
/// per-call workspaces from cudaMallocAsync are reused, not returned to the driver at every synchronization).
inline void keep_pool_memory() {
  static const bool done = [] {
    int dev = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
      uint64_t keep = ~uint64_t{0};
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    cudaGetLastError();
    return true;
  }();
  (void)done;
}

/// SSMSERVE_KERNEL_PROFILE=1 (benchmarks only; the device image has no Nsight Systems): times the launches of
/// a multi-kernel op with events and prints "name ms" lines to stderr after synchronizing the stream.
struct LaunchProfile {
  cudaStream_t stream;
  const char* names[8] = {};
  cudaEvent_t ev[9] = {};
  int n = -1;  // -1: off
  explicit LaunchProfile(cudaStream_t s) : stream(s) {
    if (!kernel_tuning().kernel_profile) return;
    n = 0;
    cudaEventCreate(&ev[0]);
    cudaEventRecord(ev[0], stream);
  }
  void mark(const char* name) {
    if (n < 0 || n >= 8) return;
    names[n] = name;
    cudaEventCreate(&ev[n + 1]);
    cudaEventRecord(ev[++n], stream);
  }
  ~LaunchProfile() {
    if (n < 0) return;
    cudaStreamSynchronize(stream);
    for (int i = 0; i < n; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
      std::fprintf(stderr, "profile %-24s %.4f ms\n", names[i], ms);
    }
    for (int i = 0; i <= n; ++i) cudaEventDestroy(ev[i]);
  }
};

/// Opts `kernel` in to `bytes` of dynamic shared memory on the current device, once per device (the attribute is
/// per device: tensor-parallel ranks launch the same kernel on several GPUs). `opted_in`: the caller's per-kernel
/// bitmask of devices done (a function-local static). Returns the cudaFuncSetAttribute / cudaGetDevice error.
template <class Kernel>
inline cudaError_t opt_in_dynamic_smem(Kernel kernel, size_t bytes, std::atomic<uint64_t>& opted_in) {
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (opted_in.load(std::memory_order_acquire) & bit) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      e != cudaSuccess)
    return e;
  opted_in.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

/// The launch's status: the error of the launch just made, if any.
inline cudaError_t launch_status() { return cudaGetLastError(); }

__host__ __device__ inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace ssmserve::cuda::detail
