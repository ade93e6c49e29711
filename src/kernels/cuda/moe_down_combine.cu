// Owns sparse_moe's down GEMV and weighted combine in one launch for decode-sized steps (see moe_parts.h,
// moe_down_combine): the per-pair down GEMV's loads and sums (moe_pair_load.cuh), each pair's output kept in shared
// memory instead of a global row that a combine kernel reads back, then the combine's sum in ascending expert id and
// its shared-expert add. One launch fewer per MoE layer, and the same bits as pair_gemv_kernel<kDown> + combine_kernel.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe_pair_load.cuh"
#include "kernels/cuda/moe_parts.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

struct DownCombineArgs {
  const bf16* act;       ///< [T * top_k, K] bf16, row p = t * top_k + slot
  const int32_t* ids;    ///< [T * top_k] experts
  const float* wts;      ///< [T * top_k] routing weights
  int top_k;
  const bf16* w2;        ///< [E, N, K] down_proj
  int64_t N, K;          ///< hidden, intermediate
  float* out;            ///< [T, N] fp32, row stride os
  int64_t os;
  MoeSharedAdd add;      ///< add.y null: none; add.x resolved when add.gate is set
  bool preload;          ///< read ids and load the first weight chunks before the PDL wait
};

/// Grid (ceil(N / R), T), 32 * top_k threads, dynamic shared memory top_k * K * 2 bytes. Warp w of block (bx, t)
/// computes rows n = bx * R + [0, R) (those < N) of pair p = t * top_k + w exactly as pair_gemv_kernel<R, kDown> does
/// (its act row staged in shared memory as bf16, the same chunk groups, FMA chain and warp_sum), into y_s; then thread
/// q < R writes out[t, n] = sum over slots in ascending expert id (ties: slot order; combine_kernel's insertion sort)
/// of y * wts, then + add.y[t, n] (one rounding) or, gated, fma(sigmoid(x_t . gate), add.y[t, n], o) with
/// block_sigmoid_dot over 256 threads (top_k == 8 only: combine_kernel's block size, so its bits).
template <int R>
__global__ void __launch_bounds__(32 * kMoeMaxTopK) down_combine_kernel(DownCombineArgs a) {
  constexpr int U = pair_unroll(R, 1);
  extern __shared__ __align__(16) unsigned char dc_smem[];
  __shared__ float y_s[kMoeMaxTopK][R];
  __shared__ int ord_s[kMoeMaxTopK];
  __shared__ float scratch[32];
  const int lane = threadIdx.x & 31, slot = threadIdx.x >> 5;
  const int64_t t = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * R, K = a.K, N = a.N;
  const int64_t p = t * a.top_k + slot;
  const int nj = lane * 8 < K ? static_cast<int>((K - lane * 8 + 255) / 256) : 0;  // this lane's chunks
  bf16* in_s = reinterpret_cast<bf16*>(dc_smem) + slot * K;  // this warp's pair's act row
  const bf16* wa[R];
  auto rows_of = [&](int64_t e) {
#pragma unroll
    for (int q = 0; q < R; ++q) wa[q] = a.w2 + (e * N + (n0 + q < N ? n0 + q : n0)) * K + lane * 8;
  };
  uint4 va[U][R];
  // ids come from the router, two launches back (up between writes no ids): readable before the wait, through L2.
  if (a.preload) {
    rows_of(load_l2_i32(a.ids + p));
    pair_load_group<U, R, 1>(va, va, wa, wa, 0, nj);
  }
  pdl_wait();  // act comes from up, the direct predecessor
  pdl_launch_dependents();
  if (!a.preload) {
    rows_of(a.ids[p]);
    pair_load_group<U, R, 1>(va, va, wa, wa, 0, nj);
  }
  if (threadIdx.x == 0) {  // combine_kernel's order: insertion sort of the slots by expert id
    const int32_t* id = a.ids + t * a.top_k;
    for (int k = 0; k < a.top_k; ++k) ord_s[k] = k;
    for (int i = 1; i < a.top_k; ++i)
      for (int b = i; b > 0 && id[ord_s[b]] < id[ord_s[b - 1]]; --b) {
        const int tmp = ord_s[b];
        ord_s[b] = ord_s[b - 1];
        ord_s[b - 1] = tmp;
      }
  }
  const bf16* src = a.act + p * K;
  for (int64_t k = lane * 8; k < K; k += 256) *reinterpret_cast<uint4*>(in_s + k) = *reinterpret_cast<const uint4*>(src + k);
  const float s = a.add.y && a.add.gate ? block_sigmoid_dot(a.add.x + t * a.add.x_stride, a.add.gate, N, scratch) : 1.0f;
  __syncwarp();
  float g[R], unused[R];
#pragma unroll
  for (int q = 0; q < R; ++q) g[q] = 0.0f, unused[q] = 0.0f;
  for (int j0 = 0;;) {
    pair_fma_group<U, R, 1>(g, unused, va, va, in_s + lane * 8, j0, nj);
    j0 += U;
    if (j0 >= nj) break;
    pair_load_group<U, R, 1>(va, va, wa, wa, j0, nj);
  }
#pragma unroll
  for (int q = 0; q < R; ++q) {
    const float gs = warp_sum(g[q]);
    if (lane == 0) y_s[slot][q] = gs;
  }
  __syncthreads();
  if (threadIdx.x >= R || n0 + threadIdx.x >= N) return;
  const int q = threadIdx.x;
  const int64_t n = n0 + q;
  float o = 0.0f;
  for (int k = 0; k < a.top_k; ++k) {
    const int sl = ord_s[k];
    o += y_s[sl][q] * a.wts[t * a.top_k + sl];  // combine_kernel's expression
  }
  if (a.add.y) {
    const float sy = a.add.y[t * a.add.y_stride + n];
    o = a.add.gate ? __fmaf_rn(s, sy, o) : __fadd_rn(o, sy);
  }
  a.out[t * a.os + n] = o;
}

template <int R>
cudaError_t launch_down_combine(const DownCombineArgs& a, int64_t T, bool pdl, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(a.top_k) * a.K * 2;
  return launch_pdl(pdl, down_combine_kernel<R>, dim3(static_cast<unsigned>((a.N + R - 1) / R), static_cast<unsigned>(T)),
                    dim3(32 * a.top_k), smem, stream, a);
}

}  // namespace

namespace detail {

/// The act rows' dynamic shared memory without an opt-in: 48 KB less the kernel's static arrays (y_s, ord_s, scratch:
/// at most 448 bytes), rounded down to 47 KB.
constexpr int64_t kMaxDynamicSmem = 47 * 1024;

bool moe_down_combine_fits(int64_t T, int top_k, int64_t hidden, int64_t intermediate, const MoeSharedAdd* shared) {
  return T >= 1 && T <= 65535 && top_k >= 1 && top_k <= kMoeMaxTopK && hidden % 8 == 0 && intermediate % 8 == 0 &&
         static_cast<int64_t>(top_k) * intermediate * 2 <= kMaxDynamicSmem && (!shared || !shared->gate || top_k == 8);
}

cudaError_t moe_down_combine(const __nv_bfloat16* act, const int32_t* ids, const float* wts, int64_t T, int top_k,
                             const __nv_bfloat16* w2, int64_t hidden, int64_t intermediate, int rows, float* out,
                             int64_t os, const MoeSharedAdd* shared, bool preload, cudaStream_t stream, bool pdl) {
  if (!moe_down_combine_fits(T, top_k, hidden, intermediate, shared) || os < hidden ||
      (shared && (!shared->y || shared->y_stride < hidden || (shared->gate && !shared->x))))
    return cudaErrorInvalidValue;
  DownCombineArgs a{act, ids, wts, top_k, w2, hidden, intermediate, out, os, shared ? *shared : MoeSharedAdd{}, preload};
  switch (rows) {
    case 4: return launch_down_combine<4>(a, T, pdl, stream);
    case 2: return launch_down_combine<2>(a, T, pdl, stream);
    default: return launch_down_combine<1>(a, T, pdl, stream);
  }
}

}  // namespace detail
}  // namespace ssmserve::cuda
