// Owns Programmatic Dependent Launch (PDL, sm_90) for the decode kernels: a kernel launched with launch_pdl may
// start while its predecessor on the stream is still running; it must call pdl_wait() before it reads anything
// the predecessor wrote or writes anything the predecessor reads. Work that depends on no predecessor (e.g. L2
// prefetch of constant weights) goes before the wait; pdl_launch_dependents() right after the wait lets the next
// kernel's blocks become resident (so at most one kernel runs ahead). Both are no-ops when the kernel was
// launched without the attribute. Captured into CUDA graphs as programmatic edges.
#pragma once
#include <cuda_runtime.h>

namespace ssmserve::cuda::detail {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Hints the L2 to fetch the 128-byte line holding p (prefetch.global.L2: never faults, never changes a result), e.g.
/// a decode row's state before pdl_wait(): L2 is the point of coherence, so a line fetched early is never stale.
__device__ __forceinline__ void pdl_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/// Launches kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when
/// `pdl` is set. Returns the launch status.
template <class... KArgs, class... Args>
cudaError_t launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...);
}

}  // namespace ssmserve::cuda::detail
