// Owns the persistent Mamba-1 decode kernel (see persistent_decode.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cooperative_launch.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/persistent_decode.h"
#include "kernels/cuda/skinny_gemm.h"

#include <algorithm>

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 640;  // 20 warps = 5 quads per block, one block per SM: 2640 warps on 132 SMs hold the
constexpr int kWarps = kThreads / 32;  // 2560 (tile, split) warps of mamba-2.8b's in_proj and out_proj at once
constexpr int kQuads = kWarps / 4;
constexpr int kNormThreads = 256;  // decode_ops.cu's norm block (its summation order)
constexpr int kNormVec = 4;

/// One skinny GEMM of the layer: skinny_gemm's split structure for (N, K) (skinny_default_tuning).
struct GemmDesc {
  int N, K, chunks, splits, cps, cta, groups, tiles;
  float* partials;     // groups > 1: [tiles, groups, 128]
  unsigned* counters;  // groups > 1: [tiles] arrivals
};

struct KParams {
  int H, I, N, R, W, XD, M, lanes;
  float eps;
  GemmDesc gin, gx, gdt, gout;
  float* hidden;
  float* out;
  float* xz;
  float* xdbl;
  __nv_bfloat16* xdbl16;
  __nv_bfloat16* y16;
  const int32_t* state_indices;
  unsigned* bar;  // [0] arrivals, [1] generation
  const Mamba1DecodeLayer* layers;
  Mamba1DecodeLayer one;
  int num_layers;
  bool first_layer;
  int prefetch;
  long long* timing;
  int gch;  // x_proj group channels (cta * cps * 32)
  // dynamic shared memory offsets (bytes)
  int off_red, off_xcs, off_bc, off_delta, off_si;
};

__device__ __forceinline__ void named_bar(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

__device__ __forceinline__ void bulk_prefetch(const void* p, size_t bytes) {
  // TMA bulk prefetch into L2 (sm_90): 16-byte aligned address, size a multiple of 16.
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (a + 15) & ~uintptr_t{15};
  if (bytes <= lo - a + 16) return;
  size_t n = (bytes - (lo - a)) & ~size_t{15};
  const char* q = reinterpret_cast<const char*>(lo);
  while (n > 0) {
    const unsigned piece = static_cast<unsigned>(n < (size_t{1} << 20) ? n : (size_t{1} << 20));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(q), "r"(piece) : "memory");
    q += piece, n -= piece;
  }
}

/// Grid-wide barrier (all blocks co-resident): arrival counter + generation, release / acquire through fences.
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = bar + 1;
    const unsigned g = *gen;
    __threadfence();
    const unsigned arrived = atomicAdd(bar, 1u);
    if (arrived == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == g) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ uint4 ldcg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

/// conv_update_channel's output (same operation order) without the state shift.
template <class TS>
__device__ __forceinline__ float conv_out_channel(const TS* state, int64_t dim, int width, const float* w_row,
                                                  float bias, float xv) {
  const int S = width - 1;
  float acc = bias;
#pragma unroll
  for (int k = 0; k < kConvMaxWidth - 1; ++k) {
    if (k >= S) break;
    acc = fmaf(w_row[k], load(state + k * dim), acc);
  }
  acc = fmaf(w_row[S], xv, acc);
  return silu(acc);
}

/// One (tile, group) item of a split GEMM by a quad of 4 warps (qw = warp in the quad): warp qw < cta runs split
/// group * cta + qw over its chunks in order (skinny_kernel's loads and mma order), the split sums are added in
/// split order in shared memory, the group sums (groups > 1) in group order by the last quad to arrive; then
/// ep(acc, n0, g, t) on the quad's warp 0 with acc[2h + e] = y[2t + e, n0 + g + 8h]. xl(k, on): 8 bf16 of x row
/// g (lane / 4) at column k (zeros when !on or k >= K). Every warp of the quad must call it.
template <class XL, class EP>
__device__ __forceinline__ void quad_item(const GemmDesc& d, const __nv_bfloat16* W, int tile, int group, int qw,
                                          int lane, float* qred, int bar_id, XL&& xl, EP&& ep) {
  const int g = lane >> 2, t = lane & 3;
  const int n0 = tile * 16;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (qw < d.cta) {
    const int split = group * d.cta + qw;
    const int c0 = split * d.cps, c1 = min(d.chunks, c0 + d.cps);
    const bool r0ok = n0 + g < d.N, r1ok = n0 + g + 8 < d.N;
    const __nv_bfloat16* w0 = W + static_cast<int64_t>(r0ok ? n0 + g : 0) * d.K;
    const __nv_bfloat16* w1 = W + static_cast<int64_t>(r1ok ? n0 + g + 8 : 0) * d.K;
    auto ld = [&](int c, uint4& A0, uint4& A1, uint4& B) {
      const int k = c * 32 + 8 * t;
      const bool on = c < c1;
      A0 = load8<true, true>(w0, k, d.K, on && r0ok);
      A1 = load8<true, true>(w1, k, d.K, on && r1ok);
      B = xl(k, on && k < d.K);
    };
    uint4 a0[2], a1[2], b[2];
    ld(c0, a0[0], a1[0], b[0]);
    ld(c0 + 1, a0[1], a1[1], b[1]);
    for (int c = c0; c < c1; c += 2) {
      uint4 na0[2], na1[2], nb[2];
      ld(c + 2, na0[0], na1[0], nb[0]);
      ld(c + 3, na0[1], na1[1], nb[1]);
      mma_chunk(acc, a0[0], a1[0], b[0]);
      if (c + 1 < c1) mma_chunk(acc, a0[1], a1[1], b[1]);
#pragma unroll
      for (int u = 0; u < 2; ++u) a0[u] = na0[u], a1[u] = na1[u], b[u] = nb[u];
    }
  }
  if (d.cta > 1) {
    named_bar(bar_id, 128);  // the previous item's reads of qred are done
    if (qw < d.cta)
#pragma unroll
      for (int q = 0; q < 4; ++q) qred[(qw * 4 + q) * 32 + lane] = acc[q];
    named_bar(bar_id, 128);
    if (qw != 0) return;
    for (int s = 1; s < d.cta; ++s)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] += qred[(s * 4 + q) * 32 + lane];
  } else if (qw != 0) {
    return;
  }
  if (d.groups > 1) {
    float* mine = d.partials + (static_cast<int64_t>(tile) * d.groups + group) * 128;
#pragma unroll
    for (int q = 0; q < 4; ++q) __stcg(mine + q * 32 + lane, acc[q]);
    __threadfence();
    __syncwarp();
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(d.counters + tile, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != static_cast<unsigned>(d.groups - 1)) return;
    __threadfence();
    const float* all = d.partials + static_cast<int64_t>(tile) * d.groups * 128;
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[q] = __ldcg(all + q * 32 + lane);
    for (int gi = 1; gi < d.groups; ++gi)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] += __ldcg(all + gi * 128 + q * 32 + lane);
    if (lane == 0) d.counters[tile] = 0;  // ready for the next launch
  }
  ep(acc, n0, g, t);
}

/// Prefetch of a quad item's weight slice: rows n0..n0+15, the group's chunk columns (16 row segments).
__device__ __forceinline__ void prefetch_item(const GemmDesc& d, const void* Wv, int tile, int group, int lane) {
  if (lane >= 16) return;
  const int n = tile * 16 + lane;
  if (n >= d.N) return;
  const int k0 = group * d.cta * d.cps * 32;
  if (k0 >= d.K) return;
  const int k1 = min(d.K, k0 + d.cta * d.cps * 32);
  bulk_prefetch(static_cast<const __nv_bfloat16*>(Wv) + static_cast<int64_t>(n) * d.K + k0, (k1 - k0) * 2);
}

/// A quad's items of one GEMM prefetched (qid: the quad's global index, Q quads).
__device__ __forceinline__ void prefetch_gemm(const GemmDesc& d, const void* W, int qid, int Q, int lane) {
  for (int it = qid; it < d.tiles * d.groups; it += Q) prefetch_item(d, W, it / d.groups, it % d.groups, lane);
}

#define SSM_PD_MARK(k)                                                                       \
  if (p.timing && blockIdx.x == 0 && threadIdx.x == 0) p.timing[l * 9 + (k)] = clock64();

template <class TS>
__global__ void __launch_bounds__(kThreads, 1) persistent_kernel(const __grid_constant__ KParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float scratch[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = warp >> 2, qw = warp & 3;
  const int G = gridDim.x, Q = kQuads * G, WG = kWarps * G;
  const int qid = quad * G + blockIdx.x, wid = warp * G + blockIdx.x;
  const int M = p.M, H = p.H, I = p.I, N = p.N, R = p.R, XD = p.XD;
  auto* xn = reinterpret_cast<__nv_bfloat16*>(smem);                     // [M, H] normed rows
  auto* red = reinterpret_cast<float*>(smem + p.off_red) + quad * 512;   // [4 warps][4][32] of this quad
  auto* xcs = reinterpret_cast<__nv_bfloat16*>(smem + p.off_xcs) + quad * (M * p.gch);  // [M, gch]
  auto* bc = reinterpret_cast<float*>(smem + p.off_bc);                  // [M, 2N] B and C rows
  auto* dts = reinterpret_cast<float*>(smem + p.off_delta) + warp * 128;  // [8][16] delta tile of this warp
  auto* si = reinterpret_cast<int32_t*>(smem + p.off_si);                // [M] state indices
  if (tid < M) si[tid] = p.state_indices[tid];
  const int bar_id = 1 + quad;

  for (int l = 0; l < p.num_layers; ++l) {
    const Mamba1DecodeLayer& L = p.layers ? p.layers[l] : p.one;
    const bool has_prev = !(p.first_layer && l == 0);
    const auto* Win = static_cast<const __nv_bfloat16*>(L.in_proj);
    const auto* Wx = static_cast<const __nv_bfloat16*>(L.x_proj);
    const auto* Wdt = static_cast<const __nv_bfloat16*>(L.dt_proj);
    const auto* Wout = static_cast<const __nv_bfloat16*>(L.out_proj);
    SSM_PD_MARK(0)
    // 0. Prefetches that depend on nothing: this quad's in_proj slices (all modes but 0), the small GEMMs.
    const bool bulk = p.prefetch >= 1 && p.prefetch <= 3, line = p.prefetch >= 4;
    if (bulk && qw == 0 && (l == 0 || p.prefetch != 3)) prefetch_gemm(p.gin, Win, qid, Q, lane);
    if (line && (l == 0 || p.prefetch != 5) && qw < p.gin.cta) {
      // Line prefetches of this warp's in_proj split rows (prefetch.global.L2, as skinny_gemm's pre-wait one).
      const GemmDesc& d = p.gin;
      for (int it = qid; it < d.tiles * d.groups; it += Q) {
        const int tile = it / d.groups, split = (it % d.groups) * d.cta + qw;
        const int k0 = split * d.cps * 32, k1 = min(d.K, k0 + d.cps * 32);
        for (int r = 0; r < 16; ++r) {
          const int n = tile * 16 + r;
          if (n >= d.N) break;
          for (int k = k0 + lane * 64; k < k1; k += 32 * 64)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(Win + static_cast<int64_t>(n) * d.K + k));
        }
      }
    }
    if (bulk && qw == 1) {
      prefetch_gemm(p.gx, Wx, qid, Q, lane);
      for (int tile = wid; tile < p.gdt.tiles; tile += WG)
        if (lane == 0) bulk_prefetch(Wdt + static_cast<int64_t>(tile) * 16 * R,
                                     static_cast<size_t>(min(16, I - tile * 16)) * R * 2);
    }
    if (p.prefetch == 2 && qw == 2) prefetch_gemm(p.gout, Wout, qid, Q, lane);
    if (tid < M) si[tid] = p.state_indices[tid];
    // A. hidden + out (previous layer) -> RMSNorm -> xn (bf16), norm_rows_vec_kernel's order, every block.
    {
      const int H4 = H / 4;
      for (int m = 0; m < M; ++m) {
        const float4* res = reinterpret_cast<const float4*>(p.hidden + static_cast<int64_t>(m) * H);
        const float4* xr = reinterpret_cast<const float4*>(p.out + static_cast<int64_t>(m) * H);
        float4 v[kNormVec];
#pragma unroll
        for (int j = 0; j < kNormVec; ++j) {
          const int q = tid + j * kNormThreads;
          if (tid < kNormThreads && q < H4) {
            v[j] = __ldcg(res + q);
            if (has_prev) {
              const float4 a = __ldcg(xr + q);
              v[j].x += a.x, v[j].y += a.y, v[j].z += a.z, v[j].w += a.w;
            }
          }
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < kNormVec; ++j) {
          const int q = tid + j * kNormThreads;
          if (tid < kNormThreads && q < H4) {
            ss += v[j].x * v[j].x;
            ss += v[j].y * v[j].y;
            ss += v[j].z * v[j].z;
            ss += v[j].w * v[j].w;
          }
        }
        ss = block_sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + p.eps);
        __nv_bfloat16* o = xn + static_cast<int64_t>(m) * H;
#pragma unroll
        for (int j = 0; j < kNormVec; ++j) {
          const int q = tid + j * kNormThreads;
          if (tid < kNormThreads && q < H4) {
            const float4 wv = reinterpret_cast<const float4*>(L.norm)[q];
            o[4 * q + 0] = __float2bfloat16_rn(v[j].x * inv * wv.x);
            o[4 * q + 1] = __float2bfloat16_rn(v[j].y * inv * wv.y);
            o[4 * q + 2] = __float2bfloat16_rn(v[j].z * inv * wv.z);
            o[4 * q + 3] = __float2bfloat16_rn(v[j].w * inv * wv.w);
          }
        }
      }
      __syncthreads();
    }
    SSM_PD_MARK(1)
    //    in_proj: xz = xn W_in^T.
    {
      const GemmDesc& d = p.gin;
      for (int it = qid; it < d.tiles * d.groups; it += Q) {
        quad_item(
            d, Win, it / d.groups, it % d.groups, qw, lane, red, bar_id,
            [&](int k, bool on) {
              const int g = lane >> 2;
              return on && g < M ? *reinterpret_cast<const uint4*>(xn + static_cast<int64_t>(g) * H + k)
                                 : make_uint4(0, 0, 0, 0);
            },
            [&](const float (&acc)[4], int n0, int g, int t) {
#pragma unroll
              for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int m = 2 * t + e, n = n0 + g + 8 * h;
                  if (m < M && n < d.N) __stcg(p.xz + static_cast<int64_t>(m) * 2 * I + n, acc[2 * h + e]);
                }
            });
      }
    }
    SSM_PD_MARK(2)
    grid_barrier(p.bar);
    SSM_PD_MARK(3)
    // The residual write-back (every block has read hidden and out by now).
    if (has_prev && blockIdx.x == 0) {
      float4* res = reinterpret_cast<float4*>(p.hidden);
      const float4* xr = reinterpret_cast<const float4*>(p.out);
      for (int q = tid; q < M * H / 4; q += kThreads) {
        float4 v = __ldcg(res + q);
        const float4 a = __ldcg(xr + q);
        v.x += a.x, v.y += a.y, v.z += a.z, v.w += a.w;
        __stcg(res + q, v);
      }
    }
    if (p.prefetch == 1 || p.prefetch == 3)
      if (qw == 2) prefetch_gemm(p.gout, Wout, qid, Q, lane);
    if (line) prefetch_l2_grid(Wout, static_cast<size_t>(p.gout.N) * p.gout.K * 2);
    // B. conv outputs of the group's channels (shared memory, bf16) -> x_proj split sums -> xdbl, xdbl16.
    {
      const GemmDesc& d = p.gx;
      const TS* cst = static_cast<const TS*>(L.conv_states.data);
      for (int it = qid; it < d.tiles * d.groups; it += Q) {
        const int group = it % d.groups, gb = group * p.gch;
        named_bar(bar_id, 128);  // the previous item's reads of xcs are done
        constexpr int kB = 4;  // channels per thread in flight (their loads issued together)
        for (int base = qw * 32 + lane; base < M * p.gch; base += 128 * kB) {
          float v[kB];
#pragma unroll
          for (int u = 0; u < kB; ++u) {
            const int idx = base + u * 128;
            const int m = min(idx / p.gch, M - 1), c = gb + idx % p.gch;
            const int32_t block = si[m];
            v[u] = 0.0f;
            if (idx < M * p.gch && c < I && block != 0)
              v[u] = conv_out_channel(cst + static_cast<int64_t>(block) * L.conv_states.block_stride + c, I, p.W,
                                      L.conv_weight + static_cast<int64_t>(c) * p.W,
                                      L.conv_bias ? L.conv_bias[c] : 0.0f,
                                      __ldcg(p.xz + static_cast<int64_t>(m) * 2 * I + c));
          }
#pragma unroll
          for (int u = 0; u < kB; ++u)
            if (base + u * 128 < M * p.gch) xcs[base + u * 128] = __float2bfloat16_rn(v[u]);
        }
        named_bar(bar_id, 128);
        quad_item(
            d, Wx, it / d.groups, group, qw, lane, red, bar_id,
            [&](int k, bool on) {
              const int g = lane >> 2;
              return on && g < M ? *reinterpret_cast<const uint4*>(xcs + g * p.gch + (k - gb)) : make_uint4(0, 0, 0, 0);
            },
            [&](const float (&acc)[4], int n0, int g, int t) {
#pragma unroll
              for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int m = 2 * t + e, n = n0 + g + 8 * h;
                  if (m < M && n < d.N) {
                    __stcg(p.xdbl + m * XD + n, acc[2 * h + e]);
                    p.xdbl16[m * XD + n] = __float2bfloat16_rn(acc[2 * h + e]);
                  }
                }
            });
      }
    }
    SSM_PD_MARK(4)
    grid_barrier(p.bar);
    SSM_PD_MARK(5)
    if (p.prefetch == 3 && l + 1 < p.num_layers && qw == 3)
      prefetch_gemm(p.gin, p.layers[l + 1].in_proj, qid, Q, lane);
    // C. dt_proj (one split) + softplus + conv state shift + selective state update + D skip + SiLU(z) gate.
    for (int idx = tid; idx < M * 2 * N; idx += kThreads) {
      const int m = idx / (2 * N), j = idx % (2 * N);
      bc[idx] = __ldcg(p.xdbl + m * XD + R + j);
    }
    __syncthreads();
    {
      TS* cst = static_cast<TS*>(L.conv_states.data);
      TS* sst = static_cast<TS*>(L.ssm_states.data);
      const int g = lane >> 2, t = lane & 3, lanes = p.lanes, gl = lane % lanes, grp = lane / lanes;
      const int per = 32 / lanes;                 // channels per warp step (one per lane group)
      const int subs = (16 + per - 1) / per;      // warp tasks per 16-channel tile
      const int chunks = (R + 31) / 32;
      // Task (tile, sub): the tile's dt_proj mma (recomputed by each of its tasks: 16 x R weights from L2), then
      // channels n0 + sub * per + group for every row: all (row, channel) pairs in flight at once across the grid.
      for (int task = wid; task < p.gdt.tiles * subs; task += WG) {
        const int tile = task / subs, sub = task % subs;
        const int n0 = tile * 16;
        const bool r0ok = n0 + g < I, r1ok = n0 + g + 8 < I, xok = g < M;
        const __nv_bfloat16* w0 = Wdt + static_cast<int64_t>(r0ok ? n0 + g : 0) * R;
        const __nv_bfloat16* w1 = Wdt + static_cast<int64_t>(r1ok ? n0 + g + 8 : 0) * R;
        const __nv_bfloat16* xr = p.xdbl16 + (xok ? g : 0) * XD;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c = 0; c < chunks; c += 4) {
          uint4 a0[4], a1[4], b[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int k = (c + u) * 32 + 8 * t;
            const bool on = c + u < chunks && k < R;
            a0[u] = load8<true, true>(w0, k, R, on && r0ok);
            a1[u] = load8<true, true>(w1, k, R, on && r1ok);
            b[u] = on && xok ? ldcg16(xr + k) : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (c + u < chunks) mma_chunk(acc, a0[u], a1[u], b[u]);
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) dts[(2 * t + e) * 16 + g + 8 * h] = acc[2 * h + e];
        __syncwarp();
        const int cl = sub * per + grp;
        const int c = n0 + cl;
        for (int mi = 0; mi < M; ++mi) {  // warp-uniform: every lane reaches the shuffles
          const int32_t block = si[mi];
          const bool on = cl < 16 && c < I && block != 0;
          const int64_t cc = on ? c : 0;
          float u = 0.0f;
          if (on && gl == 0)
            u = conv_update_channel(cst + static_cast<int64_t>(block) * L.conv_states.block_stride + cc, I, p.W,
                                    L.conv_weight + cc * p.W, L.conv_bias ? L.conv_bias[cc] : 0.0f,
                                    __ldcg(p.xz + static_cast<int64_t>(mi) * 2 * I + cc), true);
          u = __shfl_sync(0xffffffffu, u, 0, lanes);
          float dt = dts[mi * 16 + (on ? cl : 0)] + L.dt_bias[cc];
          dt = softplus(dt);
          TS* state = sst + (on ? block : 0) * L.ssm_states.block_stride + cc * N;
          const float a = scan_update_channel(state, L.A + cc * N, bc + mi * 2 * N, bc + mi * 2 * N + N, N, dt, u, gl,
                                              lanes, on);
          if (on && gl == 0) {
            float outv = a + (L.D ? L.D[cc] : 0.0f) * u;
            outv *= silu(__ldcg(p.xz + static_cast<int64_t>(mi) * 2 * I + I + cc));
            p.y16[static_cast<int64_t>(mi) * I + cc] = __float2bfloat16_rn(outv);
          }
        }
      }
    }
    SSM_PD_MARK(6)
    grid_barrier(p.bar);
    SSM_PD_MARK(7)
    if (p.prefetch == 5 && l + 1 < p.num_layers)  // the next layer's in_proj head while out_proj runs from L2
      prefetch_l2_grid(p.layers[l + 1].in_proj, min(static_cast<size_t>(p.gin.N) * p.gin.K * 2, size_t{20} << 20));
    // D. out_proj: out = y W_out^T.
    {
      const GemmDesc& d = p.gout;
      for (int it = qid; it < d.tiles * d.groups; it += Q) {
        quad_item(
            d, Wout, it / d.groups, it % d.groups, qw, lane, red, bar_id,
            [&](int k, bool on) {
              const int g = lane >> 2;
              return on && g < M ? ldcg16(p.y16 + static_cast<int64_t>(g) * I + k) : make_uint4(0, 0, 0, 0);
            },
            [&](const float (&acc)[4], int n0, int g, int t) {
#pragma unroll
              for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int m = 2 * t + e, n = n0 + g + 8 * h;
                  if (m < M && n < d.N) __stcg(p.out + static_cast<int64_t>(m) * H + n, acc[2 * h + e]);
                }
            });
      }
    }
    SSM_PD_MARK(8)
    if (l + 1 < p.num_layers) grid_barrier(p.bar);
  }
}

GemmDesc desc(int64_t N, int64_t K) {
  const SkinnyTuning tu = skinny_default_tuning(1, N, K);
  GemmDesc d{};
  d.N = static_cast<int>(N), d.K = static_cast<int>(K);
  d.chunks = static_cast<int>((K + 31) / 32);
  d.splits = skinny_gemm_splits(N, K, tu.split_shift);
  d.cps = (d.chunks + d.splits - 1) / d.splits;
  const int c = tu.cta_splits >= 16 ? 16 : tu.cta_splits >= 8 ? 8 : 4;
  d.cta = std::min(d.splits, c);
  d.groups = d.splits / d.cta;
  d.tiles = static_cast<int>((N + 15) / 16);
  return d;
}

struct Layout {
  GemmDesc gin, gx, gdt, gout;
  int gch, lanes;
  size_t off_red, off_xcs, off_bc, off_delta, off_si, smem;
  size_t ws_bar, ws_in_p, ws_in_c, ws_x_p, ws_x_c, ws_out_p, ws_out_c, ws_bytes;
};

Layout layout(const Mamba1DecodeShape& s, int64_t M) {
  Layout L{};
  const int64_t XD = s.R + 2 * s.N;
  L.gin = desc(2 * s.I, s.H), L.gx = desc(XD, s.I), L.gdt = desc(s.I, s.R), L.gout = desc(s.H, s.I);
  L.gch = L.gx.cta * L.gx.cps * 32;
  int lanes = 1;
  while (lanes < s.N && lanes < 32) lanes *= 2;
  L.lanes = lanes;
  auto up = [](size_t v) { return (v + 15) & ~size_t{15}; };
  size_t o = up(static_cast<size_t>(M * s.H * 2));
  L.off_red = o, o += up(kQuads * 512 * 4);
  L.off_xcs = o, o += up(static_cast<size_t>(kQuads) * M * L.gch * 2);
  L.off_bc = o, o += up(static_cast<size_t>(M * 2 * s.N * 4));
  L.off_delta = o, o += up(kWarps * 128 * 4);
  L.off_si = o, o += up(kPersistentMaxRows * 4);
  L.smem = o;
  size_t w = 0;
  auto part = [&](const GemmDesc& d, size_t& pp, size_t& cc) {
    pp = w, w += d.groups > 1 ? up(static_cast<size_t>(d.tiles) * d.groups * 128 * 4) : 0;
    cc = w, w += d.groups > 1 ? up(static_cast<size_t>(d.tiles) * 4) : 0;
  };
  L.ws_bar = 0, w = 128;
  part(L.gin, L.ws_in_p, L.ws_in_c);
  part(L.gx, L.ws_x_p, L.ws_x_c);
  part(L.gout, L.ws_out_p, L.ws_out_c);
  L.ws_bytes = w;
  return L;
}


}  // namespace

bool mamba1_persistent_supported(const Mamba1DecodeShape& s, int64_t M, DType state_dtype) {
  if (M < 1 || M > kPersistentMaxRows || s.H < 8 || s.H % 8 != 0 || s.H > 4 * kNormVec * kNormThreads || s.I < 8 ||
      s.I % 8 != 0 || s.R < 8 || s.R % 8 != 0 || (s.R + 2 * s.N) % 8 != 0 || s.N < 1 ||
      s.N > 32 * kScanMaxPerLane || s.W < 1 || s.W > kConvMaxWidth || s.I > (1 << 24) || s.H > (1 << 24) ||
      (state_dtype != DType::F32 && state_dtype != DType::BF16))
    return false;
  const Layout L = layout(s, M);
  return L.gdt.splits == 1 && L.smem <= 200 * 1024;
}

size_t mamba1_persistent_workspace(const Mamba1DecodeShape& s) { return layout(s, kPersistentMaxRows).ws_bytes; }

cudaError_t mamba1_persistent_decode(const Mamba1DecodeShape& s, const Mamba1DecodeLayer* layers_dev,
                                     const Mamba1DecodeLayer& layer, int num_layers, bool first_layer, int M,
                                     const Mamba1DecodeBuffers& buf, const Mamba1PersistentOptions& opt,
                                     cudaStream_t stream) {
  const DType sd = layer.ssm_states.dtype;
  if (!mamba1_persistent_supported(s, M, sd) || layer.conv_states.dtype != sd || num_layers < 1 ||
      (!layers_dev && num_layers != 1) || !buf.hidden || !buf.out || !buf.xz || !buf.xdbl || !buf.xdbl16 ||
      !buf.y16 || !buf.state_indices || !buf.workspace || buf.workspace_bytes < mamba1_persistent_workspace(s) ||
      opt.prefetch < 0 || opt.prefetch > 5)
    return cudaErrorInvalidValue;
  const Layout L = layout(s, M);
  KParams p{};
  p.H = static_cast<int>(s.H), p.I = static_cast<int>(s.I), p.N = static_cast<int>(s.N), p.R = static_cast<int>(s.R);
  p.W = static_cast<int>(s.W), p.XD = static_cast<int>(s.R + 2 * s.N), p.M = M, p.lanes = L.lanes, p.eps = s.eps;
  p.gin = L.gin, p.gx = L.gx, p.gdt = L.gdt, p.gout = L.gout;
  auto* ws = static_cast<unsigned char*>(buf.workspace);
  p.gin.partials = reinterpret_cast<float*>(ws + L.ws_in_p), p.gin.counters = reinterpret_cast<unsigned*>(ws + L.ws_in_c);
  p.gx.partials = reinterpret_cast<float*>(ws + L.ws_x_p), p.gx.counters = reinterpret_cast<unsigned*>(ws + L.ws_x_c);
  p.gout.partials = reinterpret_cast<float*>(ws + L.ws_out_p);
  p.gout.counters = reinterpret_cast<unsigned*>(ws + L.ws_out_c);
  p.hidden = buf.hidden, p.out = buf.out, p.xz = buf.xz, p.xdbl = buf.xdbl;
  p.xdbl16 = static_cast<__nv_bfloat16*>(buf.xdbl16), p.y16 = static_cast<__nv_bfloat16*>(buf.y16);
  p.state_indices = buf.state_indices;
  p.bar = reinterpret_cast<unsigned*>(ws + L.ws_bar);
  p.layers = layers_dev, p.one = layer, p.num_layers = num_layers, p.first_layer = first_layer;
  p.prefetch = opt.prefetch, p.gch = L.gch, p.timing = opt.timing;
  p.off_red = static_cast<int>(L.off_red), p.off_xcs = static_cast<int>(L.off_xcs), p.off_bc = static_cast<int>(L.off_bc);
  p.off_delta = static_cast<int>(L.off_delta), p.off_si = static_cast<int>(L.off_si);
  auto go = [&](auto kernel) { return cooperative_launch_per_sm(kernel, kThreads, L.smem, stream, p); };
  if (sd == DType::BF16) return go(persistent_kernel<__nv_bfloat16>);
  return go(persistent_kernel<float>);
}

}  // namespace ssmserve::cuda
