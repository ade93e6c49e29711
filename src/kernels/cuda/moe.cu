// Owns the GPU sparse MoE (see moe.h): per-pair GEMVs or grouped GEMMs (moe_grouped_gemm.h) between the sort by
// expert and the combine (moe_parts.cu); the router is moe_route.cu.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cooperative_launch.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_pair_load.cuh"
#include "kernels/cuda/moe_parts.h"
#include "kernels/cuda/pdl.cuh"

#include <algorithm>

namespace ssmserve::cuda {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

constexpr int kMaxE = 1024, kMaxRouteE = kMoeMaxExperts, kMaxTopK = kMoeMaxTopK;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/// Workspace layout (byte offsets).
struct MoeLayout {
  size_t ids, wts, offsets, sorted, pair_row, xg, act, y, u, counts, total;
  MoeLayout(int64_t T, const MoeDevWeights& w) {
    const size_t P = static_cast<size_t>(T) * w.top_k;
    ids = 0;
    wts = align256(ids + P * 4);
    offsets = align256(wts + P * 4);
    sorted = align256(offsets + (w.num_experts + 1) * 4);
    pair_row = align256(sorted + P * 4);
    xg = align256(pair_row + P * 4);
    act = align256(xg + (w.f32 ? 0 : P * w.hidden * 2));  // fp32 experts read x directly
    y = align256(act + P * w.intermediate * (w.f32 ? 4 : 2));
    u = align256(y + P * w.hidden * 4);
    counts = align256(u + (w.w3 || w.f32 ? 0 : P * w.intermediate * 4));
    total = align256(counts + moe_sort_counts_bytes(static_cast<int64_t>(P), w.num_experts));
  }
};

/// Small batches (T * top_k <= kSmallPairs, decode): per (token, slot) pair GEMVs, one warp per output element,
/// 16-byte loads of the weight rows (the weights are read once per pair instead of in 64-row tiles, so a decode
/// step costs the bytes of its experts instead of a latency-bound tile loop). Same rounding as the grouped
/// kernels (x and the activations as bf16, fp32 accumulation).
constexpr int kSmallPairs = 16;
/// KernelTuning::moe_pair_sorted's bound: the per-pair GEMVs on sorted rows up to this many pairs per expert (the
/// H200 sweep's crossover with the grouped GEMMs: ~3 per expert at Nemotron-3-Nano's and Granite-4.0-H-Tiny's shapes,
/// above 2 at Qwen3.5-35B-A3B's).
constexpr int64_t kPairSortedPerExpert = 2;

/// Grid (ceil(I / 8), min(P, 65535)), 8 warps; row r of [0, P) is pair p = sorted[r] (pairs in expert order, so
/// consecutive blocks share an expert's weights in L2), or p = r without `sorted` (then pair_row[p] = p is written
/// here); t = p / top_k, e = ids[p]: act[r, n] = bf16(silu(x_t . w1[e, n]) * (x_t . w3[e, n])) (relu^2 experts, w3
/// null: bf16(relu(x_t . w1[e, n])^2)). A pair's arithmetic does not depend on P or the order.
__global__ void __launch_bounds__(256) small_up_kernel(const float* __restrict__ x, int64_t xs,
                                                       const int32_t* __restrict__ ids, const int32_t* __restrict__ sorted,
                                                       int64_t P, int top_k, const bf16* __restrict__ w1,
                                                       const bf16* __restrict__ w3, int64_t I, int64_t K,
                                                       bf16* __restrict__ act, int32_t* __restrict__ pair_row) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (n >= I) return;  // whole warps: the butterfly below has all 32 lanes
  for (int64_t r = blockIdx.y; r < P; r += gridDim.y) {
    const int64_t p = sorted ? sorted[r] : r;
    if (!sorted && n == 0 && lane == 0) pair_row[p] = static_cast<int32_t>(p);
    const int64_t e = ids[p];
    const float* xr = x + (p / top_k) * xs;
    const bf16* a = w1 + (e * I + n) * K;
    const bf16* b = w3 ? w3 + (e * I + n) * K : a;  // relu^2 experts: no up, u unused
    float g = 0.0f, u = 0.0f;
    for (int64_t k = lane * 8; k < K; k += 32 * 8) {
      const float4 x0 = *reinterpret_cast<const float4*>(xr + k), x1 = *reinterpret_cast<const float4*>(xr + k + 4);
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const uint4 av = *reinterpret_cast<const uint4*>(a + k), bv = *reinterpret_cast<const uint4*>(b + k);
      const bf16* ae = reinterpret_cast<const bf16*>(&av);
      const bf16* be = reinterpret_cast<const bf16*>(&bv);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float xi = __bfloat162float(__float2bfloat16_rn(xv[i]));
        g += xi * __bfloat162float(ae[i]);
        u += xi * __bfloat162float(be[i]);
      }
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) act[r * I + n] = __float2bfloat16_rn(w3 ? silu(g) * u : (g > 0.0f ? g * g : 0.0f));
  }
}

/// Grid (ceil(hidden / 8), min(P, 65535)), 8 warps, rows as small_up_kernel: y[r, n] = act[r] . w2[e, n].
__global__ void __launch_bounds__(256) small_down_kernel(const bf16* __restrict__ act, const int32_t* __restrict__ ids,
                                                         const int32_t* __restrict__ sorted, int64_t P,
                                                         const bf16* __restrict__ w2, int64_t N, int64_t K,
                                                         float* __restrict__ y) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (n >= N) return;
  for (int64_t r = blockIdx.y; r < P; r += gridDim.y) {
    const int64_t e = ids[sorted ? sorted[r] : r];
    const bf16* a = act + r * K;
    const bf16* w = w2 + (e * N + n) * K;
    float acc = 0.0f;
    for (int64_t k = lane * 8; k < K; k += 32 * 8) {
      const uint4 av = *reinterpret_cast<const uint4*>(a + k), wv = *reinterpret_cast<const uint4*>(w + k);
      const bf16* ae = reinterpret_cast<const bf16*>(&av);
      const bf16* we = reinterpret_cast<const bf16*>(&wv);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += __bfloat162float(ae[i]) * __bfloat162float(we[i]);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[r * N + n] = acc;
  }
}

/// The per-pair GEMVs of KernelTuning::moe_pair_gemv: the arithmetic of small_up_kernel / small_down_kernel (so the
/// same bits), more work per warp. Each warp computes R consecutive output rows of one pair with every row's 16-byte
/// weight loads of U consecutive k chunks issued together (R * U * mats loads per lane in flight); the block stages
/// the pair's input row once in shared memory as bf16 (up: bf16(x_t), the value the old kernel rounds per row; down:
/// act[r]) instead of every warp re-reading it per row. Per output: each lane sums k = lane * 8 + 256 j (j ascending,
/// 8 products in ascending i per chunk; lanes past K add nothing), then warp_sum, then the same epilogue.
enum class PairMode { kUpRelu2, kUpGated, kDown };

struct PairGemvArgs {
  const float* x;        ///< up: x [T, K] fp32, row stride xs
  int64_t xs;
  const bf16* act_in;    ///< down: act [P, K] bf16
  const int32_t* ids;    ///< [P] expert of each pair
  const int32_t* sorted; ///< row r -> pair (null: row r is pair r)
  int64_t P;
  int top_k;
  const bf16* wa;        ///< up: w1 [E, N, K]; down: w2 [E, N, K]
  const bf16* wb;        ///< up, gated: w3 [E, N, K]
  int64_t N, K;          ///< output rows per pair (up: I, down: hidden), reduction width (multiple of 8)
  bf16* act_out;         ///< up: act [P, N] bf16
  float* y;              ///< down: y [P, N] fp32
  int32_t* pair_row;     ///< up without `sorted`: pair_row[p] = p
  /// ids / sorted were written at least two launches before this one (down: by the router / the sort, before up), so
  /// the block may read them, and load its first weight chunks, before its PDL wait (KernelTuning::moe_pair_preload).
  bool preload = false;
};

/// Grid (ceil(ceil(N / R) / warps), min(P, 65535)), blockDim.x = 32 * warps (4 or 8), dynamic shared memory K * 2
/// bytes. Warp w of block (bx, by) computes rows n = (bx * warps + w) * R + [0, R) (those < N) of the pair rows
/// r = by, + gridDim.y, ... (r -> p as small_up_kernel).
template <int R, PairMode MODE>
__global__ void __launch_bounds__(256) pair_gemv_kernel(PairGemvArgs a) {
  constexpr int M = MODE == PairMode::kUpGated ? 2 : 1;  // weight matrices per output
  constexpr int U = pair_unroll(R, M);
  extern __shared__ __align__(16) unsigned char pair_smem[];
  bf16* in_s = reinterpret_cast<bf16*>(pair_smem);
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  const int64_t K = a.K, N = a.N;
  const int nj = lane * 8 < K ? static_cast<int>((K - lane * 8 + 255) / 256) : 0;  // this lane's chunks
  const bool active = n0 < N;  // whole warps: the butterfly below has all 32 lanes
  // This warp's weight rows of pair row r (past N: the warp's first row again, loaded but never stored).
  const bf16* wa[R];
  const bf16* wb[R];
  auto rows_of = [&](int64_t e) {
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t n = n0 + q < N ? n0 + q : n0;
      wa[q] = a.wa + (e * N + n) * K + lane * 8;
      wb[q] = MODE == PairMode::kUpGated ? a.wb + (e * N + n) * K + lane * 8 : wa[q];
    }
  };
  uint4 va[U][R], vb[U][R];
  // a.preload: the first row's expert and first weight chunks before the wait, in flight while the predecessor (up)
  // still runs; the same loads as below, so the same bits.
  const bool early = a.preload && blockIdx.y < a.P;
  if (early) {
    const int64_t p = a.sorted ? load_l2_i32(a.sorted + blockIdx.y) : blockIdx.y;
    rows_of(load_l2_i32(a.ids + p));
    if (active) pair_load_group<U, R, M>(va, vb, wa, wb, 0, nj);
  }
  pdl_wait();  // x and act come from the predecessors (ids too, without a.preload); weight rows depend on ids
  pdl_launch_dependents();
  for (int64_t r = blockIdx.y; r < a.P; r += gridDim.y) {
    const int64_t p = a.sorted ? a.sorted[r] : r;
    if constexpr (MODE != PairMode::kDown)
      if (!a.sorted && blockIdx.x == 0 && threadIdx.x == 0) a.pair_row[p] = static_cast<int32_t>(p);
    if (!early || r != blockIdx.y) {
      rows_of(a.ids[p]);
      if (active) pair_load_group<U, R, M>(va, vb, wa, wb, 0, nj);  // in flight while the block stages its input row
    }
    if (r != blockIdx.y) __syncthreads();  // the previous row's reads of in_s are done
    if constexpr (MODE == PairMode::kDown) {
      const bf16* src = a.act_in + r * K;
      for (int64_t k = threadIdx.x * 8; k < K; k += blockDim.x * 8)
        *reinterpret_cast<uint4*>(in_s + k) = *reinterpret_cast<const uint4*>(src + k);
    } else {
      const float* src = a.x + (p / a.top_k) * a.xs;
      for (int64_t k = threadIdx.x * 8; k < K; k += blockDim.x * 8) {
        const float4 x0 = *reinterpret_cast<const float4*>(src + k), x1 = *reinterpret_cast<const float4*>(src + k + 4);
        __align__(16) bf16 h[8] = {__float2bfloat16_rn(x0.x), __float2bfloat16_rn(x0.y), __float2bfloat16_rn(x0.z),
                                   __float2bfloat16_rn(x0.w), __float2bfloat16_rn(x1.x), __float2bfloat16_rn(x1.y),
                                   __float2bfloat16_rn(x1.z), __float2bfloat16_rn(x1.w)};
        *reinterpret_cast<uint4*>(in_s + k) = *reinterpret_cast<const uint4*>(h);
      }
    }
    __syncthreads();
    if (!active) continue;
    float g[R], u[R];
#pragma unroll
    for (int q = 0; q < R; ++q) g[q] = 0.0f, u[q] = 0.0f;
    for (int j0 = 0;;) {
      pair_fma_group<U, R, M>(g, u, va, vb, in_s + lane * 8, j0, nj);
      j0 += U;
      if (j0 >= nj) break;
      pair_load_group<U, R, M>(va, vb, wa, wb, j0, nj);
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const float gs = warp_sum(g[q]);
      const float us = M == 2 ? warp_sum(u[q]) : 0.0f;
      if (lane != 0 || n0 + q >= N) continue;
      if constexpr (MODE == PairMode::kDown)
        a.y[r * N + n0 + q] = gs;
      else
        a.act_out[r * N + n0 + q] = __float2bfloat16_rn(M == 2 ? silu(gs) * us : (gs > 0.0f ? gs * gs : 0.0f));
    }
  }
}

/// Largest K (input row width) the per-pair GEMVs stage in shared memory (48 KB of bf16); wider: the old kernels.
constexpr int64_t kPairMaxK = 24576;

/// Rows per warp and warps per block of the per-pair GEMVs for P pairs of N output rows: KernelTuning's, else 4 warps
/// and the most rows per warp (4, 2, 1) that still give about 12 warps per SM (the latency of each warp's loads is
/// hidden by the other warps and by the R * U loads it has in flight).
void pair_gemv_shape(int64_t P, int64_t N, int& rows, int& warps) {
  const KernelTuning& t = kernel_tuning();
  warps = t.moe_pair_warps == 8 ? 8 : 4;
  rows = t.moe_pair_rows;
  if (rows == 1 || rows == 2 || rows == 4) return;
  const int sms = sm_count() > 0 ? sm_count() : 132;
  const int64_t target = static_cast<int64_t>(sms) * 12;
  rows = P * ceil_div(N, 4) >= target ? 4 : P * ceil_div(N, 2) >= target ? 2 : 1;
}

/// Launches pair_gemv_kernel<R, MODE> for a (N, K) GEMV over P pair rows: grid.y = min(P, 65535) pair rows at a
/// time, or with KernelTuning::moe_pair_one_wave the fewest that keep every block resident at once (each block then
/// loops over ceil(P / grid.y) pair rows).
template <int R, PairMode MODE>
cudaError_t launch_pair_gemv_r(bool pdl, const PairGemvArgs& a, int warps, cudaStream_t stream) {
  const unsigned gx = ceil_div(ceil_div(a.N, R), warps);
  int64_t gy = a.P < 65535 ? a.P : 65535;
  const size_t smem = static_cast<size_t>(a.K) * 2;
  if (kernel_tuning().moe_pair_one_wave) {
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pair_gemv_kernel<R, MODE>, 32 * warps, smem);
    if (e != cudaSuccess) return e;
    const int64_t fit = std::max<int64_t>(1, static_cast<int64_t>(per_sm) * (sm_count() > 0 ? sm_count() : 132) / gx);
    if (gy > fit) gy = ceil_div(a.P, ceil_div(a.P, fit));  // equal shares: ceil(P / fit) rows per block
  }
  return launch_pdl(pdl, pair_gemv_kernel<R, MODE>, dim3(gx, static_cast<unsigned>(gy)), dim3(32 * warps), smem,
                    stream, a);
}

template <PairMode MODE>
cudaError_t launch_pair_gemv(bool pdl, const PairGemvArgs& a, cudaStream_t stream) {
  int rows = 1, warps = 4;
  pair_gemv_shape(a.P, a.N, rows, warps);
  switch (rows) {
    case 4: return launch_pair_gemv_r<4, MODE>(pdl, a, warps, stream);
    case 2: return launch_pair_gemv_r<2, MODE>(pdl, a, warps, stream);
    default: return launch_pair_gemv_r<1, MODE>(pdl, a, warps, stream);
  }
}

/// fp32 experts (MoeDevWeights::f32), every batch size: per-row GEMVs as above with fp32 operands, nothing rounded.
/// Row r of [0, P) is pair p = sorted[r] (pairs in expert order, so consecutive blocks share an expert's weights in
/// L2), or p = r without `sorted` (then pair_row[p] = p is written here); t = p / top_k, e = ids[p]. Each output is
/// one fp32 sum per lane over k = lane * 4 + 128 j (4 FMAs each), then the warp's butterfly sum.
/// Grid (ceil(I / 8), min(P, 65535)), 8 warps, rows r = blockIdx.y, + gridDim.y, ...:
/// act[r, n] = silu(x_t . w1[e, n]) * (x_t . w3[e, n]) (relu^2 experts, w3 null: relu(x_t . w1[e, n])^2).
__global__ void __launch_bounds__(256) f32_up_kernel(const float* __restrict__ x, int64_t xs,
                                                    const int32_t* __restrict__ ids, const int32_t* __restrict__ sorted,
                                                    int64_t P, int top_k, const float* __restrict__ w1,
                                                    const float* __restrict__ w3, int64_t I, int64_t K,
                                                    float* __restrict__ act, int32_t* __restrict__ pair_row) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (n >= I) return;  // whole warps: the butterfly below has all 32 lanes
  for (int64_t r = blockIdx.y; r < P; r += gridDim.y) {
    const int64_t p = sorted ? sorted[r] : r;
    if (!sorted && n == 0 && lane == 0) pair_row[p] = static_cast<int32_t>(p);
    const int64_t e = ids[p];
    const float* xr = x + (p / top_k) * xs;
    const float* a = w1 + (e * I + n) * K;
    const float* b = w3 ? w3 + (e * I + n) * K : a;  // relu^2 experts: no up, u unused
    float g = 0.0f, u = 0.0f;
    for (int64_t k = lane * 4; k < K; k += 32 * 4) {
      const float4 xv = *reinterpret_cast<const float4*>(xr + k);
      const float4 av = *reinterpret_cast<const float4*>(a + k), bv = *reinterpret_cast<const float4*>(b + k);
      g = fmaf(xv.x, av.x, g), g = fmaf(xv.y, av.y, g), g = fmaf(xv.z, av.z, g), g = fmaf(xv.w, av.w, g);
      u = fmaf(xv.x, bv.x, u), u = fmaf(xv.y, bv.y, u), u = fmaf(xv.z, bv.z, u), u = fmaf(xv.w, bv.w, u);
    }
    g = warp_sum(g);
    u = warp_sum(u);
    if (lane == 0) act[r * I + n] = w3 ? silu(g) * u : (g > 0.0f ? g * g : 0.0f);
  }
}

/// Grid (ceil(hidden / 8), min(P, 65535)), 8 warps, rows as f32_up_kernel: y[r, n] = act[r] . w2[e, n] (fp32).
__global__ void __launch_bounds__(256) f32_down_kernel(const float* __restrict__ act, const int32_t* __restrict__ ids,
                                                      const int32_t* __restrict__ sorted, int64_t P,
                                                      const float* __restrict__ w2, int64_t N, int64_t K,
                                                      float* __restrict__ y) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (n >= N) return;
  for (int64_t r = blockIdx.y; r < P; r += gridDim.y) {
    const int64_t e = ids[sorted ? sorted[r] : r];
    const float* a = act + r * K;
    const float* w = w2 + (e * N + n) * K;
    float acc = 0.0f;
    for (int64_t k = lane * 4; k < K; k += 32 * 4) {
      const float4 av = *reinterpret_cast<const float4*>(a + k), wv = *reinterpret_cast<const float4*>(w + k);
      acc = fmaf(av.x, wv.x, acc), acc = fmaf(av.y, wv.y, acc);
      acc = fmaf(av.z, wv.z, acc), acc = fmaf(av.w, wv.w, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[r * N + n] = acc;
  }
}

bool valid(const MoeDevWeights& w) {
  return w.num_experts >= 1 && w.num_experts <= kMaxE && w.top_k >= 1 && w.top_k <= kMaxTopK &&
         w.top_k <= w.num_experts && w.hidden > 0 && w.hidden % 8 == 0 && w.intermediate > 0 &&
         w.intermediate % 8 == 0 && w.w1 && w.w2 && w.routing.n_group >= 1 && w.routing.n_group <= 32 &&
         w.num_experts % w.routing.n_group == 0 && w.routing.topk_group >= 1 && w.routing.topk_group <= w.routing.n_group;
}

}  // namespace

size_t moe_workspace_bytes(int64_t T, const MoeDevWeights& w) { return MoeLayout(T, w).total; }

cudaError_t sparse_moe(const float* x, int64_t x_stride, int64_t T, const float* logits, const MoeDevWeights& w,
                       float* out, int64_t out_stride, void* workspace, cudaStream_t stream, bool pdl,
                       const MoeSharedAdd* shared) {
  if (!valid(w) || w.num_experts > kMaxRouteE || T < 0 || x_stride < w.hidden || x_stride % 4 != 0 ||
      out_stride < w.hidden)
    return cudaErrorInvalidValue;
  if (shared && (!shared->y || shared->y_stride < w.hidden || (shared->x && shared->x_stride < w.hidden)))
    return cudaErrorInvalidValue;
  // The weighted combine of the experts' rows, with the shared expert's rows added (after its branch's event).
  MoeSharedAdd add;
  if (shared) {
    add = *shared;
    if (!add.x) add.x = x, add.x_stride = x_stride;
  }
  auto combine = [&](const float* y, const int32_t* ids, const float* wts, const int32_t* pair_row) {
    if (shared && shared->ready) {
      const cudaError_t we = cudaStreamWaitEvent(stream, shared->ready, 0);
      if (we != cudaSuccess) return we;
    }
    return moe_combine(y, w.hidden, ids, wts, pair_row, T, w.top_k, out, out_stride, shared ? &add : nullptr, stream,
                       pdl);
  };
  if (T == 0) return shared && shared->ready ? cudaStreamWaitEvent(stream, shared->ready, 0) : cudaSuccess;
  const MoeLayout L(T, w);
  auto* base = static_cast<unsigned char*>(workspace);
  auto* ids = reinterpret_cast<int32_t*>(base + L.ids);
  auto* wts = reinterpret_cast<float*>(base + L.wts);
  auto* offsets = reinterpret_cast<int32_t*>(base + L.offsets);
  auto* sorted = reinterpret_cast<int32_t*>(base + L.sorted);
  auto* pair_row = reinterpret_cast<int32_t*>(base + L.pair_row);
  auto* act = reinterpret_cast<bf16*>(base + L.act);
  auto* y = reinterpret_cast<float*>(base + L.y);
  auto* counts = reinterpret_cast<int32_t*>(base + L.counts);
  const int E = w.num_experts, k = w.top_k;
  const int64_t P = T * k;
  LaunchProfile prof(stream);  // SSMSERVE_KERNEL_PROFILE=1: the per-pair path's kernel times (benchmarks, eager only)
  cudaError_t e = moe_route(logits, T, E, k, w.routing, ids, wts, stream, pdl);
  if (e != cudaSuccess) return e;
  prof.mark("moe route");
  if (w.f32) {  // fp32 experts: the fp32 GEMVs for any P (in expert order above kSmallPairs)
    const int32_t* rows = nullptr;
    if (P > kSmallPairs) {
      if ((e = moe_sort_pairs(ids, P, E, offsets, sorted, pair_row, counts, stream, pdl)) != cudaSuccess) return e;
      rows = sorted;
    }
    auto* actf = reinterpret_cast<float*>(base + L.act);
    const unsigned gy = static_cast<unsigned>(P < 65535 ? P : 65535);
    if ((e = launch_pdl(pdl, f32_up_kernel, dim3(ceil_div(w.intermediate, 8), gy), dim3(256), 0, stream, x, x_stride, ids,
                        rows, P, k, static_cast<const float*>(w.w1), static_cast<const float*>(w.w3), w.intermediate,
                        w.hidden, actf, pair_row)) != cudaSuccess)
      return e;
    if ((e = launch_pdl(pdl, f32_down_kernel, dim3(ceil_div(w.hidden, 8), gy), dim3(256), 0, stream,
                        static_cast<const float*>(actf), ids, rows, P, static_cast<const float*>(w.w2), w.hidden,
                        w.intermediate, y)) != cudaSuccess)
      return e;
    return combine(static_cast<const float*>(y), ids, wts, pair_row);
  }
  // Per-pair GEMVs (in expert order above kSmallPairs): decode-sized steps, every step with per_pair, and up to
  // kPairSortedPerExpert pairs per expert under KernelTuning::moe_pair_sorted.
  if (P <= kSmallPairs || w.per_pair || (kernel_tuning().moe_pair_sorted && P <= kPairSortedPerExpert * E)) {
    const int32_t* rows = nullptr;
    if (P > kSmallPairs) {
      if ((e = moe_sort_pairs(ids, P, E, offsets, sorted, pair_row, counts, stream, pdl)) != cudaSuccess) return e;
      rows = sorted;
      prof.mark("moe sort");
    }
    if (kernel_tuning().moe_pair_gemv && w.hidden <= kPairMaxK && w.intermediate <= kPairMaxK) {
      // The same bits as the old kernels below.
      const PairGemvArgs up{x, x_stride, nullptr, ids, rows, P, k, static_cast<const bf16*>(w.w1),
                            static_cast<const bf16*>(w.w3), w.intermediate, w.hidden, act, nullptr, pair_row};
      if ((e = w.w3 ? launch_pair_gemv<PairMode::kUpGated>(pdl, up, stream)
                    : launch_pair_gemv<PairMode::kUpRelu2>(pdl, up, stream)) != cudaSuccess)
        return e;
      prof.mark("moe pair up");
      // ids / rows come from the router / the sort, launched before up: down may read them before its wait.
      // The down GEMV and the combine in one launch (KernelTuning::moe_down_combine), the same bits.
      if (!rows && kernel_tuning().moe_down_combine >= (shared ? 2 : 1) &&
          moe_down_combine_fits(T, k, w.hidden, w.intermediate, shared ? &add : nullptr)) {
        if (shared && shared->ready && (e = cudaStreamWaitEvent(stream, shared->ready, 0)) != cudaSuccess) return e;
        int rows_per_warp = 1, warps = 4;  // the down GEMV's rows per warp; the fused block has top_k warps
        pair_gemv_shape(P, w.hidden, rows_per_warp, warps);
        e = moe_down_combine(act, ids, wts, T, k, static_cast<const bf16*>(w.w2), w.hidden, w.intermediate, rows_per_warp,
                             out, out_stride, shared ? &add : nullptr, kernel_tuning().moe_pair_preload, stream, pdl);
        prof.mark("moe down + combine");
        return e;
      }
      const PairGemvArgs down{nullptr, 0, act, ids, rows, P, k, static_cast<const bf16*>(w.w2), nullptr, w.hidden,
                              w.intermediate, nullptr, y, nullptr, kernel_tuning().moe_pair_preload};
      if ((e = launch_pair_gemv<PairMode::kDown>(pdl, down, stream)) != cudaSuccess) return e;
      prof.mark("moe pair down");
    } else {
      const unsigned gy = static_cast<unsigned>(P < 65535 ? P : 65535);
      if ((e = launch_pdl(pdl, small_up_kernel, dim3(ceil_div(w.intermediate, 8), gy), dim3(256), 0, stream, x,
                          x_stride, ids, rows, P, k, static_cast<const bf16*>(w.w1), static_cast<const bf16*>(w.w3),
                          w.intermediate, w.hidden, act, pair_row)) != cudaSuccess)
        return e;
      prof.mark("moe small up");
      if ((e = launch_pdl(pdl, small_down_kernel, dim3(ceil_div(w.hidden, 8), gy), dim3(256), 0, stream,
                          static_cast<const bf16*>(act), ids, rows, P, static_cast<const bf16*>(w.w2), w.hidden,
                          w.intermediate, y)) != cudaSuccess)
        return e;
      prof.mark("moe small down");
    }
    e = combine(static_cast<const float*>(y), ids, wts, pair_row);
    prof.mark("moe combine");
    return e;
  }
  if ((e = moe_sort_pairs(ids, P, E, offsets, sorted, pair_row, counts, stream, pdl)) != cudaSuccess) return e;
  auto* xg = reinterpret_cast<bf16*>(base + L.xg);
  if ((e = moe_gather_rows(x, x_stride, sorted, pair_row, T, k, w.hidden, xg, stream)) != cudaSuccess) return e;
  if (w.w3) {
    if ((e = moe_grouped_up(xg, offsets, P, E, static_cast<const bf16*>(w.w1), static_cast<const bf16*>(w.w3),
                            w.intermediate, w.hidden, act, stream)) != cudaSuccess)
      return e;
  } else {  // relu^2 experts: u = xg . w1^T by the plain grouped GEMM, then act = bf16(relu(u)^2)
    auto* u = reinterpret_cast<float*>(base + L.u);
    if ((e = moe_grouped_down(xg, offsets, P, E, static_cast<const bf16*>(w.w1), w.intermediate, w.hidden, u, stream)) != cudaSuccess)
      return e;
    if ((e = mlp_activation(u, w.intermediate, P, w.intermediate, false, act, DType::BF16, w.intermediate, stream)) != cudaSuccess)
      return e;
  }
  if ((e = moe_grouped_down(act, offsets, P, E, static_cast<const bf16*>(w.w2), w.hidden, w.intermediate, y,
                            stream)) != cudaSuccess)
    return e;
  return combine(static_cast<const float*>(y), ids, wts, pair_row);
}

}  // namespace ssmserve::cuda
