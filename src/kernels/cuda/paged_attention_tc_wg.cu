// Owns the warpgroup form of the tensor-core prefill attention's tile kernel (sm_90a wgmma, wgmma_bf16.cuh; see
// paged_attention_tc.cuh, launch_tc_wg): the tile and chunk walk of tc_kernel (paged_attention_tc.cu) on the staged
// bf16 keys, with each warpgroup's 64 query rows multiplied by whole K / V tiles read once per warpgroup from shared
// memory instead of once per warp: at head_dim 256 the mma.sync kernel's per-warp B fragments (144 ldmatrix.x4 per
// 256 mma.sync per warp and 64-key tile, ~590 KB of shared-memory reads per block and tile) bound it, not the
// tensor cores.
//
// Per block (tile or item, KV head), 2 warpgroups x 64 query rows (the tile's kRows = 128 rows; warp w of warpgroup
// wg owns rows 64 wg + 16 w .. + 15, the mma.sync kernel's rows of warp 4 wg + w), per 64-key tile:
//   S = Q K^T: m64n64k16 x D / 16, Q and K 128-byte-swizzled [64][D] tiles (K-major operands);
//   scale, causal mask, online softmax in registers (the accumulator fragment is the mma.sync C fragment);
//   O += P V: m64n128k16 x 4 per 128 output columns, P as the register A operand, V the same [64][D] tile layout read
//   MN-major.
// K / V tiles j + 1 are in flight (cp.async, both warpgroups issuing) while tile j computes, in double buffers.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/paged_attention_tc.cuh"
#include "kernels/cuda/paged_attention_tc_wg.cuh"
#include "kernels/cuda/wgmma_bf16.cuh"

namespace ssmserve::cuda::tc {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

/// Issues (cp.async, one commit group) rows [0, nk) of a kKeys-row bf16 tile (row r at src + r D) into the swizzled
/// tile dst; rows >= nk zero-filled (nothing read). nk >= 1.
template <int D>
__device__ __forceinline__ void load_tile(unsigned char* dst, int nk, const bf16* src) {
  constexpr int C = D / 8, PER = kKeys * C / kThreads;
  static_assert(PER * kThreads == kKeys * C, "whole tiles");
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int idx = i * kThreads + threadIdx.x, r = idx / C, c8 = idx % C;
    cp_async16(dst + tile_off(r, c8), src + static_cast<int64_t>(r < nk ? r : 0) * D + c8 * 8, r < nk ? 16 : 0);
  }
  cp_async_commit_group();
}

/// Grid and arguments as tc_kernel<D, true> (paged_attention_tc.cu), kThreads threads, dynamic shared memory 6 tiles
/// of [64][D] bf16: Q (one per warpgroup), K and V double-buffered (192 KB at head_dim 256).
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    tc_wg_kernel(const float* __restrict__ q, int64_t qs, float* __restrict__ out, int64_t os, int KVH,
                 PagedAttentionArgs a, float* __restrict__ ws, const bf16* __restrict__ kb) {
  constexpr int TB = kKeys * D * 2, KD = D / 16, NK = kKeys / 8, NH = D / 128;
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const Qs = smem;          // [2 warpgroups] tiles
  unsigned char* const Ks = smem + 2 * TB;  // [2] tiles
  unsigned char* const Vs = Ks + 2 * TB;    // [2] tiles
  const TcTile bt(a, KVH);
  const int slot = bt.slot, g = bt.g, group = bt.group, row = bt.row, nt = bt.nt, sl = bt.sl, pos0 = bt.pos0, nq = bt.nq;
  auto qrow = [&](int qi) { return bt.row_offset(qi, qs, D); };
  auto orow = [&](int qi) { return bt.row_offset(qi, os, D); };
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3, wr = warp * 16;
  if (sl == 0 || nt <= 0) {
    for (int idx = threadIdx.x; idx < nq * D; idx += kThreads) out[orow(idx / D) + idx % D] = 0.0f;
    return;
  }
  const TcKeys keys(bt);
  const int chunk = keys.chunk, nchunks = keys.nchunks, k_lo = keys.k_lo, k_end = keys.k_end;
  const bool partial = keys.partial;
  const bf16* const kplane = kb + (static_cast<int64_t>(g) * a.tc_stage_keys + a.tc_row_key_base[row]) * D;
  const bf16* const vplane = kplane + static_cast<int64_t>(KVH) * a.tc_stage_keys * D;
  // Prologue: the first tile's K and V in flight while Q is staged (bf16, rows >= nq zero) into its warpgroup's tile.
  load_tile<D>(Ks, min(kKeys, k_end - k_lo), kplane + static_cast<int64_t>(k_lo) * D);
  load_tile<D>(Vs, min(kKeys, k_end - k_lo), vplane + static_cast<int64_t>(k_lo) * D);
  {
    constexpr int V4 = D / 4, PER = kRows * V4 / kThreads, U = 8;
    static_assert(PER % U == 0, "whole groups of loads");
#pragma unroll 1
    for (int b = 0; b < PER; b += U) {
      float4 x[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int idx = (b + u) * kThreads + threadIdx.x, r = idx / V4, c = (idx % V4) * 4;
        x[u] = r < nq ? __ldg(reinterpret_cast<const float4*>(q + qrow(r) + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int idx = (b + u) * kThreads + threadIdx.x, r = idx / V4, c = (idx % V4) * 4;
        uint2 o;
        o.x = pack_bf16(x[u].x, x[u].y);
        o.y = pack_bf16(x[u].z, x[u].w);
        *reinterpret_cast<uint2*>(Qs + (r >> 6) * TB + tile_off(r & 63, c >> 3) + (c & 7) * 2) = o;
      }
    }
  }
  const unsigned char* const Qw = Qs + (warp >> 2) * TB;  // this warpgroup's Q tile
  // This thread's two query rows: positions (masks), where their chunk results go and the merged max / sum so far.
  const int qa = wr + gr, qb = qa + 8;
  const int pa = qa < nq ? pos0 + qa / group : -1, pb = qb < nq ? pos0 + qb / group : -1;
  float* const wa = partial ? ws + ((static_cast<int64_t>(slot) * KVH + g) * kRows + qa) * (D + 2) : out + orow(min(qa, nq - 1));
  float* const wb = partial ? ws + ((static_cast<int64_t>(slot) * KVH + g) * kRows + qb) * (D + 2) : out + orow(min(qb, nq - 1));
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units
  float M0 = -INFINITY, M1 = -INFINITY, L0 = 0.0f, L1 = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  // Output accumulators: NH m64n128 fragments; column block nn (8 columns) of the mma.sync kernel's acc[nn] is
  // o[nn / 16][4 (nn % 16) ..].
  float o[NH][64];
#pragma unroll
  for (int h = 0; h < NH; ++h)
#pragma unroll
    for (int e = 0; e < 64; ++e) o[h][e] = 0.0f;
  for (int kb0 = k_lo; kb0 < k_end; kb0 += kKeys) {
    const int nb = kb0 + kKeys, cur = ((kb0 - k_lo) / kKeys) & 1;
    const bool more = nb < k_end;
    const unsigned char* const Kt = Ks + cur * TB;
    const unsigned char* const Vt = Vs + cur * TB;
    if (more) {  // tile j + 1 into the buffers tile j - 1 used (its last readers are a barrier behind)
      load_tile<D>(Ks + (cur ^ 1) * TB, min(kKeys, k_end - nb), kplane + static_cast<int64_t>(nb) * D);
      load_tile<D>(Vs + (cur ^ 1) * TB, min(kKeys, k_end - nb), vplane + static_cast<int64_t>(nb) * D);
      cp_async_wait_group<3>();
    } else {
      cp_async_wait_group<1>();
    }
    fence_proxy_async();
    __syncthreads();  // this tile's K (and, first time, Q) visible to every warpgroup's wgmma
    float sc[4 * NK];
    wg_fence();
#pragma unroll
    for (int k = 0; k < KD; ++k) wgmma_ss_n64_k(sc, kmaj(Qw, k), kmaj(Kt, k), k > 0);
    wg_commit();
    wg_wait<0>();
    wg_pin(sc);
    // Mask (causal; keys past the block's range), scale, the online softmax.
    float al0, al1;
    softmax_tile([&](int i) -> float& { return sc[i]; }, kb0, t, pa, pb, sl2, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int h = 0; h < NH; ++h)
#pragma unroll
      for (int j = 0; j < 16; ++j) o[h][4 * j] *= al0, o[h][4 * j + 1] *= al0, o[h][4 * j + 2] *= al1, o[h][4 * j + 3] *= al1;
    // P as bf16 A fragments: two adjacent n8 blocks make one 16 x 16 A tile.
    uint32_t pf[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pf[kk][0] = pack_bf16(sc[8 * kk], sc[8 * kk + 1]), pf[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
      pf[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]), pf[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
    if (more) cp_async_wait_group<2>();
    else cp_async_wait_group<0>();
    fence_proxy_async();
    __syncthreads();  // this tile's V visible
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int h = 0; h < NH; ++h) wgmma_rs_n128_t(o[h], pf[kk], vmaj(Vt + h * 2 * 8192, kk), 1);
    wg_commit();
    wg_wait<0>();
#pragma unroll
    for (int h = 0; h < NH; ++h) wg_pin(o[h]);
    if (!more || nb % chunk == 0) {  // the chunk's last tile: its partial out, or merged into the rows' state
      const int ch = kb0 / chunk;
      chunk_out<D>([&](int nn, int e) { return o[nn >> 4][4 * (nn & 15) + e]; }, partial, ch, ch == nchunks - 1, wa, wb,
                   qa < nq, qb < nq, t, M0, M1, L0, L1, m0, m1, l0, l1);
      m0 = m1 = -INFINITY, l0 = l1 = 0.0f;
#pragma unroll
      for (int h = 0; h < NH; ++h)
#pragma unroll
        for (int e = 0; e < 64; ++e) o[h][e] = 0.0f;
    }
    if (more) __syncthreads();  // every warpgroup is past its reads of this tile's buffers (the next loads reuse them)
  }
}

template <int D>
cudaError_t launch(dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                   const PagedAttentionArgs& a, float* ws, const bf16* kb, cudaStream_t stream) {
  constexpr size_t sm = 6 * static_cast<size_t>(kKeys) * D * sizeof(bf16);
  // Not a stream operation: allowed while a graph is being captured.
  const cudaError_t e = cudaFuncSetAttribute(tc_wg_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm));
  if (e != cudaSuccess) return e;
  tc_wg_kernel<D><<<grid, kThreads, sm, stream>>>(q, qs, out, os, cache.num_kv_heads, a, ws, kb);
  return launch_status();
}

}  // namespace

cudaError_t launch_tc_wg(int D, dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                         const PagedAttentionArgs& a, float* ws, const bf16* kb, cudaStream_t stream) {
  if (D == 128) return launch<128>(grid, q, qs, out, os, cache, a, ws, kb, stream);
  if (D == 256) return launch<256>(grid, q, qs, out, os, cache, a, ws, kb, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ssmserve::cuda::tc
