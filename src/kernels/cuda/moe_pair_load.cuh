// Owns the per-pair MoE GEMVs' weight loads and per-lane sums (moe.cu's pair_gemv_kernel, moe_down_combine.cu's
// down_combine_kernel): the same loads and the same FMA chain in each, so the two give the same bits.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace ssmserve::cuda::detail {

/// 8 bf16 weights streamed once (bypassing L1).
__device__ __forceinline__ uint4 load_stream8(const __nv_bfloat16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

/// An int32 another grid wrote, read from L2 (the point of coherence; no L1 line of an earlier launch can answer).
__device__ __forceinline__ int32_t load_l2_i32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

/// k chunks per group: about 8 weight loads per lane in flight (at most 4 chunks).
constexpr int pair_unroll(int R, int mats) { return 8 / (R * mats) < 1 ? 1 : 8 / (R * mats) > 4 ? 4 : 8 / (R * mats); }

/// Loads chunks j0 .. j0 + U - 1 (those < nj) of the R rows (wb: the gated experts' up rows, M == 2) into va / vb.
/// Chunk j of a lane's row pointer w is w + 256 j (the caller offsets w by lane * 8).
template <int U, int R, int M>
__device__ __forceinline__ void pair_load_group(uint4 (&va)[U][R], uint4 (&vb)[U][R], const __nv_bfloat16* const (&wa)[R],
                                                const __nv_bfloat16* const (&wb)[R], int j0, int nj) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int q = 0; q < R; ++q)
      if (j0 + u < nj) {
        va[u][q] = load_stream8(wa[q] + 256 * static_cast<int64_t>(j0 + u));
        if constexpr (M == 2) vb[u][q] = load_stream8(wb[q] + 256 * static_cast<int64_t>(j0 + u));
      }
}

/// Adds the products of loaded chunks j0 .. j0 + U - 1 (those < nj) to the lane's sums: g[q] += in * wa (u[q] += in *
/// wb when M == 2), 8 FMAs per chunk in ascending i (the old per-element kernels' expression, in * w + acc). in: the
/// pair's input row in shared memory (bf16), offset by lane * 8.
template <int U, int R, int M>
__device__ __forceinline__ void pair_fma_group(float (&g)[R], float (&u)[R], const uint4 (&va)[U][R], const uint4 (&vb)[U][R],
                                               const __nv_bfloat16* in, int j0, int nj) {
#pragma unroll
  for (int s = 0; s < U; ++s) {
    if (j0 + s >= nj) continue;
    const uint4 xv = *reinterpret_cast<const uint4*>(in + 256 * (j0 + s));
    const __nv_bfloat16* xe = reinterpret_cast<const __nv_bfloat16*>(&xv);
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const __nv_bfloat16* ae = reinterpret_cast<const __nv_bfloat16*>(&va[s][q]);
#pragma unroll
      for (int i = 0; i < 8; ++i) g[q] += __bfloat162float(xe[i]) * __bfloat162float(ae[i]);
      if constexpr (M == 2) {
        const __nv_bfloat16* be = reinterpret_cast<const __nv_bfloat16*>(&vb[s][q]);
#pragma unroll
        for (int i = 0; i < 8; ++i) u[q] += __bfloat162float(xe[i]) * __bfloat162float(be[i]);
      }
    }
  }
}

}  // namespace ssmserve::cuda::detail
