// Shared by the tensor-core prefill attention's warpgroup tile kernels (paged_attention_tc_wg.cu: two warpgroups in
// lockstep, cp.async loads; paged_attention_tc_ws.cu: a TMA producer and two consumer warpgroups): the layout of a
// [64][D] bf16 tile in shared memory (D / 64 column blocks of 8 KB, 128-byte swizzle: what a TMA box of [64 rows][64
// columns] with CU_TENSOR_MAP_SWIZZLE_128B writes, tma_tensor.cuh) and the wgmma descriptors of its k steps.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/wgmma_bf16.cuh"

namespace ssmserve::cuda::tc {

/// Byte offset of the 16-byte chunk c8 (columns 8 c8 .. 8 c8 + 7) of row r (< 64) in a [64][D] bf16 tile stored as
/// D / 64 column blocks of 64 (8 KB each, 128-byte swizzle: row r at (r / 8) 1024 + (r % 8) 128, chunk c at c ^ (r % 8)).
__device__ __forceinline__ int tile_off(int r, int c8) {
  return (c8 >> 3) * 8192 + (r >> 3) * 1024 + (r & 7) * 128 + (((c8 & 7) ^ (r & 7)) << 4);
}

/// K-major descriptor of the 16-wide k step k of a swizzled [64][D] tile (a 32-byte start offset within a 64-column
/// block); MN-major descriptor of its 16-row k step k, 64-column blocks 8 KB apart (LBO), 8-row groups 1 KB (SBO).
__device__ __forceinline__ uint64_t kmaj(const unsigned char* tile, int k) {
  return detail::wg_desc(tile + (k >> 2) * 8192 + (k & 3) * 32, 16, 1024, true);
}
__device__ __forceinline__ uint64_t vmaj(const unsigned char* tile, int k) {
  return detail::wg_desc(tile + 2048 * k, 8192, 1024, true);
}

}  // namespace ssmserve::cuda::tc
