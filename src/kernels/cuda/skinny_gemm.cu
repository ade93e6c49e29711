// Owns the batch-invariant skinny GEMM (see skinny_gemm.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/skinny_gemm.h"

#include <algorithm>

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kChunk = 32;           // k per chunk: two m16n8k16 steps
constexpr int kCtaSplits = 16;       // most splits reduced inside one block (16 warps x 32 threads)
constexpr int kMaxSplits = 64;       // more than kCtaSplits: kCtaSplits per block, groups of blocks per tile
constexpr size_t kPrefetchBytes = 16u << 20;  // weight bytes the whole grid prefetches into L2 before its wait

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
};

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/// 8 consecutive bf16 of `row` from column k (zeros past `K` or when !ok). VEC: one 16-byte load (row and k
/// 16-byte aligned, K % 8 == 0); streaming weights bypass L1.
template <bool VEC, bool STREAM>
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* row, int k, int K, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!ok || k >= K) return v;
  if constexpr (VEC) {
    if constexpr (STREAM) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(row + k));
    } else {
      v = *reinterpret_cast<const uint4*>(row + k);
    }
  } else {
    uint16_t h[8];
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = k + i < K ? r[k + i] : 0;
    v.x = h[0] | (uint32_t(h[1]) << 16), v.y = h[2] | (uint32_t(h[3]) << 16);
    v.z = h[4] | (uint32_t(h[5]) << 16), v.w = h[6] | (uint32_t(h[7]) << 16);
  }
  return v;
}

/// Block: tiles_per_cta x splits warps; warp (tile, split) computes the 16 output columns n0..n0+15 of the tile
/// for rows m0..m0+8*MT-1 over its split's chunks. Lane (g = lane / 4, t = lane % 4) loads W rows n0+g, n0+g+8
/// and x rows m0+8j+g at k = chunk*32 + 8t (8 values): the k permutation inside a chunk is the same for A and B.
template <int MT, bool VEC>
__global__ void __launch_bounds__(512, MT == 1 ? 2 : 1) skinny_kernel(Params p) {
  constexpr int kUnroll = MT == 4 ? 2 : 4;  // chunks of loads in flight per warp
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
  // 1. Prefetch the start of this warp's weight slice into L2 (independent of the previous kernel).
  for (int c = c0; c < min(c1, c0 + p.prefetch_chunks); ++c) {
    const int k = c * kChunk + 8 * t;
    if (k < p.K) {
      if (r0ok) asm volatile("prefetch.global.L2 [%0];" ::"l"(w0 + k));
      if (r1ok) asm volatile("prefetch.global.L2 [%0];" ::"l"(w1 + k));
    }
  }
  pdl_wait();
  pdl_launch_dependents();
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
  // 2. The split's chunks in order, kUnroll chunks of loads in flight.
  for (int c = c0; c < c1; c += kUnroll) {
    uint4 a0[kUnroll], a1[kUnroll], b[kUnroll][MT];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = (c + u) * kChunk + 8 * t;
      const bool on = c + u < c1;
      a0[u] = load8<VEC, true>(w0, k, p.K, on && r0ok);
      a1[u] = load8<VEC, true>(w1, k, p.K, on && r1ok);
#pragma unroll
      for (int j = 0; j < MT; ++j) b[u][j] = load8<VEC, false>(xr[j], k, p.K, on && xok[j]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c + u >= c1) break;
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        mma_bf16(acc[j], a0[u].x, a1[u].x, a0[u].y, a1[u].y, b[u][j].x, b[u][j].y);
        mma_bf16(acc[j], a0[u].z, a1[u].z, a0[u].w, a1[u].w, b[u][j].z, b[u][j].w);
      }
    }
  }
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
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = m0 + 8 * j + 2 * t + e, n = n0 + g + 8 * h;
        if (m >= p.M || n >= p.N) continue;
        const float v = acc[j][2 * h + e];
        if (p.y_bf16) static_cast<__nv_bfloat16*>(p.y)[static_cast<int64_t>(m) * p.ys + n] = __float2bfloat16_rn(v);
        else static_cast<float*>(p.y)[static_cast<int64_t>(m) * p.ys + n] = v;
        if (p.y2) p.y2[static_cast<int64_t>(m) * p.y2s + n] = __float2bfloat16_rn(v);
      }
}

template <int MT, bool VEC>
cudaError_t launch(const Params& p, int warps, dim3 grid, bool pdl, cudaStream_t stream) {
  const size_t smem = p.cta_splits > 1 ? static_cast<size_t>(warps) * MT * 4 * 32 * sizeof(float) : 0;
  auto kernel = skinny_kernel<MT, VEC>;
  if (smem > 48 * 1024) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
        e != cudaSuccess)
      return e;
  }
  return launch_pdl(pdl, kernel, grid, dim3(32 * warps), smem, stream, p);
}

}  // namespace

int skinny_gemm_splits(int64_t N, int64_t K) {
  const int64_t tiles = (N + 15) / 16, chunks = (K + kChunk - 1) / kChunk;
  int s = 1;
  while (s < kMaxSplits && tiles * s < 2048 && chunks / (2 * s) >= (s >= kCtaSplits ? 2 : 4)) s *= 2;
  return s;
}

size_t skinny_gemm_workspace(int64_t M, int64_t N, int64_t K, size_t* counter_bytes) {
  const int splits = skinny_gemm_splits(N, K);
  const int64_t tiles = (N + 15) / 16, groups = splits > kCtaSplits ? splits / kCtaSplits : 1;
  const int mt = M <= 8 ? 1 : M <= 16 ? 2 : 4;
  const int64_t mblocks = (M + 8 * mt - 1) / (8 * mt);
  if (counter_bytes) *counter_bytes = groups > 1 ? static_cast<size_t>(mblocks * tiles) * sizeof(unsigned) : 0;
  return groups > 1 ? static_cast<size_t>(mblocks * tiles * groups) * mt * 4 * 32 * sizeof(float) : 0;
}

cudaError_t skinny_gemm(const GemmArgs& a, void* y2, int64_t y2_stride, bool pdl, cudaStream_t stream,
                        void* workspace, size_t workspace_bytes, unsigned* counters) {
  if (a.ab_dtype != DType::BF16 || (a.y_dtype != DType::F32 && a.y_dtype != DType::BF16) || a.M < 0 || a.N < 1 ||
      a.K < 1 || a.x_stride < a.K || a.w_stride < a.K || a.y_stride < a.N || (y2 && y2_stride < a.N) ||
      a.M > (1 << 30) || a.N > (1 << 30) || a.K > (1 << 30) || !a.w || !a.y)
    return cudaErrorInvalidValue;
  if (a.M == 0) return cudaSuccess;
  Params p{};
  p.x = static_cast<const __nv_bfloat16*>(a.x), p.xs = a.x_stride;
  p.w = static_cast<const __nv_bfloat16*>(a.w), p.ws = a.w_stride;
  p.y = a.y, p.ys = a.y_stride, p.y_bf16 = a.y_dtype == DType::BF16;
  p.y2 = static_cast<__nv_bfloat16*>(y2), p.y2s = y2_stride;
  p.M = static_cast<int>(a.M), p.N = static_cast<int>(a.N), p.K = static_cast<int>(a.K);
  p.splits = skinny_gemm_splits(a.N, a.K);
  p.chunks = static_cast<int>((a.K + kChunk - 1) / kChunk);
  p.chunks_per_split = (p.chunks + p.splits - 1) / p.splits;
  // Launch shape (never changes a result): m-tiles per warp and n-tiles per block.
  const int mt = a.M <= 8 ? 1 : a.M <= 16 ? 2 : 4;
  const int64_t tiles = (a.N + 15) / 16;
  p.tiles = static_cast<int>(tiles);
  p.cta_splits = std::min(p.splits, kCtaSplits);
  p.groups = p.splits / p.cta_splits;
  p.tiles_per_cta = p.groups > 1 ? 1 : std::max(1, 4 / p.splits);
  const int warps = p.tiles_per_cta * p.cta_splits;
  const int64_t grid_y = p.groups > 1 ? tiles * p.groups : (tiles + p.tiles_per_cta - 1) / p.tiles_per_cta;
  const int64_t grid_x = (a.M + 8 * mt - 1) / (8 * mt);
  if (grid_y > 65535 || grid_x > 2147483647) return cudaErrorInvalidValue;
  if (p.groups > 1) {
    size_t counter_bytes = 0;
    if (!workspace || !counters || workspace_bytes < skinny_gemm_workspace(a.M, a.N, a.K, &counter_bytes))
      return cudaErrorInvalidValue;
    p.partials = static_cast<float*>(workspace);
    p.counters = counters;
  }
  const int64_t warps_total = tiles * p.splits;
  p.prefetch_chunks = static_cast<int>(std::clamp<int64_t>(
      static_cast<int64_t>(kPrefetchBytes) / std::max<int64_t>(1, warps_total * 16 * kChunk * 2), 0, p.chunks_per_split));
  const auto al16 = [](const void* q, int64_t stride) {
    return reinterpret_cast<uintptr_t>(q) % 16 == 0 && stride % 8 == 0;
  };
  const bool vec = a.K % 8 == 0 && al16(a.x, a.x_stride) && al16(a.w, a.w_stride);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  switch (mt * 2 + (vec ? 1 : 0)) {
    case 2: return launch<1, false>(p, warps, grid, pdl, stream);
    case 3: return launch<1, true>(p, warps, grid, pdl, stream);
    case 4: return launch<2, false>(p, warps, grid, pdl, stream);
    case 5: return launch<2, true>(p, warps, grid, pdl, stream);
    case 8: return launch<4, false>(p, warps, grid, pdl, stream);
    default: return launch<4, true>(p, warps, grid, pdl, stream);
  }
}

}  // namespace ssmserve::cuda
