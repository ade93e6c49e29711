// Owns loads through the L2 (ld.global.cg: the point of coherence, so no L1 line of an earlier launch can answer) of
// data another grid wrote, for kernels that read it before their PDL wait (pdl.cuh: written two or more launches
// back) or read other blocks' results of their own grid; and L2 hints for constants read after the wait.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ssmserve::cuda::detail {

__device__ __forceinline__ float load_cg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float load_cg(const __nv_bfloat16* p) { return __bfloat162float(__ldcg(p)); }
__device__ __forceinline__ float load_cg(const __half* p) { return __half2float(__ldcg(p)); }
__device__ __forceinline__ int32_t load_cg(const int32_t* p) { return __ldcg(p); }

/// Hints the L2 to fetch p's 128-byte line (prefetch.global.L2: never faults, never a result). For constants a kernel
/// reads after its PDL wait, hinted before it.
__device__ __forceinline__ void l2_hint(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace ssmserve::cuda::detail
