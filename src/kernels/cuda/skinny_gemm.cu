// Owns the batch-invariant skinny GEMM (see skinny_gemm.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/kernel_tuning.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kChunk = 32;           // k per chunk: two m16n8k16 steps
constexpr int kCtaSplits = 16;       // most splits reduced inside one block (16 warps x 32 threads)
constexpr int kMaxSplits = 64;       // more than kCtaSplits: kCtaSplits per block, groups of blocks per tile
// Weight bytes the whole grid prefetches into L2 before its PDL wait (while its predecessor runs). 4 MB, measured
// on the H200 (session 7): more competes with the predecessor's own weight stream (mamba-2.8b batch-1 decode
// 0 / 4 / 8 / 12 / 16 MB: 384 / 396 / 387 / 371 / 361 tokens/s; batch 4 and mamba2-2.7b also best at 4).
constexpr size_t kPrefetchBytes = 4u << 20;

struct Params {
  const __nv_bfloat16* x;
  int64_t xs;
  const __nv_bfloat16* w;
  int64_t ws;
  void* y;
  int64_t ys;
  bool y_bf16;
  __nv_bfloat16* y2;
  int64_t y2s;
  int M, N, K;
  int splits, chunks, chunks_per_split, tiles_per_cta, prefetch_chunks;
  int cta_splits, groups, tiles;  // splits per block; blocks (split groups) per tile; 16-row tiles
  float* partials;                // groups > 1: [m-blocks, tiles, groups, MT * 4, 32] group sums
  unsigned* counters;             // groups > 1: [m-blocks, tiles] arrivals, zero between launches
  bool late_trigger;  // PDL trigger after the main loop (SSMSERVE_SKINNY_LATE_TRIGGER=1) instead of after the wait
  bool preload;       // the first U chunks of W loaded before the PDL wait (SSMSERVE_SKINNY_PRELOAD=0: after it)
  SkinnyAct act;      // kNone: y (and y2) written; else the MLP activation into act_out instead (SkinnyActEpilogue)
  void* act_out;
  int64_t act_s;
  bool act_bf16;
};

/// Stores the activation value v at out[i] in the epilogue's dtype.
__device__ __forceinline__ void store_act(const Params& p, int64_t i, float v) {
  if (p.act_bf16) static_cast<__nv_bfloat16*>(p.act_out)[i] = __float2bfloat16_rn(v);
  else static_cast<float*>(p.act_out)[i] = v;
}

/// Loads of U chunks from chunk c (predicated off past c1) of W rows g / g + 8 (constant weights: may be issued
/// before the PDL wait).
template <bool VEC, int U>
__device__ __forceinline__ void load_w_chunks(uint4 (&a0)[U], uint4 (&a1)[U], const __nv_bfloat16* w0,
                                              const __nv_bfloat16* w1, bool r0ok, bool r1ok, int c, int c1, int t,
                                              int K) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = (c + u) * kChunk + 8 * t;
    const bool on = c + u < c1;
    a0[u] = load8<VEC, true>(w0, k, K, on && r0ok);
    a1[u] = load8<VEC, true>(w1, k, K, on && r1ok);
  }
}

/// Loads of U chunks from chunk c (predicated off past c1) of the MT x rows (the previous kernel's output: after
/// the PDL wait).
template <int MT, bool VEC, int U>
__device__ __forceinline__ void load_x_chunks(uint4 (&b)[U][MT], const __nv_bfloat16* const (&xr)[MT],
                                              const bool (&xok)[MT], int c, int c1, int t, int K) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = (c + u) * kChunk + 8 * t;
    const bool on = c + u < c1;
#pragma unroll
    for (int j = 0; j < MT; ++j) b[u][j] = load8<VEC, false>(xr[j], k, K, on && xok[j]);
  }
}

/// Block: tiles_per_cta x splits warps; warp (tile, split) computes the 16 output columns n0..n0+15 of the tile
/// for rows m0..m0+8*MT-1 over its split's chunks. Lane (g = lane / 4, t = lane % 4) loads W rows n0+g, n0+g+8
/// and x rows m0+8j+g at k = chunk*32 + 8t (8 values): the k permutation inside a chunk is the same for A and B.
template <int MT, bool VEC, int U, bool PIPE, int MINB>
__global__ void __launch_bounds__(512, MINB) skinny_kernel(Params p) {
  extern __shared__ float red[];  // [warps][MT*4][32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  // Block y: tile group (groups == 1: tiles_per_cta tiles, all their splits) or (tile, split group).
  const int group = p.groups > 1 ? blockIdx.y % p.groups : 0;
  const int cta_split = warp % p.cta_splits, tile_in_cta = warp / p.cta_splits;
  const int split = group * p.cta_splits + cta_split;
  const int tile = p.groups > 1 ? blockIdx.y / p.groups : blockIdx.y * p.tiles_per_cta + tile_in_cta;
  const int n0 = tile * 16;
  const int m0 = blockIdx.x * 8 * MT;
  const int c0 = split * p.chunks_per_split, c1 = min(p.chunks, c0 + p.chunks_per_split);
  const bool r0ok = n0 + g < p.N, r1ok = n0 + g + 8 < p.N;
  const __nv_bfloat16* w0 = p.w + static_cast<int64_t>(r0ok ? n0 + g : 0) * p.ws;
  const __nv_bfloat16* w1 = p.w + static_cast<int64_t>(r1ok ? n0 + g + 8 : 0) * p.ws;
  // 1. Before the PDL wait (independent of the previous kernel): the split's first U chunks of W into registers,
  //    the next ones prefetched into L2.
  // The register-capped and unroll-8 forms (benchmark sweeps only) keep the old order: holding their W chunks
  // across the wait made them spill.
  constexpr bool kPreloadForm = MINB == 1 && U <= 4;
  const bool preload = kPreloadForm && p.preload;
  uint4 a0[U], a1[U];
  if (preload) load_w_chunks<VEC, U>(a0, a1, w0, w1, r0ok, r1ok, c0, c1, t, p.K);
  for (int c = preload ? c0 + U : c0; c < min(c1, c0 + p.prefetch_chunks); ++c) {
    const int k = c * kChunk + 8 * t;
    if (k < p.K) {
      if (r0ok) asm volatile("prefetch.global.L2 [%0];" ::"l"(w0 + k));
      if (r1ok) asm volatile("prefetch.global.L2 [%0];" ::"l"(w1 + k));
    }
  }
  pdl_wait();
  if (!p.late_trigger) pdl_launch_dependents();
  if (!preload) load_w_chunks<VEC, U>(a0, a1, w0, w1, r0ok, r1ok, c0, c1, t, p.K);
  const __nv_bfloat16* xr[MT];
  bool xok[MT];
#pragma unroll
  for (int j = 0; j < MT; ++j) {
    const int m = m0 + 8 * j + g;
    xok[j] = m < p.M;
    xr[j] = p.x + static_cast<int64_t>(xok[j] ? m : 0) * p.xs;
  }
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  // 2. The split's chunks in order, U chunks of loads in flight (PIPE: the next U issued before these are used).
  if constexpr (!PIPE) {
    for (int c = c0; c < c1; c += U) {
      uint4 b[U][MT];
      if (c != c0) load_w_chunks<VEC, U>(a0, a1, w0, w1, r0ok, r1ok, c, c1, t, p.K);
      load_x_chunks<MT, VEC, U>(b, xr, xok, c, c1, t, p.K);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u >= c1) break;
#pragma unroll
        for (int j = 0; j < MT; ++j) mma_chunk(acc[j], a0[u], a1[u], b[u][j]);
      }
    }
  } else {
    uint4 b[U][MT];
    load_x_chunks<MT, VEC, U>(b, xr, xok, c0, c1, t, p.K);
    for (int c = c0; c < c1; c += U) {
      uint4 na0[U], na1[U], nb[U][MT];
      load_w_chunks<VEC, U>(na0, na1, w0, w1, r0ok, r1ok, c + U, c1, t, p.K);
      load_x_chunks<MT, VEC, U>(nb, xr, xok, c + U, c1, t, p.K);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u >= c1) break;
#pragma unroll
        for (int j = 0; j < MT; ++j) mma_chunk(acc[j], a0[u], a1[u], b[u][j]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        a0[u] = na0[u], a1[u] = na1[u];
#pragma unroll
        for (int j = 0; j < MT; ++j) b[u][j] = nb[u][j];
      }
    }
  }
  if (p.late_trigger) pdl_launch_dependents();
  // 3. Split sums in split order (split 0 first), by the block's first-split warp of the tile.
  if (p.cta_splits > 1) {
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[(warp * MT * 4 + j * 4 + q) * 32 + lane] = acc[j][q];
    __syncthreads();
    if (cta_split != 0) return;
    for (int s = 1; s < p.cta_splits; ++s) {
      const int ws = warp + s;
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] += red[(ws * MT * 4 + j * 4 + q) * 32 + lane];
    }
  }
  // 3b. Several blocks per tile: each publishes its group sum; the last to arrive adds them in group order.
  if (p.groups > 1) {
    const int64_t slot = static_cast<int64_t>(blockIdx.x) * p.tiles + tile;
    float* mine = p.partials + (slot * p.groups + group) * (MT * 4 * 32);
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) mine[(j * 4 + q) * 32 + lane] = acc[j][q];
    __threadfence();
    __syncwarp();
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(p.counters + slot, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != static_cast<unsigned>(p.groups - 1)) return;
    __threadfence();
    const float* all = p.partials + slot * p.groups * (MT * 4 * 32);
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = __ldcg(all + (j * 4 + q) * 32 + lane);
    for (int gi = 1; gi < p.groups; ++gi)
#pragma unroll
      for (int j = 0; j < MT; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] += __ldcg(all + (gi * MT * 4 + j * 4 + q) * 32 + lane);
    if (lane == 0) p.counters[slot] = 0;  // ready for the next launch
  }
  // 4. Epilogue: acc[j][2h + e] is y[m0 + 8j + 2t + e, n0 + g + 8h].
  if (p.act == SkinnyAct::kSiluGatedInterleaved8) {  // rows n0 + g (gate) and n0 + g + 8 (up) are channel n0 / 2 + g
    if (n0 >= p.N) return;  // a block's tiles past N (N % 16 == 0: a tile is whole or absent)
#pragma unroll
    for (int j = 0; j < MT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = m0 + 8 * j + 2 * t + e;
        if (m < p.M) store_act(p, static_cast<int64_t>(m) * p.act_s + n0 / 2 + g, mlp_act_value(acc[j][e], acc[j][2 + e], true));
      }
    return;
  }
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = m0 + 8 * j + 2 * t + e, n = n0 + g + 8 * h;
        if (m >= p.M || n >= p.N) continue;
        const float v = acc[j][2 * h + e];
        if (p.act == SkinnyAct::kRelu2) {  // relu(y)^2 in place of y
          store_act(p, static_cast<int64_t>(m) * p.act_s + n, mlp_act_value(v, 0.0f, false));
          continue;
        }
        if (p.y_bf16) static_cast<__nv_bfloat16*>(p.y)[static_cast<int64_t>(m) * p.ys + n] = __float2bfloat16_rn(v);
        else static_cast<float*>(p.y)[static_cast<int64_t>(m) * p.ys + n] = v;
        if (p.y2) p.y2[static_cast<int64_t>(m) * p.y2s + n] = __float2bfloat16_rn(v);
      }
}

template <int MT, bool VEC, int U, bool PIPE, int MINB>
cudaError_t launch(const Params& p, int warps, dim3 grid, bool pdl, cudaStream_t stream) {
  const size_t smem = p.cta_splits > 1 ? static_cast<size_t>(warps) * MT * 4 * 32 * sizeof(float) : 0;
  auto kernel = skinny_kernel<MT, VEC, U, PIPE, MINB>;
  if (smem > 48 * 1024) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        e != cudaSuccess)
      return e;
  }
  return launch_pdl(pdl, kernel, grid, dim3(32 * warps), smem, stream, p);
}

/// The instantiated variants: unaligned operands and M > 16 take the first version's shape; aligned decode rows
/// (MT 1 or 2) any of the tuning's (unroll, pipelined, reg_cap) combinations below.
int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return v > 0 ? v : 132;
  }();
  return n;
}

template <int MT>
cudaError_t launch_vec(const Params& p, const SkinnyTuning& tu, int warps, dim3 grid, bool pdl, cudaStream_t stream) {
  constexpr int kCap = MT == 1 ? 2 : 1;  // the first version's 64-register cap (MT 1)
  if (tu.auto_shape) {
    // The default launch shape: the pipelined form when the whole grid is resident at once (one wave), else the
    // plain unroll-4 form (fewer registers: a grid just over the pipelined form's wave fits in one of its own;
    // grids of several waves measured fastest with it too).
    const size_t smem = p.cta_splits > 1 ? static_cast<size_t>(warps) * MT * 4 * 32 * sizeof(float) : 0;
    const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y;
    static int per_sm[17] = {};  // blocks of w warps of the pipelined form one SM holds (occupancy API, cached)
    if (warps >= 1 && warps <= 16 && per_sm[warps] == 0) {
      int b = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, skinny_kernel<MT, true, 2, true, 1>, 32 * warps, smem) !=
              cudaSuccess ||
          b < 1)
        b = 1;
      per_sm[warps] = b;
    }
    if (warps >= 1 && warps <= 16 && blocks <= static_cast<int64_t>(num_sms()) * per_sm[warps])
      return launch<MT, true, 2, true, 1>(p, warps, grid, pdl, stream);
    return launch<MT, true, 4, false, 1>(p, warps, grid, pdl, stream);
  }
  if (tu.pipelined) {
    if (tu.unroll <= 2) return tu.reg_cap ? launch<MT, true, 2, true, kCap>(p, warps, grid, pdl, stream)
                                          : launch<MT, true, 2, true, 1>(p, warps, grid, pdl, stream);
    return launch<MT, true, 4, true, 1>(p, warps, grid, pdl, stream);
  }
  if (tu.unroll >= 8) return launch<MT, true, 8, false, 1>(p, warps, grid, pdl, stream);
  return tu.reg_cap ? launch<MT, true, 4, false, kCap>(p, warps, grid, pdl, stream)
                    : launch<MT, true, 4, false, 1>(p, warps, grid, pdl, stream);
}

}  // namespace

int skinny_gemm_splits(int64_t N, int64_t K) {
  const int64_t tiles = (N + 15) / 16, chunks = (K + kChunk - 1) / kChunk;
  int s = 1;
  while (s < kMaxSplits && tiles * s < 2048 && chunks / (2 * s) >= (s >= kCtaSplits ? 2 : 4)) s *= 2;
  return s;
}

int skinny_gemm_splits(int64_t N, int64_t K, int split_shift) {
  int s = skinny_gemm_splits(N, K);
  for (; split_shift > 0 && s < kMaxSplits; --split_shift) s *= 2;
  for (; split_shift < 0 && s > 1; ++split_shift) s /= 2;
  return s;
}

namespace {
/// KernelTuning::skinny_tune (benchmarks): the decode launch shape and block split count for every call, or nullptr.
const SkinnyTuning* env_tuning() {
  const auto& t = kernel_tuning().skinny_tune;
  return t ? &*t : nullptr;
}
}  // namespace

SkinnyTuning skinny_default_tuning(int64_t M, int64_t N, int64_t K) {
  SkinnyTuning t;
  // Summation order (N, K and, under the shape rules, the SM count; never M): blocks of at most 4 split warps, so
  // that the grid is many small blocks (balanced over the 132 SMs) rather than a few 16-warp ones; without the rules,
  // LM-head-sized weights (one split by the rule, >= 64 chunks of K) in 2 splits (H200: 50280 x 2560 at M = 1,
  // 80 -> 68 us).
  t.cta_splits = 4;
  const int base = skinny_gemm_splits(N, K);
  const int64_t chunks = (K + kChunk - 1) / kChunk, tiles = (N + 15) / 16;
  bool wide = false;
  if (kernel_tuning().skinny_rules) {
    // Wide weights (1-2 splits by the rule, >= 64 chunks of K: MLP gate / up, LM heads) in 4 splits, and (M <= 8)
    // on the pipelined form whatever the wave count: M = 1 on the H200, Qwen3.5-9B LM head 544 -> 474 us, Qwen3.6-27B
    // gate / up 101 -> 87 us, Qwen3.5-9B / Falcon-H1-7B gate / up -3% / -4% (docs/benchmarks.md, session 27).
    if (base <= 2 && chunks >= 64) wide = true, t.split_shift = base == 1 ? 2 : 1;
    // Deep weights (>= 8 splits: down / out projections) reduce 8 splits per block (fewer cross-block group sums)
    // when those blocks spread evenly over the SMs (<= 10% over the mean per SM): Qwen3.5-9B o_proj 12.7 -> 11.1 us,
    // down 33.0 -> 31.8, Falcon-H1-7B down 22.8 -> 21.5; uneven grids (Qwen3.6-27B down: 2.4 per SM) measured slower.
    if (base >= 8) {
      const double per_sm = static_cast<double>(tiles * base / 8) / num_sms();
      if (per_sm > 0 && std::ceil(per_sm) / per_sm <= 1.1) t.cta_splits = 8;
    }
  } else if (base == 1 && chunks >= 64) {
    t.split_shift = 1;
  }
  // The split rule (KernelTuning::skinny_split_rule): each tile's splits reduced in one block (the group sums across
  // blocks cost ~1 us of tail), as many splits as keep the SMs busy without stacking 16-warp blocks unevenly.
  // Graph-timed at M = 1 on an H100 (docs/benchmarks.md, session 40): Granite-4.0-H-Tiny in_proj 6448 x 1536
  // 11.4 -> 8.9 us, out_proj 1536 x 3072 6.2 -> 4.9, Nemotron-3-Nano shared up 3712 x 2688 12.2 -> 8.7,
  // Qwen3.5-35B-A3B out_proj 2048 x 4096 8.5 -> 6.9. Small weights (< 64 tiles or < 16 chunks) keep the rules above;
  // so do all under SSMSERVE_SKINNY_RULES=0.
  if (kernel_tuning().skinny_rules && kernel_tuning().skinny_split_rule == 1 && tiles >= 64 && chunks >= 16) {
    const int64_t sms = num_sms();
    int s = tiles <= sms ? 16 : tiles <= 3 * sms ? 8 : 4;
    while (s > 1 && chunks < 3 * s) s /= 2;
    int shift = 0;
    for (int b = base; b < s; b *= 2) ++shift;
    for (int b = base; b > s; b /= 2) --shift;
    t.split_shift = shift;
    t.cta_splits = s;  // >= 4: 16 chunks allow 4 splits of >= 3
  }
  // Launch shape (per M): decode rows picked by occupancy (SkinnyTuning::auto_shape), without the register cap.
  if (M <= 16) t.auto_shape = true, t.reg_cap = false;
  if (wide && M <= 8) t.auto_shape = false, t.unroll = 2, t.pipelined = true;
  if (const SkinnyTuning* e = env_tuning()) {
    t.cta_splits = e->cta_splits;
    if (M <= 16) t.unroll = e->unroll, t.pipelined = e->pipelined, t.reg_cap = e->reg_cap, t.auto_shape = false;
  }
  return t;
}

SkinnyTuning skinny_part_tuning(int64_t M, int64_t rows, int64_t N_whole, int64_t K) {
  SkinnyTuning t = skinny_default_tuning(M, N_whole, K);
  const int want = skinny_gemm_splits(N_whole, K, t.split_shift);
  while (t.split_shift > -8 && skinny_gemm_splits(rows, K, t.split_shift) > want) --t.split_shift;
  while (t.split_shift < 8 && skinny_gemm_splits(rows, K, t.split_shift) < want) ++t.split_shift;
  return t;
}

namespace {
int cta_splits_of(const SkinnyTuning& t, int splits) {
  const int c = t.cta_splits >= kCtaSplits ? kCtaSplits : t.cta_splits >= 8 ? 8 : 4;
  return std::min(splits, c);
}
}  // namespace

size_t skinny_gemm_workspace(int64_t M, int64_t N, int64_t K, size_t* counter_bytes, const SkinnyTuning* tuning) {
  const SkinnyTuning tu = tuning ? *tuning : skinny_default_tuning(M, N, K);
  const int splits = skinny_gemm_splits(N, K, tu.split_shift), cta = cta_splits_of(tu, splits);
  const int64_t tiles = (N + 15) / 16, groups = splits / cta;
  const int mt = M <= 8 ? 1 : M <= 16 ? 2 : 4;
  const int64_t mblocks = (M + 8 * mt - 1) / (8 * mt);
  if (counter_bytes) *counter_bytes = groups > 1 ? static_cast<size_t>(mblocks * tiles) * sizeof(unsigned) : 0;
  return groups > 1 ? static_cast<size_t>(mblocks * tiles * groups) * mt * 4 * 32 * sizeof(float) : 0;
}

cudaError_t skinny_gemm(const GemmArgs& a, void* y2, int64_t y2_stride, bool pdl, cudaStream_t stream,
                        void* workspace, size_t workspace_bytes, unsigned* counters, const SkinnyExtras& extras) {
  const SkinnyActEpilogue& act = extras.act;
  const bool gated_act = act.act == SkinnyAct::kSiluGatedInterleaved8;
  if (a.ab_dtype != DType::BF16 || (a.y_dtype != DType::F32 && a.y_dtype != DType::BF16) || a.M < 0 || a.N < 1 ||
      a.K < 1 || a.x_stride < a.K || a.w_stride < a.K || (act.act == SkinnyAct::kNone && a.y_stride < a.N) ||
      (y2 && y2_stride < a.N) || a.M > (1 << 30) || a.N > (1 << 30) || a.K > (1 << 30) || !a.w ||
      (act.act == SkinnyAct::kNone && !a.y))
    return cudaErrorInvalidValue;
  if (act.act != SkinnyAct::kNone &&
      (y2 || !act.out || (act.out_dtype != DType::BF16 && act.out_dtype != DType::F32) ||
       (gated_act && (a.N % 16 != 0 || act.out_stride < a.N / 2)) || (!gated_act && act.out_stride < a.N)))
    return cudaErrorInvalidValue;
  const SkinnyTuning tu = extras.tuning ? *extras.tuning : skinny_default_tuning(a.M, a.N, a.K);
  Params p{};
  if (a.M == 0) return cudaSuccess;
  p.late_trigger = kernel_tuning().skinny_late_trigger;
  p.preload = kernel_tuning().skinny_preload;
  p.x = static_cast<const __nv_bfloat16*>(a.x), p.xs = a.x_stride;
  p.w = static_cast<const __nv_bfloat16*>(a.w), p.ws = a.w_stride;
  p.y = a.y, p.ys = a.y_stride, p.y_bf16 = a.y_dtype == DType::BF16;
  p.y2 = static_cast<__nv_bfloat16*>(y2), p.y2s = y2_stride;
  p.act = act.act, p.act_out = act.out, p.act_s = act.out_stride, p.act_bf16 = act.out_dtype == DType::BF16;
  p.M = static_cast<int>(a.M), p.N = static_cast<int>(a.N), p.K = static_cast<int>(a.K);
  p.splits = skinny_gemm_splits(a.N, a.K, tu.split_shift);
  p.chunks = static_cast<int>((a.K + kChunk - 1) / kChunk);
  p.chunks_per_split = (p.chunks + p.splits - 1) / p.splits;
  // Launch shape (never changes a result): m-tiles per warp and n-tiles per block.
  const int mt = a.M <= 8 ? 1 : a.M <= 16 ? 2 : 4;
  const int64_t tiles = (a.N + 15) / 16;
  p.tiles = static_cast<int>(tiles);
  p.cta_splits = cta_splits_of(tu, p.splits);
  p.groups = p.splits / p.cta_splits;
  p.tiles_per_cta = p.groups > 1 ? 1 : std::max(1, 4 / p.splits);
  const int warps = p.tiles_per_cta * p.cta_splits;
  const int64_t grid_y = p.groups > 1 ? tiles * p.groups : (tiles + p.tiles_per_cta - 1) / p.tiles_per_cta;
  const int64_t grid_x = (a.M + 8 * mt - 1) / (8 * mt);
  if (grid_y > 65535 || grid_x > 2147483647) return cudaErrorInvalidValue;
  if (p.groups > 1) {
    size_t counter_bytes = 0;
    if (!workspace || !counters ||
        workspace_bytes < skinny_gemm_workspace(a.M, a.N, a.K, &counter_bytes, &tu))
      return cudaErrorInvalidValue;
    p.partials = static_cast<float*>(workspace);
    p.counters = counters;
  }
  const int64_t warps_total = tiles * p.splits;
  // The pre-wait L2 prefetch (KernelTuning::skinny_prefetch_bytes for benchmarks).
  const int64_t prefetch_bytes = kernel_tuning().skinny_prefetch_bytes >= 0 ? kernel_tuning().skinny_prefetch_bytes
                                                                            : static_cast<int64_t>(kPrefetchBytes);
  p.prefetch_chunks = static_cast<int>(std::clamp<int64_t>(
      prefetch_bytes / std::max<int64_t>(1, warps_total * 16 * kChunk * 2), 0, p.chunks_per_split));
  const auto al16 = [](const void* q, int64_t stride) {
    return reinterpret_cast<uintptr_t>(q) % 16 == 0 && stride % 8 == 0;
  };
  const bool vec = a.K % 8 == 0 && al16(a.x, a.x_stride) && al16(a.w, a.w_stride);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  if (!vec) {
    if (mt == 1) return launch<1, false, 4, false, 2>(p, warps, grid, pdl, stream);
    if (mt == 2) return launch<2, false, 4, false, 1>(p, warps, grid, pdl, stream);
    return launch<4, false, 2, false, 1>(p, warps, grid, pdl, stream);
  }
  if (mt == 1) return launch_vec<1>(p, tu, warps, grid, pdl, stream);
  if (mt == 2) return launch_vec<2>(p, tu, warps, grid, pdl, stream);
  return launch<4, true, 2, false, 1>(p, warps, grid, pdl, stream);
}

}  // namespace ssmserve::cuda
