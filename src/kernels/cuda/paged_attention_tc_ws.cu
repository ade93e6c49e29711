// Owns the warp-specialized form of the tensor-core prefill attention's warpgroup tile kernel (sm_90a;
// FlashAttention-3's structure, Shah et al. 2024, Algorithm 1 and 2; see launch_tc_ws in paged_attention_tc.cuh): the
// tile and chunk walk of tc_wg_kernel (paged_attention_tc_wg.cu) with the same wgmma products and the same fp32
// softmax / chunk arithmetic (TcTile, TcKeys, softmax_tile, chunk_out), but
//   - a producer warpgroup (registers lowered to 24 by setmaxnreg) whose one thread loads the K and V tiles by TMA from
//     the staged bf16 planes (a 2D tensor map over kb, 128-byte swizzle: the tile layout of paged_attention_tc_wg.cuh)
//     into 2-stage rings for K and for V, each stage with a full and an empty mbarrier, so K(j + 1) lands while V(j)
//     is still being read;
//   - two consumer warpgroups (registers raised to 240) of 64 query rows each that never synchronize with each other
//     in the key loop: each waits on the full barriers, and each of their 8 warps arrives on a stage's empty barrier
//     once its last wgmma reading the stage has completed (wgmma.wait_group);
//   - per key tile j, S(j + 1) = Q K(j + 1)^T issued before O += P(j) V(j), then the softmax of S(j + 1) while
//     P(j) V(j) runs on the tensor cores (wait_group 1), then O rescaled once P(j) V(j) is done (wait_group 0);
//   - optionally (kPingPong, KernelTuning::attn_tc_ws 2) the two consumer warpgroups take turns to issue their
//     products (named barriers 1 and 2), so one's softmax overlaps the other's products.
// The same operations in the same order per output element as tc_wg_kernel: the rescale of O by tile j's factor still
// precedes O += P(j) V(j). Rows of a key tile past the block's keys read whatever staged rows follow (another row's or
// chunk's keys, the V planes after the K planes: every staged row is written by stage_kernel, so finite) or, past the
// end of the planes, the copy engine's zeros; their scores are masked by softmax_tile (key > the query's position) so
// their P is exactly 0 and they add nothing (0 x finite) to O. (So a non-finite value in one row's cache, already
// a broken state, could reach a neighbouring row's output here, where the lockstep kernel's zero fill would not.)
// Open (SASS of nvcc 13.0, nvdisasm): ptxas places the WARPGROUP.DEPBAR of wait_group 0 (P(j) V(j) done) inside the
// softmax's max reduction, before its exponentials, although the PTX has it after them; so within a warpgroup only the
// masking and the max overlap P V, the exponentials do not (the other consumer warpgroup's work still can). Neither a
// data dependency of the rescale or of the V release on the softmax's sums nor keeping P's registers visibly live
// moved it.
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged_attention_tc.cuh"
#include "kernels/cuda/paged_attention_tc_wg.cuh"
#include "kernels/cuda/tma_ring.cuh"
#include "kernels/cuda/tma_tensor.cuh"
#include "kernels/cuda/wgmma_bf16.cuh"

namespace ssmserve::cuda::tc {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

constexpr int kWsThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerWarps = 8;
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 24 x 128 + 240 x 256 = 64512 <= 65536 (168 x 384 at launch)
static_assert(kRows == 128 && kKeys == 64, "two consumer warpgroups of 64 query rows, 64-key tiles");

/// Named barrier `id` (1..15; 0 is __syncthreads) over n threads: wait for all / arrive without waiting.
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
/// Keeps the A-fragment registers of an in-flight register-operand wgmma alive (and unmoved) up to this point.
__device__ __forceinline__ void pin_a(uint32_t (&p)[kKeys / 16][4]) {
#pragma unroll
  for (int i = 0; i < kKeys / 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p[i][e])::"memory");
}

/// Stages query rows [r0, r0 + kRowsN) of a tile as bf16 into the swizzled [64][D] tiles at Qs (row r in tile r / 64,
/// 64 D 2 bytes apart): row r from q + qrow(r) (fp32, 16-byte aligned), rows >= nq zero. NT threads (tid 0 .. NT - 1)
/// share the work, each issuing 8 loads before converting any. Generic-proxy stores: the caller fences
/// (fence_proxy_async) and synchronizes before wgmma reads them.
template <int D, int NT, int kRowsN, class Row>
__device__ __forceinline__ void stage_q_tiles(unsigned char* Qs, int r0, int nq, int tid, const float* q, Row&& qrow) {
  constexpr int TB = 64 * D * 2, V4 = D / 4, PER = kRowsN * V4 / NT, U = 8;
  static_assert(PER % U == 0 && PER * NT == kRowsN * V4, "whole groups of loads");
#pragma unroll 1
  for (int b = 0; b < PER; b += U) {
    float4 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = (b + u) * NT + tid, r = r0 + idx / V4, c = (idx % V4) * 4;
      x[u] = r < nq ? __ldg(reinterpret_cast<const float4*>(q + qrow(r) + c)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = (b + u) * NT + tid, r = r0 + idx / V4, c = (idx % V4) * 4;
      uint2 o;
      o.x = pack_bf16(x[u].x, x[u].y);
      o.y = pack_bf16(x[u].z, x[u].w);
      *reinterpret_cast<uint2*>(Qs + (r >> 6) * TB + tile_off(r & 63, c >> 3) + (c & 7) * 2) = o;
    }
  }
}

/// Grid and arguments as tc_wg_kernel (paged_attention_tc_wg.cu) with K / V through the tensor map tkv (rows of the
/// staged planes kb: K of KV head g, key j of row r at g tc_stage_keys + tc_row_key_base[r] + j, its V at (KVH + g)
/// tc_stage_keys + ...; boxes of 64 rows x 64 columns, 128-byte swizzle); kWsThreads threads; dynamic shared memory
/// 6 tiles of [64][D] bf16 (Q per consumer warpgroup, K and V 2 stages each: 192 KB at head_dim 256), 8 mbarriers and
/// 1 KB of alignment slack.
template <int D, bool kPingPong>
__global__ void __launch_bounds__(kWsThreads, 1)
    tc_ws_kernel(const __grid_constant__ CUtensorMap tkv, const float* __restrict__ q, int64_t qs, float* __restrict__ out,
                 int64_t os, int KVH, PagedAttentionArgs a, float* __restrict__ ws) {
  constexpr int TB = kKeys * D * 2, KD = D / 16, NH = D / 128, CB = D / 64;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
  unsigned char* const Qs = smem;           // [2 consumer warpgroups] tiles
  unsigned char* const Ks = smem + 2 * TB;  // [2 stages] tiles
  unsigned char* const Vs = Ks + 2 * TB;    // [2 stages] tiles
  uint64_t* const bars = reinterpret_cast<uint64_t*>(Vs + 2 * TB);
  // Stage s: K full / empty, V full / empty.
  auto kfull = [&](int s) { return saddr(bars + s); };
  auto kempty = [&](int s) { return saddr(bars + 2 + s); };
  auto vfull = [&](int s) { return saddr(bars + 4 + s); };
  auto vempty = [&](int s) { return saddr(bars + 6 + s); };
  const TcTile bt(a, KVH);
  const int slot = bt.slot, g = bt.g, group = bt.group, row = bt.row, nt = bt.nt, sl = bt.sl, pos0 = bt.pos0, nq = bt.nq;
  auto qrow = [&](int qi) { return bt.row_offset(qi, qs, D); };
  auto orow = [&](int qi) { return bt.row_offset(qi, os, D); };
  if (sl == 0 || nt <= 0) {
    for (int idx = threadIdx.x; idx < nq * D; idx += kWsThreads) out[orow(idx / D) + idx % D] = 0.0f;
    return;
  }
  const TcKeys keys(bt);
  const int chunk = keys.chunk, nchunks = keys.nchunks, k_lo = keys.k_lo, k_end = keys.k_end;
  const bool partial = keys.partial;
  const int ntiles = (k_end - k_lo + kKeys - 1) / kKeys;  // >= 1 with the plan's chunks (TcKeys)
  if (ntiles <= 0) return;  // block-uniform: without a tile the consumers would wait on kfull(0) forever
  // Warp-uniform by construction (shuffled from lane 0), so ptxas sees the wgmma paths as convergent.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0), lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int i = 0; i < 8; ++i) mbar_init(saddr(bars + i), (i >> 1) & 1 ? kConsumerWarps : 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the only CTA-wide barrier after the split: the producer's idle warps leave

  if (warp < 4) {  // 1. Producer warpgroup: one thread issues every K / V tile of the block, in order.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (warp == 0 && lane == 0) {
      tma_prefetch_map(&tkv);
      const int krow = static_cast<int>(g * a.tc_stage_keys + a.tc_row_key_base[row]) + k_lo;
      const int vrow = krow + static_cast<int>(KVH * a.tc_stage_keys);
#pragma unroll 1
      for (int i = 0; i < ntiles; ++i) {
        // Fill f = i / 2 of stage s waits for the consumers' release of fill f - 1 (phase parity (f - 1) & 1).
        const int s = i & 1;
        const uint32_t par = ((i >> 1) + 1) & 1;
        if (i >= 2) mbar_wait_bounded(kempty(s), par);
        mbar_expect_tx(kfull(s), TB);
#pragma unroll
        for (int c = 0; c < CB; ++c) tma_load_2d(saddr(Ks + s * TB + c * 8192), &tkv, 64 * c, krow + kKeys * i, kfull(s));
        if (i >= 2) mbar_wait_bounded(vempty(s), par);
        mbar_expect_tx(vfull(s), TB);
#pragma unroll
        for (int c = 0; c < CB; ++c) tma_load_2d(saddr(Vs + s * TB + c * 8192), &tkv, 64 * c, vrow + kKeys * i, vfull(s));
      }
    }
    return;
  }

  // 2. Consumer warpgroup wg (0, 1): query rows 64 wg .. 64 wg + 63; warp cw (0..7) of the two owns rows 16 cw ..
  // 16 cw + 15 (tc_wg_kernel's warp cw).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int cw = warp - 4, wg = cw >> 2, gr = lane >> 2, t = lane & 3, wr = cw * 16;
  // Q (bf16, rows >= nq zero) into this warpgroup's tile, made visible to its wgmma (async proxy).
  stage_q_tiles<D, 128, 64>(Qs, 64 * wg, nq, threadIdx.x & 127, q, qrow);
  fence_proxy_async();
  named_sync(3 + wg, 128);
  const unsigned char* const Qw = Qs + wg * TB;
  // This thread's two query rows: positions (masks), where their chunk results go and the merged max / sum so far.
  const int qa = wr + gr, qb = qa + 8;
  const int pa = qa < nq ? pos0 + qa / group : -1, pb = qb < nq ? pos0 + qb / group : -1;
  float* const wa = partial ? ws + ((static_cast<int64_t>(slot) * KVH + g) * kRows + qa) * (D + 2) : out + orow(min(qa, nq - 1));
  float* const wb = partial ? ws + ((static_cast<int64_t>(slot) * KVH + g) * kRows + qb) * (D + 2) : out + orow(min(qb, nq - 1));
  const float sl2 = a.scale * 1.4426950408889634f;  // scores in log2 units
  float M0 = -INFINITY, M1 = -INFINITY, L0 = 0.0f, L1 = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  // Output accumulators: NH m64n128 fragments (column block nn of 8 columns: o[nn / 16][4 (nn % 16) ..]).
  float o[NH][64];
#pragma unroll
  for (int h = 0; h < NH; ++h)
#pragma unroll
    for (int e = 0; e < 64; ++e) o[h][e] = 0.0f;
  float sc[32];              // S of the newest tile, then its P (fp32)
  uint32_t pf[kKeys / 16][4];  // P of the tile whose P V is next / in flight, as bf16 A fragments
  // Ping-pong turns (kPingPong): a product issue step of warpgroup wg waits on barrier 1 + wg, then lets the other
  // warpgroup go (barrier 1 + (wg ^ 1)). Steps 0 .. ntiles (S(0); S(i) with P(i - 1) V(i - 1); P V of the last tile);
  // warpgroup 0 goes first (no wait at its step 0), warpgroup 1 signals no one after its last step: each barrier then
  // completes exactly as often as it is waited on (128 syncing + 128 arriving threads).
  auto turn_begin = [&](int step) {
    if constexpr (kPingPong)
      if (!(wg == 0 && step == 0)) named_sync(1 + wg, 256);
  };
  auto turn_end = [&](int step) {
    if constexpr (kPingPong)
      if (!(wg == 1 && step == ntiles)) named_arrive(1 + (wg ^ 1), 256);
  };
  auto issue_s = [&](int i) {  // S(i) = Q K(i)^T (one commit group); K(i) landed
    const unsigned char* const Kt = Ks + (i & 1) * TB;
#pragma unroll
    for (int k = 0; k < KD; ++k) wgmma_ss_n64_k(sc, kmaj(Qw, k), kmaj(Kt, k), k > 0);
    wg_commit();
  };
  auto issue_pv = [&](int i) {  // O += P(i) V(i) (one commit group); V(i) landed
    const unsigned char* const Vt = Vs + (i & 1) * TB;
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int h = 0; h < NH; ++h) wgmma_rs_n128_t(o[h], pf[kk], vmaj(Vt + h * 2 * 8192, kk), 1);
    wg_commit();
  };
  auto release = [&](uint32_t bar) {  // this warp's wgmma reads of the stage are complete
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  auto pack_p = [&] {  // P as bf16 A fragments: two adjacent n8 blocks make one 16 x 16 A tile
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pf[kk][0] = pack_bf16(sc[8 * kk], sc[8 * kk + 1]), pf[kk][1] = pack_bf16(sc[8 * kk + 2], sc[8 * kk + 3]);
      pf[kk][2] = pack_bf16(sc[8 * kk + 4], sc[8 * kk + 5]), pf[kk][3] = pack_bf16(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };
  auto scores = [&](int i, float& al0, float& al1) {  // mask, scale, the online softmax of S(i)
    softmax_tile([&](int x) -> float& { return sc[x]; }, k_lo + kKeys * i, t, pa, pb, sl2, m0, m1, l0, l1, al0, al1);
  };

  // 3. Prologue: S(0), its softmax (O is zero: no rescale), P(0).
  float al0, al1;
  turn_begin(0);
  mbar_wait(kfull(0), 0);
  wg_fence();
  issue_s(0);
  turn_end(0);
  wg_wait<0>();
  wg_pin(sc);
  release(kempty(0));
  scores(0, al0, al1);
  pack_p();
  pin_a(pf);
  // 4. Tiles 1 .. ntiles - 1: S(i) and P(i - 1) V(i - 1) in flight together; the softmax of S(i) under P V.
#pragma unroll 1
  for (int i = 1; i < ntiles; ++i) {
    const int s = i & 1, p = (i - 1) & 1;
    turn_begin(i);
    mbar_wait(kfull(s), (i >> 1) & 1);
    mbar_wait(vfull(p), ((i - 1) >> 1) & 1);  // (issued before K(i): usually landed already)
    wg_fence();  // O (rescaled) and P(i - 1) written by this thread before the products read them
    issue_s(i);
    issue_pv(i - 1);
    turn_end(i);
    wg_wait<1>();  // S(i) done (P V may still run)
    wg_pin(sc);
    release(kempty(s));
    const int kb_prev = k_lo + kKeys * (i - 1);
    if ((kb_prev + kKeys) % chunk != 0) {
      scores(i, al0, al1);
      wg_wait<0>();  // P(i - 1) V(i - 1) done
#pragma unroll
      for (int h = 0; h < NH; ++h) wg_pin(o[h]);
      pin_a(pf);
      release(vempty(p));
    } else {
      // Tile i - 1 ends a chunk (every tc_chunk_keys >= 1024 keys): P(i - 1) V(i - 1) waited for before the softmax,
      // the chunk's partial out or merged into the rows' state (tc_wg_kernel's arithmetic), the next chunk started
      // from scratch (its first tile's factors are 0).
      wg_wait<0>();
#pragma unroll
      for (int h = 0; h < NH; ++h) wg_pin(o[h]);
      pin_a(pf);
      release(vempty(p));
      const int ch = kb_prev / chunk;
      chunk_out<D>([&](int nn, int e) { return o[nn >> 4][4 * (nn & 15) + e]; }, partial, ch, ch == nchunks - 1, wa, wb,
                   qa < nq, qb < nq, t, M0, M1, L0, L1, m0, m1, l0, l1);
      m0 = m1 = -INFINITY, l0 = l1 = 0.0f;
#pragma unroll
      for (int h = 0; h < NH; ++h)
#pragma unroll
        for (int e = 0; e < 64; ++e) o[h][e] = 0.0f;
      scores(i, al0, al1);
    }
#pragma unroll
    for (int h = 0; h < NH; ++h)
#pragma unroll
      for (int j = 0; j < 16; ++j) o[h][4 * j] *= al0, o[h][4 * j + 1] *= al0, o[h][4 * j + 2] *= al1, o[h][4 * j + 3] *= al1;
    pack_p();
#pragma unroll
    for (int h = 0; h < NH; ++h) wg_pin(o[h]);  // the rescale and P written before the next wg_fence
    pin_a(pf);
  }
  // 5. The last tile's P V, then its chunk's end (the block's last tile always ends a chunk).
  const int last = ntiles - 1;
  turn_begin(ntiles);
  mbar_wait(vfull(last & 1), (last >> 1) & 1);
  wg_fence();
  issue_pv(last);
  turn_end(ntiles);
  wg_wait<0>();
#pragma unroll
  for (int h = 0; h < NH; ++h) wg_pin(o[h]);
  pin_a(pf);
  const int ch = (k_lo + kKeys * last) / chunk;
  chunk_out<D>([&](int nn, int e) { return o[nn >> 4][4 * (nn & 15) + e]; }, partial, ch, ch == nchunks - 1, wa, wb,
               qa < nq, qb < nq, t, M0, M1, L0, L1, m0, m1, l0, l1);
}

/// The tensor map of the staged planes kb: [2 KVH tc_stage_keys rows][D] bf16, boxes of 64 rows x 64 columns.
cudaError_t map_planes(CUtensorMap* m, const bf16* kb, int KVH, int64_t stage_keys, int D) {
  const uint64_t dims[2] = {static_cast<uint64_t>(D), static_cast<uint64_t>(2 * KVH * stage_keys)};
  const uint64_t strides[1] = {static_cast<uint64_t>(D) * 2};
  const uint32_t box[2] = {64, kKeys};
  return tma_map_bf16_sw128(m, kb, 2, dims, strides, box);
}

template <int D, bool kPingPong>
cudaError_t launch(dim3 grid, const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                   const PagedAttentionArgs& a, float* ws, const bf16* kb, cudaStream_t stream) {
  constexpr size_t sm = 1024 + 6 * static_cast<size_t>(kKeys) * D * sizeof(bf16) + 8 * sizeof(uint64_t);
  const int KVH = cache.num_kv_heads;
  // Row coordinates are 32-bit: 2 KVH tc_stage_keys + kKeys must fit.
  if (2 * KVH * a.tc_stage_keys + kKeys > INT32_MAX) return cudaErrorNotSupported;
  CUtensorMap m;
  if (map_planes(&m, kb, KVH, a.tc_stage_keys, D) != cudaSuccess) return cudaErrorNotSupported;
  static std::atomic<uint64_t> opted_in{0};
  if (const cudaError_t e = opt_in_dynamic_smem(tc_ws_kernel<D, kPingPong>, sm, opted_in); e != cudaSuccess) return e;
  tc_ws_kernel<D, kPingPong><<<grid, kWsThreads, sm, stream>>>(m, q, qs, out, os, KVH, a, ws);
  return launch_status();
}

}  // namespace

cudaError_t launch_tc_ws(int D, bool ping_pong, dim3 grid, const float* q, int64_t qs, float* out, int64_t os,
                         const KvCacheView& cache, const PagedAttentionArgs& a, float* ws, const bf16* kb,
                         cudaStream_t stream) {
  if (D == 128)
    return ping_pong ? launch<128, true>(grid, q, qs, out, os, cache, a, ws, kb, stream)
                     : launch<128, false>(grid, q, qs, out, os, cache, a, ws, kb, stream);
  if (D == 256)
    return ping_pong ? launch<256, true>(grid, q, qs, out, os, cache, a, ws, kb, stream)
                     : launch<256, false>(grid, q, qs, out, os, cache, a, ws, kb, stream);
  return cudaErrorInvalidValue;
}

}  // namespace ssmserve::cuda::tc
