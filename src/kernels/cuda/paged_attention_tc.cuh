// Shared by the tensor-core prefill attention's tile kernels (paged_attention_tc.cu: mma.sync per warp, the fp32 or the
// staged bf16 keys; paged_attention_tc_wg.cu: sm_90a wgmma per warpgroup on the staged keys): tile sizes, the merge
// arithmetic of key chunks (one arithmetic for the in-block merge and the combine kernel), the warpgroup launch.
#pragma once
#include <cuda_bf16.h>

#include "kernels/cuda/paged_attention.h"

namespace ssmserve::cuda::tc {

constexpr int kRows = kTcRows;  // query rows (tokens x heads of one KV head) per tile
constexpr int kKeys = 64;       // keys per shared-memory tile
constexpr int kThreads = 256;   // 8 warps x 16 query rows

/// Merges a chunk's (max m, sum l) into a row's running (M, L): sa, sb scale the running and the chunk's
/// accumulators (merge_acc). Log2 units. The one arithmetic of both the in-block merge and tc_combine_kernel (explicit
/// roundings: no contraction differences), so splitting a tile over blocks leaves its bits unchanged.
__device__ __forceinline__ void merge_stats(float& M, float& L, float m, float l, float& sa, float& sb) {
  const float nm = fmaxf(M, m), r = nm == -INFINITY ? 0.0f : nm;
  sa = exp2f(M - r), sb = exp2f(m - r);
  L = __fmaf_rn(l, sb, __fmul_rn(L, sa));
  M = nm;
}
__device__ __forceinline__ float merge_acc(float run, float sa, float x, float sb) { return __fmaf_rn(x, sb, __fmul_rn(run, sa)); }

/// Launches the warpgroup tile kernel (paged_attention_tc_wg.cu) for head_dim D (tc_wgmma_head_dim_ok) on grid (tiles or
/// items, num_kv_heads): the tiles of a.tc_tiles over the staged bf16 keys kb (the planes stage_kernel wrote, see
/// paged_attention_tc), writing `out` or, for items of split tiles, the chunk partials in ws for tc_combine_kernel
/// (launched by the caller), as tc_kernel does. Q K^T as m64n64k16 and P V as m64n128k16 (P from registers), fp32
/// accumulators, the same fp32 online softmax and chunk merges: within bf16 rounding of the mma.sync kernel, not
/// bit-identical to it; each row's bits depend only on its own queries and keys.
cudaError_t launch_tc_wg(int D, dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                         const PagedAttentionArgs& a, float* ws, const __nv_bfloat16* kb, cudaStream_t stream);

}  // namespace ssmserve::cuda::tc
