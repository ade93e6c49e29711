// Owns the one-launch sparse MoE of a one-token decode step (KernelTuning::moe_decode_fused; moe.h MoeFusedRouter,
// moe_parts.h moe_decode_fused): the fp32 router GEMV, the routing, the per-pair up GEMV and, when the combine adds no
// shared-expert rows, the down GEMV with the weighted combine, in one persistent launch whose phases are separated by
// two grid-wide barriers instead of four kernel boundaries (router -> route -> up -> down + combine).
//
// Each phase computes what the launch it replaces computes, with the same per-output arithmetic, so the same bits:
//   router:  one warp per expert row, f32_dot_column<1> (skinny_gemm_f32's f32_gemv_kernel, with its pre-wait preload);
//   route:   route_token (moe_route.cu's route_kernel), run by every block on its own copy of the logits;
//   up:      per output row, lane l sums chunks k = 8 l + 256 j (j ascending, 8 products in ascending i) of bf16(x) and
//            the expert's gate (and up) row, then warp_sum, then act = bf16(silu(g) * u) or bf16(relu(g)^2)
//            (pair_gemv_kernel / moe_pair_load.cuh);
//   down:    the same chunk sums of the act row and w2's row, y per slot, then o += y * w over the slots in ascending
//            expert id (ties: slot order) (down_combine_kernel / combine_kernel).
// Only the assignment of rows to warps differs, and no output's sum depends on it.
//
// Grid: one block of kThreads per SM, all co-resident (a plain launch, with PDL when asked: the grid is one wave, so
// every block is eventually resident while earlier kernels drain; the barriers spin on L2 counters). The counters
// (sync[0..2]) are zero between launches: the last block out resets them.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cooperative_launch.cuh"
#include "kernels/cuda/f32_gemv.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_pair_load.cuh"
#include "kernels/cuda/moe_parts.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 16, kThreads = 32 * kWarps;
/// Chunks (16 bytes per lane per weight matrix) of one load group for M weight matrices per output: two groups in
/// flight per warp, 16 loads per lane.
template <int M>
constexpr int kGroup = 8 / M;
/// Shared-memory bounds: x as bf16 (hidden <= 8192) and the act rows (top_k * I * 2 bytes).
constexpr int64_t kMaxHidden = 8192, kMaxActBytes = 40 * 1024;

struct FusedArgs {
  const float* x;     ///< [hidden] fp32, the normed row
  const float* wg;    ///< [E, hidden] fp32 router weight
  float* logits;      ///< [E] fp32
  int32_t* ids;       ///< [top_k]
  float* wts;         ///< [top_k]
  int32_t* pair_row;  ///< [top_k]
  bf16* act;          ///< [top_k, I]
  const bf16* w1;     ///< [E, I, hidden]
  const bf16* w3;     ///< [E, I, hidden] or null (relu^2 experts)
  const bf16* w2;     ///< [E, hidden, I]
  int64_t H, I;
  int E, top_k;
  MoeRouteParams r;
  float* out;         ///< [hidden] fp32, or null: stop after the up GEMV
  unsigned* sync;     ///< [3] barrier and exit counters, zero between launches
};

__device__ __forceinline__ unsigned load_acquire_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// Every block of the grid arrives at `count`, then waits for the others (all blocks co-resident).
__device__ __forceinline__ void grid_barrier(unsigned* count) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count, 1u);
    while (load_acquire_u32(count) < gridDim.x) {
    }
    __threadfence();
  }
  __syncthreads();
}

/// One warp's GEMV rows [r0, r1) of a flattened list: row q reads matrix rows wa(q) (and wb(q) when M == 2) against the
/// bf16 input in(q) (shared memory), K wide, nj = ceil(K / 256) chunks per lane (lanes past K add nothing), and hands
/// each row's warp sums to done(q, g, u). Two groups of kGroup<M> chunks in flight: the next group (possibly of the next
/// row) loads while the current one is summed. Per row the sums are pair_fma_group's (chunks in ascending j). The load
/// and sum cursors step (row, chunk) by increments: the row pointers are computed once per row.
template <int M, class RowA, class RowB, class In, class Done>
__device__ __forceinline__ void stream_rows(int r0, int r1, int K, RowA wa, RowB wb, In in, Done done) {
  if (r1 <= r0) return;
  constexpr int G = kGroup<M>;
  const int lane = threadIdx.x & 31, nj = (K + 255) / 256;
  int lq = r0, lj = 0;  // the next chunk to load
  const bf16* la = wa(r0) + lane * 8;
  const bf16* lb = M == 2 ? wb(r0) + lane * 8 : la;
  auto load = [&](uint4(&va)[G], uint4(&vb)[G]) {
#pragma unroll
    for (int s = 0; s < G; ++s) {
      if (lq >= r1) break;
      if (lane * 8 + 256 * lj < K) {
        va[s] = load_stream8(la + 256 * lj);
        if constexpr (M == 2) vb[s] = load_stream8(lb + 256 * lj);
      }
      if (++lj == nj) {
        lj = 0;
        if (++lq < r1) {
          la = wa(lq) + lane * 8;
          if constexpr (M == 2) lb = wb(lq) + lane * 8;
        }
      }
    }
  };
  int sq = r0, sj = 0;  // the next chunk to sum
  const bf16* xin = in(r0) + lane * 8;
  float g = 0.0f, u = 0.0f;
  auto sum = [&](const uint4(&va)[G], const uint4(&vb)[G]) {
#pragma unroll
    for (int s = 0; s < G; ++s) {
      if (sq >= r1) break;
      if (lane * 8 + 256 * sj < K) {
        const uint4 xv = *reinterpret_cast<const uint4*>(xin + 256 * sj);
        const bf16* xe = reinterpret_cast<const bf16*>(&xv);
        const bf16* ae = reinterpret_cast<const bf16*>(&va[s]);
#pragma unroll
        for (int i = 0; i < 8; ++i) g += __bfloat162float(xe[i]) * __bfloat162float(ae[i]);
        if constexpr (M == 2) {
          const bf16* be = reinterpret_cast<const bf16*>(&vb[s]);
#pragma unroll
          for (int i = 0; i < 8; ++i) u += __bfloat162float(xe[i]) * __bfloat162float(be[i]);
        }
      }
      if (++sj == nj) {  // the row's last chunk (warp-uniform)
        const float gs = warp_sum(g);
        const float us = M == 2 ? warp_sum(u) : 0.0f;
        done(sq, gs, us);
        g = 0.0f, u = 0.0f, sj = 0;
        if (++sq < r1) xin = in(sq) + lane * 8;
      }
    }
  };
  uint4 a0[G], b0[G], a1[G], b1[G];
  load(a0, b0);
  for (;;) {
    load(a1, b1);
    sum(a0, b0);
    if (sq >= r1) break;
    load(a0, b0);
    sum(a1, b1);
    if (sq >= r1) break;
  }
}

/// This warp's share [r0, r1) of n rows spread over every warp of the grid (contiguous ranges, sizes differing by at
/// most one).
__device__ __forceinline__ void warp_share(int n, int& r0, int& r1) {
  const int warps = static_cast<int>(gridDim.x) * kWarps, w = static_cast<int>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int base = n / warps, extra = n % warps;
  r0 = w * base + (w < extra ? w : extra);
  r1 = r0 + base + (w < extra ? 1 : 0);
}

/// PER: experts per lane of the routing warp (E <= 32 * PER); GATED: SiLU-gated experts (else relu^2).
template <int PER, bool GATED>
__global__ void __launch_bounds__(kThreads, 1) moe_decode_fused_kernel(FusedArgs a) {
  extern __shared__ __align__(16) unsigned char fused_smem[];
  bf16* x_s = reinterpret_cast<bf16*>(fused_smem);        // [H] bf16(x)
  bf16* act_s = x_s + ((a.H + 7) / 8) * 8;                  // [top_k, I] the act rows (down phase)
  __shared__ float l_s[32 * PER], choice_s[32 * PER];
  __shared__ int32_t ids_s[kMoeMaxTopK];
  __shared__ float wts_s[kMoeMaxTopK];
  __shared__ int ord_s[kMoeMaxTopK];
  __shared__ float y_s[kWarps][kMoeMaxTopK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + warp, H = a.H;
  const int k = a.top_k, Hi = static_cast<int>(a.H), I = static_cast<int>(a.I);

  // 1. Router: warp gw computes logits[gw] (its weight row's first chunks loaded before the PDL wait).
  float4 pre[kF32GemvPreChunks];
  const bool router = gw < a.E;
  if (router) f32_column_preload(a.wg + gw * H, H, pre);
  pdl_wait();  // x comes from the norm
  if (router) {
    float acc[1];
    f32_dot_column<1>(a.x, H, a.wg + gw * H, H, acc, &pre);
    if (lane == 0) a.logits[gw] = acc[0];
  }
  for (int64_t c = threadIdx.x * 8; c < H; c += kThreads * 8) {  // bf16(x), the up GEMV's input (pair_gemv_kernel's)
    const float4 x0 = *reinterpret_cast<const float4*>(a.x + c), x1 = *reinterpret_cast<const float4*>(a.x + c + 4);
    __align__(16) bf16 h[8] = {__float2bfloat16_rn(x0.x), __float2bfloat16_rn(x0.y), __float2bfloat16_rn(x0.z),
                               __float2bfloat16_rn(x0.w), __float2bfloat16_rn(x1.x), __float2bfloat16_rn(x1.y),
                               __float2bfloat16_rn(x1.z), __float2bfloat16_rn(x1.w)};
    *reinterpret_cast<uint4*>(x_s + c) = *reinterpret_cast<const uint4*>(h);
  }
  grid_barrier(a.sync + 0);

  // 2. Route, in every block (block 0 also writes ids / wts for the launches after this one).
  if (warp == 0) {
    for (int e = lane; e < a.E; e += 32) l_s[e] = __ldcg(a.logits + e);
    __syncwarp();
    route_token<PER>(l_s, a.E, k, a.r, ids_s, wts_s, choice_s);
    __syncwarp();
    if (blockIdx.x == 0 && lane < k) a.ids[lane] = ids_s[lane], a.wts[lane] = wts_s[lane], a.pair_row[lane] = lane;
    if (lane == 0) {  // combine_kernel's order: insertion sort of the slots by expert id
      for (int s = 0; s < k; ++s) ord_s[s] = s;
      for (int i = 1; i < k; ++i)
        for (int b = i; b > 0 && ids_s[ord_s[b]] < ids_s[ord_s[b - 1]]; --b) {
          const int t = ord_s[b];
          ord_s[b] = ord_s[b - 1];
          ord_s[b - 1] = t;
        }
    }
    if (blockIdx.x == 0) __threadfence();  // ids / wts at the L2 before this block lets dependents launch
  }
  __syncthreads();
  pdl_launch_dependents();  // after the routing: a dependent may read ids / wts before its own wait

  // 3. Up: rows q = slot * I + n of act.
  {
    int r0, r1;
    warp_share(k * I, r0, r1);
    auto wa = [&](int q) { return a.w1 + (static_cast<int64_t>(ids_s[q / I]) * I + q % I) * H; };
    auto wb = [&](int q) { return a.w3 + (static_cast<int64_t>(ids_s[q / I]) * I + q % I) * H; };
    auto in = [&](int) -> const bf16* { return x_s; };
    auto done = [&](int q, float g, float u) {
      if (lane == 0) a.act[q] = __float2bfloat16_rn(GATED ? silu(g) * u : (g > 0.0f ? g * g : 0.0f));
    };
    stream_rows<GATED ? 2 : 1>(r0, r1, Hi, wa, wb, in, done);
  }
  if (a.out) {  // else the down GEMV and the combine follow as launches of their own
    grid_barrier(a.sync + 1);
    // 4. Down and combine: rows q = n * top_k + slot, whole outputs n per warp; a row's last slot writes out[n].
    for (int64_t c = threadIdx.x * 8; c < k * I; c += kThreads * 8)
      *reinterpret_cast<uint4*>(act_s + c) = __ldcg(reinterpret_cast<const uint4*>(a.act + c));
    __syncthreads();
    int n0, n1;
    warp_share(Hi, n0, n1);
    auto wa = [&](int q) { return a.w2 + (static_cast<int64_t>(ids_s[q % k]) * H + q / k) * I; };
    auto in = [&](int q) -> const bf16* { return act_s + (q % k) * I; };
    auto done = [&](int q, float y, float) {
      const int slot = q % k;
      if (lane != 0) return;
      y_s[warp][slot] = y;
      if (slot != k - 1) return;
      float o = 0.0f;
      for (int s = 0; s < k; ++s) {
        const int sl = ord_s[s];
        o += y_s[warp][sl] * wts_s[sl];  // combine_kernel's expression
      }
      a.out[q / k] = o;
    };
    stream_rows<1>(n0 * k, n1 * k, I, wa, wa, in, done);
  }
  // The last block out resets the counters for the next launch (every block has passed its barriers by then).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.sync + 2, 1u) == gridDim.x - 1) {
      a.sync[0] = 0, a.sync[1] = 0, a.sync[2] = 0;
      __threadfence();
    }
  }
}

template <int PER>
cudaError_t launch_fused(const FusedArgs& a, bool pdl, cudaStream_t stream) {
  const auto kernel = a.w3 ? moe_decode_fused_kernel<PER, true> : moe_decode_fused_kernel<PER, false>;
  const size_t smem = static_cast<size_t>(((a.H + 7) / 8) * 8 * 2 + (a.out ? a.top_k * a.I * 2 : 0));
  int per_sm = 0;
  if (const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem); e != cudaSuccess)
    return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  return launch_pdl(pdl, kernel, dim3(static_cast<unsigned>(sm_count())), dim3(kThreads), smem, stream, a);
}

}  // namespace

bool moe_decode_fused_serves(int64_t T, const MoeDevWeights& w) {
  return kernel_tuning().moe_decode_fused && T == 1 && !w.f32 && !w.per_pair && w.num_experts >= 1 &&
         w.num_experts <= kMoeMaxExperts && w.top_k >= 1 && w.top_k <= kMoeMaxTopK && w.top_k <= w.num_experts &&
         w.hidden >= 8 && w.hidden <= kMaxHidden && w.hidden % 8 == 0 && w.intermediate >= 8 && w.intermediate % 8 == 0 &&
         w.top_k * w.intermediate * 2 <= kMaxActBytes && sm_count() > 0 &&
         static_cast<int64_t>(sm_count()) * kWarps >= w.num_experts;
}

namespace detail {

cudaError_t moe_decode_fused(const float* x, const float* router_w, float* logits, int32_t* ids, float* wts,
                             int32_t* pair_row, __nv_bfloat16* act, const MoeDevWeights& w, float* out, unsigned* sync, cudaStream_t stream,
                             bool pdl) {
  const auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!moe_decode_fused_serves(1, w) || !x || !router_w || !logits || !ids || !wts || !pair_row || !act || !sync || !al16(x) ||
      !al16(router_w) || !al16(act) || !al16(w.w1) || !al16(w.w2) || (w.w3 && !al16(w.w3)))
    return cudaErrorInvalidValue;
  const FusedArgs a{x, router_w, logits, ids, wts, pair_row, act, static_cast<const bf16*>(w.w1), static_cast<const bf16*>(w.w3),
                    static_cast<const bf16*>(w.w2), w.hidden, w.intermediate, w.num_experts, w.top_k, w.routing, out, sync};
  if (w.num_experts <= 64) return launch_fused<2>(a, pdl, stream);
  if (w.num_experts <= 128) return launch_fused<4>(a, pdl, stream);
  if (w.num_experts <= 256) return launch_fused<8>(a, pdl, stream);
  return launch_fused<16>(a, pdl, stream);
}

}  // namespace detail
}  // namespace ssmserve::cuda
