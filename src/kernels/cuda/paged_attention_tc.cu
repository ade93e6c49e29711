// Owns the tensor-core prefill pass of the GPU paged attention (see paged_attention.h, PagedAttentionArgs::tc_tiles):
// FlashAttention-2 style over the paged fp32 KV cache, bf16 operands on mma.sync m16n8k16 with fp32 accumulation and
// an fp32 online softmax per key chunk, chunks merged in order (in one block, or over blocks and a combine kernel).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/paged_attention.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

constexpr int kRows = kTcRows; // query rows (tokens x heads of one KV head) per tile
constexpr int kKeys = 64;     // keys per shared-memory tile
constexpr int kThreads = 128; // 4 warps x 16 query rows

/// Rows [0, n) of a 64-row fp32 tile into dst [64][D + 8] as bf16 (rows >= n zero); src(r) gives row r's pointer.
/// Up to head_dim 128 a thread issues its loads in groups of U before converting any, so several are in flight at
/// once (at 256 the accumulators leave no registers for that).
template <int D, class F>
__device__ __forceinline__ void stage_rows(bf16* dst, int n, F&& src) {
  constexpr int V = D / 4, LD = D + 8, PER = kRows * V / kThreads, U = D <= 64 ? 4 : D <= 128 ? 2 : 1;
  static_assert(PER % U == 0, "whole groups of loads");
#pragma unroll 1
  for (int b = 0; b < PER; b += U) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = (b + u) * kThreads + threadIdx.x, r = idx / V, c = (idx % V) * 4;
      x[u] = r < n ? __ldg(reinterpret_cast<const float4*>(src(r) + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = (b + u) * kThreads + threadIdx.x, r = idx / V, c = (idx % V) * 4;
      uint2 o;
      o.x = pack_bf16(x[u].x, x[u].y);
      o.y = pack_bf16(x[u].z, x[u].w);
      *reinterpret_cast<uint2*>(dst + r * LD + c) = o;
    }
  }
}

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

/// Grid (num_tc_tiles or num_tc_items, num_kv_heads). Tile (row, first token off, tokens nt): query row qi = token
/// qi / group, head g * group + qi % group; keys 0 .. last position of the tile, causal per query token, in chunks
/// of tc_chunk_keys(seq_len) keys. A block of a whole tile (no items, or item (tile, -1, -1)) walks all its chunks,
/// keeping the merged unnormalized accumulators in its own rows of `out` between chunks; an item (tile, chunk, slot)
/// of a tile of several chunks writes that chunk's partial to ws[slot, g, qi] = (acc[D], max, sum) for
/// tc_combine_kernel.
/// Blocks per SM as before the chunking (registers: 3 at head_dim 128, 4 at 64).
template <int D>
__global__ void __launch_bounds__(kThreads, D == 256 ? 1 : D == 128 ? 3 : 4)
    tc_kernel(const float* __restrict__ q, int64_t qs, float* __restrict__ out, int64_t os, KvCacheView cache,
              PagedAttentionArgs a, float* __restrict__ ws) {
  constexpr int LD = D + 8, KD = D / 16, NO = D / 8, NK = kKeys / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kRows * LD;
  bf16* Vs = Ks + kKeys * LD;
  // Longest contexts first (tiles and items are in row order, a row's tiles by position).
  const int item = a.num_tc_items > 0 ? a.num_tc_items - 1 - static_cast<int>(blockIdx.x) : -1;
  const int tile = item >= 0 ? a.tc_items[3 * item] : a.num_tc_tiles - 1 - static_cast<int>(blockIdx.x);
  const int ichunk = item >= 0 ? a.tc_items[3 * item + 1] : -1, slot = item >= 0 ? a.tc_items[3 * item + 2] : -1;
  const int g = blockIdx.y, KVH = cache.num_kv_heads, group = a.num_heads / KVH;
  const int row = a.tc_tiles[3 * tile], off = a.tc_tiles[3 * tile + 1], nt = a.tc_tiles[3 * tile + 2];
  const int n = a.query_start_loc[row + 1] - a.query_start_loc[row], sl = a.seq_lens[row];
  const int pos0 = sl - n + off, nq = nt * group;
  const int64_t t0 = a.query_start_loc[row] + off;
  auto qrow = [&](int qi) { return (t0 + qi / group) * qs + static_cast<int64_t>(g * group + qi % group) * D; };
  auto orow = [&](int qi) { return (t0 + qi / group) * os + static_cast<int64_t>(g * group + qi % group) * D; };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3, wr = warp * 16;
  if (sl == 0 || nt <= 0) {
    for (int idx = threadIdx.x; idx < nq * D; idx += kThreads) out[orow(idx / D) + idx % D] = 0.0f;
    return;
  }
  const int last = pos0 + nt - 1, chunk = tc_chunk_keys(sl), nchunks = last / chunk + 1;
  const int c_begin = ichunk >= 0 ? ichunk : 0, c_end = ichunk >= 0 ? ichunk + 1 : nchunks;
  const bool partial = c_end - c_begin < nchunks && slot >= 0;  // one chunk of several: to the workspace
  stage_rows<D>(Qs, nq, [&](int r) { return q + qrow(r); });
  __syncthreads();
  // Q's A fragments stay in registers up to head_dim 128; at 256 the 128 accumulators of a thread need the room, so
  // the fragments are re-read from Qs (never overwritten) for every key tile, as FlashAttention-2 does at that size.
  constexpr bool kQInRegs = D <= 128;
  uint32_t qf[kQInRegs ? KD : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int k = 0; k < KD; ++k) load_a(qf[k], Qs, LD, wr, 16 * k);
  }
  // This thread's two query rows: positions (masks) and the merged max / sum of the chunks so far.
  const int qa = wr + gr, qb = qa + 8;
  const int pa = qa < nq ? pos0 + qa / group : -1, pb = qb < nq ? pos0 + qb / group : -1;
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units
  float M0 = -INFINITY, M1 = -INFINITY, L0 = 0.0f, L1 = 0.0f;
  float acc[NO][4];
  const int64_t W = static_cast<int64_t>(KVH) * D, kv_elems = static_cast<int64_t>(cache.block_size) * W;
  const int32_t* table = a.block_tables + static_cast<int64_t>(row) * a.max_blocks;
  for (int ch = c_begin; ch < c_end; ++ch) {
    const int k_lo = ch * chunk, k_hi = min(last + 1, k_lo + chunk);
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int nn = 0; nn < NO; ++nn) acc[nn][0] = acc[nn][1] = acc[nn][2] = acc[nn][3] = 0.0f;
    for (int kb = k_lo; kb < k_hi; kb += kKeys) {
      const int nk = min(kKeys, k_hi - kb);
      __syncthreads();  // the previous tile is consumed
      auto kptr = [&](int r) {
        const int pos = kb + r;
        const int64_t blk = table[pos / cache.block_size];
        return reinterpret_cast<const float*>(cache.base + blk * cache.page_bytes + cache.layer_offset_bytes) +
               static_cast<int64_t>(pos % cache.block_size) * W + static_cast<int64_t>(g) * D;
      };
      stage_rows<D>(Ks, nk, kptr);
      stage_rows<D>(Vs, nk, [&](int r) { return kptr(r) + kv_elems; });
      __syncthreads();
      float sc[NK][4] = {};
#pragma unroll
      for (int k = 0; k < KD; ++k) {
        uint32_t qk[4];
        if constexpr (kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qk[e] = qf[k][e];
        } else {
          load_a(qk, Qs, LD, wr, 16 * k);
        }
#pragma unroll
        for (int nn = 0; nn < NK; nn += 2) {
          uint32_t bb[4];
          load_b_nk(bb, Ks, LD, 16 * k, 8 * nn);
          mma_bf16(sc[nn], qk, bb[0], bb[1]);
          mma_bf16(sc[nn + 1], qk, bb[2], bb[3]);
        }
      }
      // Mask (causal; keys past the tile) and scale; row maxima over the quad.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int nn = 0; nn < NK; ++nn)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = kb + 8 * nn + 2 * t + e;
          sc[nn][e] = j <= pa ? sc[nn][e] * sl2 : -INFINITY;
          sc[nn][2 + e] = j <= pb ? sc[nn][2 + e] * sl2 : -INFINITY;
          mx0 = fmaxf(mx0, sc[nn][e]);
          mx1 = fmaxf(mx1, sc[nn][2 + e]);
        }
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
      }
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      // Fully masked rows so far keep max -inf: use 0 as the reference (every p is then 0).
      const float r0 = n0 == -INFINITY ? 0.0f : n0, r1 = n1 == -INFINITY ? 0.0f : n1;
      const float al0 = exp2f(m0 - r0), al1 = exp2f(m1 - r1);
      m0 = n0, m1 = n1;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int nn = 0; nn < NK; ++nn) {
        sc[nn][0] = exp2f(sc[nn][0] - r0), sc[nn][1] = exp2f(sc[nn][1] - r0);
        sc[nn][2] = exp2f(sc[nn][2] - r1), sc[nn][3] = exp2f(sc[nn][3] - r1);
        s0 += sc[nn][0] + sc[nn][1];
        s1 += sc[nn][2] + sc[nn][3];
      }
      l0 = l0 * al0 + s0, l1 = l1 * al1 + s1;
#pragma unroll
      for (int nn = 0; nn < NO; ++nn) acc[nn][0] *= al0, acc[nn][1] *= al0, acc[nn][2] *= al1, acc[nn][3] *= al1;
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        if (16 * kk >= nk) break;
        const uint32_t pf[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                                pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < NO; nn += 2) {
          uint32_t bb[4];
          load_b_kn(bb, Vs, LD, 16 * kk, 8 * nn);
          mma_bf16(acc[nn], pf, bb[0], bb[1]);
          mma_bf16(acc[nn + 1], pf, bb[2], bb[3]);
        }
      }
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, o);
      l1 += __shfl_xor_sync(0xffffffffu, l1, o);
    }
    if (partial) {  // this chunk's (acc, max, sum) for tc_combine_kernel
      float* w = ws + (static_cast<int64_t>(slot) * KVH + g) * kRows * (D + 2);
#pragma unroll
      for (int nn = 0; nn < NO; ++nn) {
        const int c = 8 * nn + 2 * t;
        if (qa < nq) *reinterpret_cast<float2*>(w + qa * (D + 2) + c) = make_float2(acc[nn][0], acc[nn][1]);
        if (qb < nq) *reinterpret_cast<float2*>(w + qb * (D + 2) + c) = make_float2(acc[nn][2], acc[nn][3]);
      }
      if (t == 0 && qa < nq) w[qa * (D + 2) + D] = m0, w[qa * (D + 2) + D + 1] = l0;
      if (t == 0 && qb < nq) w[qb * (D + 2) + D] = m1, w[qb * (D + 2) + D + 1] = l1;
      continue;
    }
    // Merge into the rows' running state (this thread's own elements of out hold the unnormalized accumulators
    // between chunks); the last chunk writes the normalized output.
    float sa0, sb0, sa1, sb1;
    merge_stats(M0, L0, m0, l0, sa0, sb0);
    merge_stats(M1, L1, m1, l1, sa1, sb1);
    const bool fin = ch == nchunks - 1;
    const float i0 = !fin ? 1.0f : L0 > 0.0f ? 1.0f / L0 : 0.0f, i1 = !fin ? 1.0f : L1 > 0.0f ? 1.0f / L1 : 0.0f;
#pragma unroll
    for (int nn = 0; nn < NO; ++nn) {
      const int c = 8 * nn + 2 * t;
      if (qa < nq) {
        float2* o = reinterpret_cast<float2*>(out + orow(qa) + c);
        const float2 run = ch == 0 ? make_float2(0.0f, 0.0f) : *o;
        float x = merge_acc(run.x, sa0, acc[nn][0], sb0), y = merge_acc(run.y, sa0, acc[nn][1], sb0);
        if (fin) x = __fmul_rn(x, i0), y = __fmul_rn(y, i0);
        *o = make_float2(x, y);
      }
      if (qb < nq) {
        float2* o = reinterpret_cast<float2*>(out + orow(qb) + c);
        const float2 run = ch == 0 ? make_float2(0.0f, 0.0f) : *o;
        float x = merge_acc(run.x, sa1, acc[nn][2], sb1), y = merge_acc(run.y, sa1, acc[nn][3], sb1);
        if (fin) x = __fmul_rn(x, i1), y = __fmul_rn(y, i1);
        *o = make_float2(x, y);
      }
    }
  }
}

/// Grid (num_tc_items, num_kv_heads): the block of a split tile's chunk c merges, for its slice of the tile's query
/// rows ([c nq / nchunks, (c + 1) nq / nchunks): every block of the tile shares the work), the chunk partials (slots
/// slot - c .. slot - c + nchunks - 1) in chunk order with tc_kernel's arithmetic and writes the normalized rows. A
/// warp per row, lanes over head dims. Items without a slot (written by tc_kernel) return at once.
template <int D>
__global__ void __launch_bounds__(kThreads) tc_combine_kernel(float* __restrict__ out, int64_t os, int num_kv_heads,
                                                              PagedAttentionArgs a, const float* __restrict__ ws) {
  constexpr int C = D / 32;
  const int item = blockIdx.x, g = blockIdx.y;
  const int tile = a.tc_items[3 * item], c = a.tc_items[3 * item + 1], slot = a.tc_items[3 * item + 2];
  if (c < 0 || slot < 0) return;
  const int group = a.num_heads / num_kv_heads;
  const int row = a.tc_tiles[3 * tile], off = a.tc_tiles[3 * tile + 1], nt = a.tc_tiles[3 * tile + 2];
  const int n = a.query_start_loc[row + 1] - a.query_start_loc[row], sl = a.seq_lens[row];
  if (sl == 0 || nt <= 0) return;
  const int nchunks = (sl - n + off + nt - 1) / tc_chunk_keys(sl) + 1;
  if (nchunks == 1) return;
  const int nq = nt * group, slot0 = slot - c;
  const int64_t t0 = a.query_start_loc[row] + off;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int qi = c * nq / nchunks + warp; qi < (c + 1) * nq / nchunks; qi += kThreads / 32) {
    float M = -INFINITY, L = 0.0f, acc[C];
#pragma unroll
    for (int k = 0; k < C; ++k) acc[k] = 0.0f;
#pragma unroll 4
    for (int s = 0; s < nchunks; ++s) {
      const float* w = ws + ((static_cast<int64_t>(slot0 + s) * num_kv_heads + g) * kRows + qi) * (D + 2);
      float sa, sb;
      merge_stats(M, L, w[D], w[D + 1], sa, sb);
#pragma unroll
      for (int k = 0; k < C; ++k) acc[k] = merge_acc(acc[k], sa, w[lane + 32 * k], sb);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = out + (t0 + qi / group) * os + static_cast<int64_t>(g * group + qi % group) * D;
#pragma unroll
    for (int k = 0; k < C; ++k) o[lane + 32 * k] = __fmul_rn(acc[k], inv);
  }
}

/// One launch of tc_kernel<D> (and tc_combine_kernel<D> with items): Qs, Ks, Vs of [64][D + 8] bf16 in dynamic shared
/// memory (27, 52, 101 KB).
template <int D>
cudaError_t launch_tc(dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                      const PagedAttentionArgs& a, float* ws, cudaStream_t stream) {
  constexpr size_t sm = 3 * static_cast<size_t>(kRows) * (D + 8) * sizeof(bf16);
  static_assert(kKeys == kRows, "Ks and Vs are staged with the 64-row helper");
  if constexpr (sm > 48 * 1024) {  // not a stream operation: allowed while a graph is being captured
    const cudaError_t e = cudaFuncSetAttribute(tc_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm));
    if (e != cudaSuccess) return e;
  }
  tc_kernel<D><<<grid, kThreads, sm, stream>>>(q, qs, out, os, cache, a, ws);
  if (a.num_tc_items > 0) tc_combine_kernel<D><<<grid, kThreads, 0, stream>>>(out, os, static_cast<int>(grid.y), a, ws);
  return launch_status();
}

}  // namespace

cudaError_t paged_attention_tc(const float* q, int64_t q_stride, float* out, int64_t out_stride, const KvCacheView& cache,
                               const PagedAttentionArgs& a, cudaStream_t stream, float* workspace) {
  const int D = cache.head_dim, KVH = cache.num_kv_heads;
  if (a.num_tc_tiles == 0) return cudaSuccess;
  if (!paged_attention_head_dim_ok(D) || KVH <= 0 || a.num_heads % KVH != 0 || a.num_tc_tiles < 0 || a.tc_tiles == nullptr ||
      a.tc_tokens * (a.num_heads / KVH) > kRows || q_stride % 4 != 0 || out_stride % 2 != 0 || a.num_tc_items < 0 ||
      (a.num_tc_items > 0 && (a.tc_items == nullptr || workspace == nullptr)))
    return cudaErrorInvalidValue;
  const dim3 grid(a.num_tc_items > 0 ? a.num_tc_items : a.num_tc_tiles, KVH);
  if (D == 64) return launch_tc<64>(grid, q, q_stride, out, out_stride, cache, a, workspace, stream);
  if (D == 128) return launch_tc<128>(grid, q, q_stride, out, out_stride, cache, a, workspace, stream);
  return launch_tc<256>(grid, q, q_stride, out, out_stride, cache, a, workspace, stream);
}

}  // namespace ssmserve::cuda
