// Owns the tiled tensor copies of the Hopper copy engine (sm_90 "TMA", PTX ISA "cp.async.bulk.tensor"): the host-side
// tensor map of a bf16 tensor with 128-byte-swizzled boxes (the driver's cuTensorMapEncodeTiled, found through the
// runtime's driver entry points, so nothing links libcuda), and the device-side 2D / 3D box loads into shared memory
// that complete on an mbarrier (tma_ring.cuh's mbar_* operations). A box whose inner extent is 64 bf16 (128 bytes) lands
// in the wgmma K-major 128-byte-swizzle layout (wgmma_bf16.cuh): row r at r * 128, its 16-byte chunk c at chunk
// c ^ (r % 8), given a 1024-byte-aligned destination. Elements outside the tensor are filled with zeros, and the
// transaction count is always the whole box.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

namespace ssmserve::cuda::detail {

/// Host: the driver's cuTensorMapEncodeTiled (null when the driver has none), looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

/// Host: fills `map` with the tiled map of a bf16 tensor of `rank` (2 or 3) dimensions, innermost first: dims[i]
/// elements, strides[i - 1] bytes between consecutive indices of dimension i (multiples of 16), box[i] elements per
/// copy (box[0] * 2 == 128: the 128-byte swizzle), zero fill outside. base must be 16-byte aligned.
/// Returns cudaErrorNotSupported when the driver has no cuTensorMapEncodeTiled, cudaErrorInvalidValue when it
/// rejects the shape.
inline cudaError_t tma_map_bf16_sw128(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                                      const uint64_t* strides, const uint32_t* box) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tma_encoder();
  if (!encode) return cudaErrorNotSupported;
  if (rank < 2 || rank > 3 || box[0] * 2 != 128 || (reinterpret_cast<uintptr_t>(base) & 15) != 0)
    return cudaErrorInvalidValue;
  cuuint64_t d[3], st[2];
  cuuint32_t b[3], es[3] = {1, 1, 1};
  for (int i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i];
  for (int i = 0; i + 1 < rank; ++i) st[i] = strides[i];
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, static_cast<cuuint32_t>(rank), const_cast<void*>(base),
                            d, st, b, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

/// Device: the box at element coordinates (c0 innermost, c1[, c2]) of `map` (a __grid_constant__ kernel parameter)
/// into shared address dst (1024-byte aligned for the swizzle), completing `box bytes` of transactions on mbarrier bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
/// Device: fetches a tensor map (kernel parameter) into the descriptor cache ahead of its first copy.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace ssmserve::cuda::detail
