// Owns the tensor-core prefill pass of the GPU paged attention (see paged_attention.h, PagedAttentionArgs::tc_tiles):
// FlashAttention-2 style over the paged fp32 KV cache, bf16 operands on mma.sync m16n8k16 with fp32 accumulation and
// an fp32 online softmax per key chunk, chunks merged in order (in one block, or over blocks and a combine kernel).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/paged_attention_tc.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using namespace tc;
using bf16 = __nv_bfloat16;
static_assert(kThreads / 32 * 16 == kRows, "a warp per 16 query rows");

/// Rows [0, n) of a kRows-row fp32 tile (src(r): row r's pointer) into dst [kRows][D + 8] as bf16, rows >= n zero.
/// Synchronous (the Q tile, once per block, before the accumulators are live): each thread issues 8 loads before
/// converting any.
template <int D, class F>
__device__ __forceinline__ void stage_q(bf16* dst, int n, F&& src) {
  constexpr int V = D / 4, LD = D + 8, PER = kRows * V / kThreads, U = 8;
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

/// Issues (cp.async, one commit group) the copy of rows [0, nk) of a kKeys-row fp32 tile into the fp32 staging tile
/// st [kKeys][D]: row r from base + ro[r] + extra bytes (16-byte aligned; ro in shared memory, every entry a valid
/// row); rows >= nk are zero-filled (so masked keys multiply finite values). nk >= 1.
template <int D>
__device__ __forceinline__ void load_tile_async(float* st, int nk, const std::byte* base, const int64_t* ro, int64_t extra) {
  constexpr int V = D / 4, PER = kKeys * V / kThreads, STEP = kThreads / V;
  static_assert(PER * kThreads == kKeys * V, "whole tiles");
  const int r0 = threadIdx.x / V, c = (threadIdx.x % V) * 4;
  const std::byte* b = base + extra + c * sizeof(float);
  float* d = st + r0 * D + c;
#pragma unroll 4
  for (int i = 0; i < PER; ++i) {
    const int r = r0 + i * STEP;
    cp_async16(d + i * STEP * D, b + ro[r], r < nk ? 16 : 0);
  }
  cp_async_commit_group();
}

/// The staged fp32 tile st [kKeys][D] into dst [kKeys][D + 8] as bf16 (conflict-free: each 8-lane phase of a 16-byte
/// load reads 128 contiguous bytes, each 16-lane phase of an 8-byte store writes 128 contiguous bytes of one row).
template <int D>
__device__ __forceinline__ void convert_tile(bf16* dst, const float* st) {
  constexpr int V = D / 4, LD = D + 8, PER = kKeys * V / kThreads;
#pragma unroll 2  // few loads in flight: the accumulators are live
  for (int i = 0; i < PER; ++i) {
    const int idx = i * kThreads + threadIdx.x, r = idx / V, c = (idx % V) * 4;
    const float4 x = *reinterpret_cast<const float4*>(st + r * D + c);
    uint2 o;
    o.x = pack_bf16(x.x, x.y);
    o.y = pack_bf16(x.z, x.w);
    *reinterpret_cast<uint2*>(dst + r * LD + c) = o;
  }
}

/// Issues (cp.async, one commit group) the copy of rows [0, nk) of a kKeys-row bf16 tile (row r at src + r D, 16-byte
/// aligned) into dst [kKeys][D + 8]; rows >= nk are zero-filled (nothing read). nk >= 1.
template <int D>
__device__ __forceinline__ void load_tile_bf16_async(bf16* dst, int nk, const bf16* src) {
  constexpr int C = D / 8, LD = D + 8, PER = kKeys * C / kThreads;
  static_assert(PER * kThreads == kKeys * C, "whole tiles");
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int idx = i * kThreads + threadIdx.x, r = idx / C, c = (idx % C) * 8;
    cp_async16(dst + r * LD + c, src + static_cast<int64_t>(r < nk ? r : 0) * D + c, r < nk ? 16 : 0);
  }
  cp_async_commit_group();
}

constexpr int kStageKeys = 32;  // keys per block of stage_kernel

/// Grid (ceil(a.tc_stage_max_keys / kStageKeys), num_kv_heads, num_tc_stage_rows), kThreads threads: keys
/// [kStageKeys x, + kStageKeys) of staged row a.tc_stage_rows[z], KV head y, from the paged fp32 cache to bf16 (the
/// rounding convert_tile does): K at kb[(y * tc_stage_keys + base + pos) * D], V at kb[((KVH + y) * tc_stage_keys
/// + base + pos) * D] (base = a.tc_row_key_base[row]).
template <int D>
__global__ void __launch_bounds__(kThreads) stage_kernel(KvCacheView cache, PagedAttentionArgs a, bf16* __restrict__ kb) {
  constexpr int V = D / 4;
  const int row = a.tc_stage_rows[blockIdx.z], g = blockIdx.y, sl = a.seq_lens[row], p0 = blockIdx.x * kStageKeys;
  if (p0 >= sl) return;
  const int KVH = cache.num_kv_heads;
  const int64_t row_bytes = static_cast<int64_t>(KVH) * D * sizeof(float);
  const int64_t v_bytes = static_cast<int64_t>(cache.block_size) * row_bytes;
  const std::byte* base = cache.base + cache.layer_offset_bytes + static_cast<int64_t>(g) * D * sizeof(float);
  const int32_t* table = a.block_tables + static_cast<int64_t>(row) * a.max_blocks;
  const int64_t first = a.tc_row_key_base[row];
  bf16* ko = kb + (static_cast<int64_t>(g) * a.tc_stage_keys + first) * D;
  bf16* vo = kb + (static_cast<int64_t>(KVH + g) * a.tc_stage_keys + first) * D;
  for (int idx = threadIdx.x; idx < kStageKeys * V; idx += kThreads) {
    const int pos = p0 + idx / V, c = (idx % V) * 4;
    if (pos >= sl) break;
    const std::byte* src = base + static_cast<int64_t>(table[pos / cache.block_size]) * cache.page_bytes +
                           (pos % cache.block_size) * row_bytes + c * sizeof(float);
    const float4 k = __ldg(reinterpret_cast<const float4*>(src)), v = __ldg(reinterpret_cast<const float4*>(src + v_bytes));
    uint2 o;
    o.x = pack_bf16(k.x, k.y), o.y = pack_bf16(k.z, k.w);
    *reinterpret_cast<uint2*>(ko + static_cast<int64_t>(pos) * D + c) = o;
    o.x = pack_bf16(v.x, v.y), o.y = pack_bf16(v.z, v.w);
    *reinterpret_cast<uint2*>(vo + static_cast<int64_t>(pos) * D + c) = o;
  }
}

/// One block per SM (shared memory: 53, 101, 197 KB per block at head_dim 64, 128, 256; registers without spills:
/// 160, 204, 246 per thread under nvcc 13.0). Q's A fragments stay in registers up to head_dim 128; at 256 they are
/// re-read from Qs for every key tile (as FlashAttention-2 does at that size) and the Q K^T loop over head dims is
/// unrolled kQkUnroll times only (fully unrolled, the hoisted fragment loads spill).
template <int D>
constexpr bool kTcQInRegs = D <= 128;
constexpr int kQkUnroll = 4;

/// Grid (num_tc_tiles or num_tc_items, num_kv_heads), kThreads threads: 8 warps of 16 query rows. Tile (row, first
/// token off, tokens nt): query row qi = token qi / group, head g * group + qi % group; keys 0 .. last position of
/// the tile, causal per query token, in chunks of tc_chunk_keys(seq_len) keys. A block of a whole tile (no items, or
/// item (tile, -1, -1)) walks all its chunks, keeping the merged unnormalized accumulators in its own rows of `out`
/// between chunks; an item (tile, chunk, slot) of a tile of several chunks writes that chunk's partial to
/// ws[slot, g, qi] = (acc[D], max, sum) for tc_combine_kernel.
/// Pipeline: one fp32 staging tile St fed by cp.async; a 64-key tile's V is in flight while the warps compute Q K^T
/// and the softmax, the next tile's K while they compute P V; between, St is converted to bf16 into Ks / Vs (read
/// with ldmatrix). The key tiles run back to back across chunk boundaries (a chunk's arithmetic does not depend on
/// where its block started, so a tile's bits are the same in one block or split over blocks).
/// kStaged: the keys come from the bf16 planes stage_kernel wrote (kb, see paged_attention_tc): K / V tiles j + 1
/// fetched into the other half of double buffers while tile j computes; no fp32 staging tile, no conversions.
template <int D, bool kStaged>
__global__ void __launch_bounds__(kThreads, 1)
    tc_kernel(const float* __restrict__ q, int64_t qs, float* __restrict__ out, int64_t os, KvCacheView cache,
              PagedAttentionArgs a, float* __restrict__ ws, const bf16* __restrict__ kb) {
  constexpr int LD = D + 8, KD = D / 16, NO = D / 8, NK = kKeys / 8;
  constexpr bool kQInRegs = kTcQInRegs<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kRows * LD;                           // kStaged: [2][kKeys][LD]
  bf16* Vs = Ks + (kStaged ? 2 : 1) * kKeys * LD;       // kStaged: [2][kKeys][LD]
  float* St = reinterpret_cast<float*>(Vs + kKeys * LD);  // 16-byte aligned: (kRows + 2 kKeys) LD bf16 before it
  int64_t* Ro = reinterpret_cast<int64_t*>(St + kKeys * D);  // [2][kKeys]: key tile j's row byte offsets at j % 2
  const TcTile bt(a, cache.num_kv_heads);
  const int slot = bt.slot, g = bt.g, KVH = cache.num_kv_heads, group = bt.group, row = bt.row, nt = bt.nt;
  const int sl = bt.sl, pos0 = bt.pos0, nq = bt.nq;
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
  const int64_t W = static_cast<int64_t>(KVH) * D, kv_elems = static_cast<int64_t>(cache.block_size) * W;
  const int32_t* table = a.block_tables + static_cast<int64_t>(row) * a.max_blocks;
  // Byte offset (from kvbase) of key pos's K row of KV head g (its V row is kv_bytes further); positions past the
  // block's keys are clamped to its last (the loads zero-fill those rows).
  const int64_t kv_bytes = kv_elems * static_cast<int64_t>(sizeof(float)), row_bytes = W * static_cast<int64_t>(sizeof(float));
  const std::byte* kvbase = cache.base + cache.layer_offset_bytes + static_cast<int64_t>(g) * D * sizeof(float);
  auto row_offset = [&](int pos) {
    pos = min(pos, k_end - 1);
    return static_cast<int64_t>(table[pos / cache.block_size]) * cache.page_bytes + (pos % cache.block_size) * row_bytes;
  };
  // The staged planes of this row and KV head (kStaged).
  const bf16* kplane = nullptr;
  const bf16* vplane = nullptr;
  if constexpr (kStaged) {
    kplane = kb + (static_cast<int64_t>(g) * a.tc_stage_keys + a.tc_row_key_base[row]) * D;
    vplane = kplane + static_cast<int64_t>(KVH) * a.tc_stage_keys * D;
    // Prologue: the first tile's K and V in flight while Q is staged.
    load_tile_bf16_async<D>(Ks, min(kKeys, k_end - k_lo), kplane + static_cast<int64_t>(k_lo) * D);
    load_tile_bf16_async<D>(Vs, min(kKeys, k_end - k_lo), vplane + static_cast<int64_t>(k_lo) * D);
    stage_q<D>(Qs, nq, [&](int r) { return q + qrow(r); });
    __syncthreads();  // Qs is written
  } else {
    // Prologue: K of the first key tile in flight while Q is staged, then that K to bf16 and its V in flight.
    if (threadIdx.x < kKeys) Ro[threadIdx.x] = row_offset(k_lo + threadIdx.x);
    __syncthreads();
    load_tile_async<D>(St, min(kKeys, k_end - k_lo), kvbase, Ro, 0);
    stage_q<D>(Qs, nq, [&](int r) { return q + qrow(r); });
    cp_async_wait_group<0>();
    __syncthreads();  // St holds the K tile (every thread's copies), Qs is written
    convert_tile<D>(Ks, St);
    __syncthreads();  // Ks ready, St free
    load_tile_async<D>(St, min(kKeys, k_end - k_lo), kvbase, Ro, kv_bytes);
  }
  uint32_t qf[kQInRegs ? KD : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int k = 0; k < KD; ++k) load_a(qf[k], Qs, LD, wr, 16 * k);
  }
  // This thread's two query rows: positions (masks), where their chunk results go (this chunk's partial in the
  // workspace, or the rows of out) and the merged max / sum of the chunks so far.
  const int qa = wr + gr, qb = qa + 8;
  const int pa = qa < nq ? pos0 + qa / group : -1, pb = qb < nq ? pos0 + qb / group : -1;
  const bool active = wr < nq;  // warp-uniform
  float* const wa = partial ? ws + ((static_cast<int64_t>(slot) * KVH + g) * kRows + qa) * (D + 2) : out + orow(min(qa, nq - 1));
  float* const wb = partial ? ws + ((static_cast<int64_t>(slot) * KVH + g) * kRows + qb) * (D + 2) : out + orow(min(qb, nq - 1));
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units
  float M0 = -INFINITY, M1 = -INFINITY, L0 = 0.0f, L1 = 0.0f;
  // The current chunk's max / sum / accumulators.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  float acc[NO][4];
#pragma unroll
  for (int nn = 0; nn < NO; ++nn) acc[nn][0] = acc[nn][1] = acc[nn][2] = acc[nn][3] = 0.0f;
  for (int kb = k_lo; kb < k_end; kb += kKeys) {
    const int nk = min(kKeys, k_end - kb), nb = kb + kKeys, par = ((nb - k_lo) / kKeys) & 1;
    const bool more = nb < k_end;
    // This tile's K and V buffers (kStaged: half cur of the double buffers; tile j + 1 goes to the other half, whose
    // last readers (tile j - 1's P V) are a barrier behind).
    const int cur = kStaged ? ((kb - k_lo) / kKeys) & 1 : 0;
    const bf16* Kt = Ks + cur * kKeys * LD;
    const bf16* Vt = Vs + cur * kKeys * LD;
    int64_t next_off = 0;
    if constexpr (kStaged) {
      if (more) {
        load_tile_bf16_async<D>(Ks + (cur ^ 1) * kKeys * LD, min(kKeys, k_end - nb), kplane + static_cast<int64_t>(nb) * D);
        load_tile_bf16_async<D>(Vs + (cur ^ 1) * kKeys * LD, min(kKeys, k_end - nb), vplane + static_cast<int64_t>(nb) * D);
        cp_async_wait_group<3>();
      } else {
        cp_async_wait_group<1>();
      }
      __syncthreads();  // this tile's K landed for every thread
    } else {
      // The next tile's row offsets (table read now, stored after Q K^T): into the Ro half that tile j - 1 used, whose
      // last reader (the copy of its V) is a barrier behind.
      next_off = more && threadIdx.x < kKeys ? row_offset(nb + threadIdx.x) : 0;
    }
    // S = Q K^T from Ks (this tile's V is in flight). A warp without query rows (a short tile) skips its products:
    // its scores are all masked.
    float sc[NK][4] = {};
#pragma unroll(kQInRegs ? KD : kQkUnroll)
    for (int k = 0; k < KD; ++k) {
      if (!active) break;
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
        load_b_nk(bb, Kt, LD, 16 * k, 8 * nn);
        mma_bf16(sc[nn], qk, bb[0], bb[1]);
        mma_bf16(sc[nn + 1], qk, bb[2], bb[3]);
      }
    }
    // Mask (causal; keys past the block's range), scale, the online softmax.
    float al0, al1;
    softmax_tile([&](int i) -> float& { return sc[i >> 2][i & 3]; }, kb, t, pa, pb, sl2, m0, m1, l0, l1, al0, al1);
#pragma unroll
    for (int nn = 0; nn < NO; ++nn) acc[nn][0] *= al0, acc[nn][1] *= al0, acc[nn][2] *= al1, acc[nn][3] *= al1;
    // P as bf16 A fragments: two adjacent 16 x 8 C tiles make one 16 x 16 A tile.
    uint32_t pf[kKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pf[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pf[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
      pf[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pf[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
    }
    if constexpr (kStaged) {
      if (more) cp_async_wait_group<2>();
      else cp_async_wait_group<0>();
      __syncthreads();  // this tile's V landed for every thread
    } else {
      if (more && threadIdx.x < kKeys) Ro[par * kKeys + threadIdx.x] = next_off;
      cp_async_wait_group<0>();
      __syncthreads();  // St holds this tile's V; every warp is past its P V reads of the previous tile's Vs
      convert_tile<D>(Vs, St);
      __syncthreads();  // Vs ready, St free
      if (more) load_tile_async<D>(St, min(kKeys, k_end - nb), kvbase, Ro + par * kKeys, 0);
    }
    // O += P V from Vs (the next tile's K is in flight).
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      if (16 * kk >= nk || !active) break;
#pragma unroll
      for (int nn = 0; nn < NO; nn += 2) {
        uint32_t bb[4];
        load_b_kn(bb, Vt, LD, 16 * kk, 8 * nn);
        mma_bf16(acc[nn], pf[kk], bb[0], bb[1]);
        mma_bf16(acc[nn + 1], pf[kk], bb[2], bb[3]);
      }
    }
    if (!more || nb % chunk == 0) {  // the chunk's last tile: its partial out, or merged into the rows' state
      const int ch = kb / chunk;
      chunk_out<D>([&](int nn, int e) { return acc[nn][e]; }, partial, ch, ch == nchunks - 1, wa, wb, qa < nq, qb < nq, t,
                   M0, M1, L0, L1, m0, m1, l0, l1);
      m0 = m1 = -INFINITY, l0 = l1 = 0.0f;
#pragma unroll
      for (int nn = 0; nn < NO; ++nn) acc[nn][0] = acc[nn][1] = acc[nn][2] = acc[nn][3] = 0.0f;
    }
    if constexpr (kStaged) {
      if (more) __syncthreads();  // every warp is past its reads of this tile's buffers (the next tile's loads reuse them)
    } else if (more) {
      cp_async_wait_group<0>();
      __syncthreads();  // St holds the next tile's K; every warp is past its Q K^T reads of Ks
      convert_tile<D>(Ks, St);
      __syncthreads();  // Ks ready, St free
      load_tile_async<D>(St, min(kKeys, k_end - nb), kvbase, Ro + par * kKeys, kv_bytes);
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

/// One launch of tc_kernel<D> (and tc_combine_kernel<D> with items): Qs [kRows][D + 8], Ks and Vs [kKeys][D + 8]
/// bf16, the fp32 staging tile [kKeys][D] and two tiles' row offsets in dynamic shared memory (53, 101, 197 KB at
/// head_dim 64, 128, 256).
/// kStaged: Qs and the double-buffered Ks / Vs (201 KB at head_dim 256), after stage_kernel into kb.
template <int D, bool kStaged>
cudaError_t launch_tc(dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                      const PagedAttentionArgs& a, float* ws, bf16* kb, cudaStream_t stream) {
  constexpr size_t sm = kStaged ? static_cast<size_t>(kRows + 4 * kKeys) * (D + 8) * sizeof(bf16)
                                : static_cast<size_t>(kRows + 2 * kKeys) * (D + 8) * sizeof(bf16) +
                                      static_cast<size_t>(kKeys) * D * sizeof(float) + 2 * kKeys * sizeof(int64_t);
  if constexpr (sm > 48 * 1024) {  // not a stream operation: allowed while a graph is being captured
    const cudaError_t e =
        cudaFuncSetAttribute(tc_kernel<D, kStaged>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm));
    if (e != cudaSuccess) return e;
  }
  if constexpr (kStaged) {
    const dim3 sg(static_cast<unsigned>((a.tc_stage_max_keys + kStageKeys - 1) / kStageKeys), grid.y,
                  static_cast<unsigned>(a.num_tc_stage_rows));
    stage_kernel<D><<<sg, kThreads, 0, stream>>>(cache, a, kb);
  }
  if (kStaged && a.tc_wgmma && tc_wgmma_head_dim_ok(D)) {
    const int ws_form = kernel_tuning().attn_tc_ws;  // 1, 2: the warp-specialized form (2 with ping-pong)
    cudaError_t e = ws_form > 0 ? launch_tc_ws(D, ws_form == 2, grid, q, qs, out, os, cache, a, ws, kb, stream)
                                : cudaErrorNotSupported;
    if (e == cudaErrorNotSupported) e = launch_tc_wg(D, grid, q, qs, out, os, cache, a, ws, kb, stream);
    if (e != cudaSuccess) return e;
  } else {
    tc_kernel<D, kStaged><<<grid, kThreads, sm, stream>>>(q, qs, out, os, cache, a, ws, kb);
  }
  if (a.num_tc_items > 0) tc_combine_kernel<D><<<grid, kThreads, 0, stream>>>(out, os, static_cast<int>(grid.y), a, ws);
  return launch_status();
}

template <int D>
cudaError_t launch_tc(dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                      const PagedAttentionArgs& a, float* ws, cudaStream_t stream) {
  if (a.tc_row_key_base != nullptr) {
    bf16* kb = reinterpret_cast<bf16*>(ws + static_cast<size_t>(a.num_tc_slots) * grid.y * kRows * (D + 2));
    return launch_tc<D, true>(grid, q, qs, out, os, cache, a, ws, kb, stream);
  }
  return launch_tc<D, false>(grid, q, qs, out, os, cache, a, ws, nullptr, stream);
}

}  // namespace

cudaError_t paged_attention_tc(const float* q, int64_t q_stride, float* out, int64_t out_stride, const KvCacheView& cache,
                               const PagedAttentionArgs& a, cudaStream_t stream, float* workspace) {
  const int D = cache.head_dim, KVH = cache.num_kv_heads;
  if (a.num_tc_tiles == 0) return cudaSuccess;
  if (!paged_attention_head_dim_ok(D) || KVH <= 0 || a.num_heads % KVH != 0 || a.num_tc_tiles < 0 || a.tc_tiles == nullptr ||
      a.tc_tokens * (a.num_heads / KVH) > kRows || q_stride % 4 != 0 || out_stride % 2 != 0 || a.num_tc_items < 0 ||
      (a.num_tc_items > 0 && (a.tc_items == nullptr || workspace == nullptr)) ||
      (a.tc_row_key_base != nullptr && (workspace == nullptr || a.tc_stage_rows == nullptr || a.num_tc_stage_rows < 1 ||
                                        a.num_tc_stage_rows > 65535 || a.tc_stage_keys < 1 || a.tc_stage_max_keys < 1 ||
                                        a.num_tc_slots < 0)))
    return cudaErrorInvalidValue;
  const dim3 grid(a.num_tc_items > 0 ? a.num_tc_items : a.num_tc_tiles, KVH);
  if (D == 64) return launch_tc<64>(grid, q, q_stride, out, out_stride, cache, a, workspace, stream);
  if (D == 128) return launch_tc<128>(grid, q, q_stride, out, out_stride, cache, a, workspace, stream);
  return launch_tc<256>(grid, q, q_stride, out, out_stride, cache, a, workspace, stream);
}

}  // namespace ssmserve::cuda
