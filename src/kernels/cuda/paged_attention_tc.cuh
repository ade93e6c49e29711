// Shared by the tensor-core prefill attention's tile kernels (paged_attention_tc.cu: mma.sync per warp, the fp32 or the
// staged bf16 keys; paged_attention_tc_wg.cu: sm_90a wgmma per warpgroup on the staged keys; paged_attention_tc_ws.cu:
// its warp-specialized form): tile sizes, the merge arithmetic of key chunks (one arithmetic for the in-block merge and
// the combine kernel), the warpgroup launches.
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

/// One block's tile (tc_kernel, tc_wg_kernel): grid (tiles, or items with num_tc_items > 0, longest contexts first;
/// num_kv_heads). Query row qi of the tile is token qi / group of row `row` (from token off on, nt tokens), head
/// g group + qi % group; the tile's last position is pos0 + nt - 1.
struct TcTile {
  int item, tile, ichunk, slot, g, group, row, off, nt, n, sl, pos0, nq;
  int64_t t0;
  __device__ __forceinline__ TcTile(const PagedAttentionArgs& a, int num_kv_heads) {
    item = a.num_tc_items > 0 ? a.num_tc_items - 1 - static_cast<int>(blockIdx.x) : -1;
    tile = item >= 0 ? a.tc_items[3 * item] : a.num_tc_tiles - 1 - static_cast<int>(blockIdx.x);
    ichunk = item >= 0 ? a.tc_items[3 * item + 1] : -1, slot = item >= 0 ? a.tc_items[3 * item + 2] : -1;
    g = blockIdx.y, group = a.num_heads / num_kv_heads;
    row = a.tc_tiles[3 * tile], off = a.tc_tiles[3 * tile + 1], nt = a.tc_tiles[3 * tile + 2];
    n = a.query_start_loc[row + 1] - a.query_start_loc[row], sl = a.seq_lens[row];
    pos0 = sl - n + off, nq = nt * group;
    t0 = a.query_start_loc[row] + off;
  }
  /// Element offset of query row qi's head in a [tokens][heads * D] array of row stride stride (q or out).
  __device__ __forceinline__ int64_t row_offset(int qi, int64_t stride, int D) const {
    return (t0 + qi / group) * stride + static_cast<int64_t>(g * group + qi % group) * D;
  }
};

/// The block's keys (after the empty-tile return): chunks of tc_chunk_keys(sl) keys up to the tile's last position,
/// [k_lo, k_end) for this block (whole chunks, multiples of kKeys, but the tile's last); partial: one chunk of
/// several, written to the workspace for tc_combine_kernel.
struct TcKeys {
  int last, chunk, nchunks, c_begin, c_end, k_lo, k_end;
  bool partial;
  __device__ __forceinline__ explicit TcKeys(const TcTile& b) {
    last = b.pos0 + b.nt - 1, chunk = tc_chunk_keys(b.sl), nchunks = last / chunk + 1;
    c_begin = b.ichunk >= 0 ? b.ichunk : 0, c_end = b.ichunk >= 0 ? b.ichunk + 1 : nchunks;
    partial = c_end - c_begin < nchunks && b.slot >= 0;
    k_lo = c_begin * chunk, k_end = min(last + 1, c_end * chunk);
  }
};

/// The online softmax of this thread's two query rows (rows a and a + 8 of its warp's 16; positions pa, pb, -1 for
/// none) over a kKeys-key tile from key kb: the tile's scores in the mma C fragment (sc(4 nn + e): key kb + 8 nn +
/// 2 t + (e & 1), row a for e < 2, else a + 8; sc(i) a float&) masked (causal) and scaled (sl2: log2 units), the
/// chunk's running max m / quad-partial sum l updated, the scores replaced by e^(s - max); al0 / al1: the factors of
/// the rows' accumulators. The one arithmetic of both tile kernels.
template <class Sc>
__device__ __forceinline__ void softmax_tile(Sc&& sc, int kb, int t, int pa, int pb, float sl2, float& m0, float& m1,
                                             float& l0, float& l1, float& al0, float& al1) {
  constexpr int NK = kKeys / 8;
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int nn = 0; nn < NK; ++nn)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = kb + 8 * nn + 2 * t + e;
      sc(4 * nn + e) = j <= pa ? sc(4 * nn + e) * sl2 : -INFINITY;
      sc(4 * nn + 2 + e) = j <= pb ? sc(4 * nn + 2 + e) * sl2 : -INFINITY;
      mx0 = fmaxf(mx0, sc(4 * nn + e));
      mx1 = fmaxf(mx1, sc(4 * nn + 2 + e));
    }
#pragma unroll
  for (int s = 1; s <= 2; s <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, s));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, s));
  }
  const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
  // Fully masked rows so far keep max -inf: use 0 as the reference (every p is then 0).
  const float r0 = n0 == -INFINITY ? 0.0f : n0, r1 = n1 == -INFINITY ? 0.0f : n1;
  al0 = exp2f(m0 - r0), al1 = exp2f(m1 - r1);
  m0 = n0, m1 = n1;
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
  for (int nn = 0; nn < NK; ++nn) {
    sc(4 * nn) = exp2f(sc(4 * nn) - r0), sc(4 * nn + 1) = exp2f(sc(4 * nn + 1) - r0);
    sc(4 * nn + 2) = exp2f(sc(4 * nn + 2) - r1), sc(4 * nn + 3) = exp2f(sc(4 * nn + 3) - r1);
    s0 += sc(4 * nn) + sc(4 * nn + 1);
    s1 += sc(4 * nn + 2) + sc(4 * nn + 3);
  }
  l0 = l0 * al0 + s0, l1 = l1 * al1 + s1;
}

/// The end of a key chunk for this thread's two rows (valid: qa < nq, qb < nq): the quad's sums l0 / l1 completed,
/// then either (partial) the chunk's unnormalized accumulators, max and sum to the workspace rows wa / wb, or the
/// chunk merged into the rows' running state M / L and the accumulators kept in their own elements of out (wa / wb),
/// normalized after the last chunk (fin). acc(nn, e): element e of the accumulator fragment of columns 8 nn ..
/// 8 nn + 7 (e < 2: row qa, columns 8 nn + 2 t + e; else row qb). The caller resets m, l and the accumulators.
template <int D, class Acc>
__device__ __forceinline__ void chunk_out(Acc&& acc, bool partial, int ch, bool fin, float* wa, float* wb, bool va,
                                          bool vb, int t, float& M0, float& M1, float& L0, float& L1, float m0,
                                          float m1, float& l0, float& l1) {
  constexpr int NO = D / 8;
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  if (partial) {  // this chunk's (acc, max, sum) for tc_combine_kernel
#pragma unroll
    for (int nn = 0; nn < NO; ++nn) {
      const int c = 8 * nn + 2 * t;
      if (va) *reinterpret_cast<float2*>(wa + c) = make_float2(acc(nn, 0), acc(nn, 1));
      if (vb) *reinterpret_cast<float2*>(wb + c) = make_float2(acc(nn, 2), acc(nn, 3));
    }
    if (t == 0 && va) wa[D] = m0, wa[D + 1] = l0;
    if (t == 0 && vb) wb[D] = m1, wb[D + 1] = l1;
    return;
  }
  // Merge into the rows' running state (this thread's own elements of out hold the unnormalized accumulators
  // between chunks); the last chunk writes the normalized output.
  float sa0, sb0, sa1, sb1;
  merge_stats(M0, L0, m0, l0, sa0, sb0);
  merge_stats(M1, L1, m1, l1, sa1, sb1);
  const float i0 = !fin ? 1.0f : L0 > 0.0f ? 1.0f / L0 : 0.0f, i1 = !fin ? 1.0f : L1 > 0.0f ? 1.0f / L1 : 0.0f;
#pragma unroll
  for (int nn = 0; nn < NO; ++nn) {
    const int c = 8 * nn + 2 * t;
    if (va) {
      float2* o = reinterpret_cast<float2*>(wa + c);
      const float2 run = ch == 0 ? make_float2(0.0f, 0.0f) : *o;
      float x = merge_acc(run.x, sa0, acc(nn, 0), sb0), y = merge_acc(run.y, sa0, acc(nn, 1), sb0);
      if (fin) x = __fmul_rn(x, i0), y = __fmul_rn(y, i0);
      *o = make_float2(x, y);
    }
    if (vb) {
      float2* o = reinterpret_cast<float2*>(wb + c);
      const float2 run = ch == 0 ? make_float2(0.0f, 0.0f) : *o;
      float x = merge_acc(run.x, sa1, acc(nn, 2), sb1), y = merge_acc(run.y, sa1, acc(nn, 3), sb1);
      if (fin) x = __fmul_rn(x, i1), y = __fmul_rn(y, i1);
      *o = make_float2(x, y);
    }
  }
}

/// Launches the warpgroup tile kernel (paged_attention_tc_wg.cu) for head_dim D (tc_wgmma_head_dim_ok) on grid (tiles or
/// items, num_kv_heads): the tiles of a.tc_tiles over the staged bf16 keys kb (the planes stage_kernel wrote, see
/// paged_attention_tc), writing `out` or, for items of split tiles, the chunk partials in ws for tc_combine_kernel
/// (launched by the caller), as tc_kernel does. Q K^T as m64n64k16 and P V as m64n128k16 (P from registers), fp32
/// accumulators, the same fp32 online softmax and chunk merges: within bf16 rounding of the mma.sync kernel, not
/// bit-identical to it; each row's bits depend only on its own queries and keys.
cudaError_t launch_tc_wg(int D, dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                         const PagedAttentionArgs& a, float* ws, const __nv_bfloat16* kb, cudaStream_t stream);
/// Launches the warp-specialized form of the warpgroup tile kernel (paged_attention_tc_ws.cu; KernelTuning::attn_tc_ws)
/// with launch_tc_wg's arguments and results: a TMA producer warpgroup feeding K / V rings over mbarriers, two consumer
/// warpgroups overlapping each tile's softmax with the previous tile's P V (FlashAttention-3); ping_pong: the two
/// consumer warpgroups also take turns to issue their products. The same products, softmax and merges as
/// tc_wg_kernel in the same order per output element. Returns cudaErrorNotSupported, having launched nothing, when the
/// driver cannot encode the staged planes' tensor map (the caller then takes launch_tc_wg).
cudaError_t launch_tc_ws(int D, bool ping_pong, dim3 grid, const float* q, int64_t qs, float* out, int64_t os,
                         const KvCacheView& cache, const PagedAttentionArgs& a, float* ws, const __nv_bfloat16* kb,
                         cudaStream_t stream);

}  // namespace ssmserve::cuda::tc
