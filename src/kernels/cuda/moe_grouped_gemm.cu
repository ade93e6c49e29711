// Owns the grouped expert GEMMs of the GPU sparse MoE (see moe_grouped_gemm.h).
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/moe_grouped_gemm.h"

namespace ssmserve::cuda::detail {
namespace {
using bf16 = __nv_bfloat16;

constexpr int BM = kMoeTileRows;    // rows (sorted pairs) per CTA tile
constexpr int BB = 128;             // weight rows per CTA tile (up: 64 of w1 then the same 64 of w3; down: 128 of w2)
constexpr int BK = 32;              // k per pipeline stage
constexpr int LDK = BK + 8;         // smem row stride (bf16): 80 bytes, conflict-free ldmatrix
constexpr int kStages = 4;
constexpr int kThreads = 256;       // 8 warps: 2 (rows, 64 each) x 4 (weight rows, 32 each)
constexpr size_t kStageElems = static_cast<size_t>(BM + BB) * LDK;
constexpr size_t kSmemBytes = kStages * kStageElems * sizeof(bf16);  // 80 KiB

/// Grid (P), 256 threads: one row per CTA, 8 elements per thread and step.
__global__ void __launch_bounds__(256) gather_kernel(const float* __restrict__ x, int64_t xs,
                                                    const int32_t* __restrict__ sorted, int top_k, int64_t hidden,
                                                    bf16* __restrict__ xg) {
  const int64_t r = blockIdx.x;
  const float* src = x + static_cast<int64_t>(sorted[r] / top_k) * xs;
  bf16* dst = xg + r * hidden;
  for (int64_t c = threadIdx.x * 8; c < hidden; c += 256 * 8) {
    const float4 a = *reinterpret_cast<const float4*>(src + c), b = *reinterpret_cast<const float4*>(src + c + 4);
    uint4 o;
    o.x = pack_bf16(a.x, a.y), o.y = pack_bf16(a.z, a.w), o.z = pack_bf16(b.x, b.y), o.w = pack_bf16(b.z, b.w);
    *reinterpret_cast<uint4*>(dst + c) = o;
  }
}

/// Grid (T), 256 threads: row t of x converted once (gather_kernel's packing, 8 columns per thread and step) and
/// stored to its top_k rows xg[pair_row[t * top_k + j]]: x is read once in token order instead of top_k times in
/// expert order.
__global__ void __launch_bounds__(256) gather_by_token_kernel(const float* __restrict__ x, int64_t xs,
                                                             const int32_t* __restrict__ pair_row, int top_k,
                                                             int64_t hidden, bf16* __restrict__ xg) {
  __shared__ int64_t dst_s[32];
  const int64_t t = blockIdx.x;
  if (static_cast<int>(threadIdx.x) < top_k) dst_s[threadIdx.x] = static_cast<int64_t>(pair_row[t * top_k + threadIdx.x]) * hidden;
  __syncthreads();
  const float* src = x + t * xs;
  for (int64_t c = threadIdx.x * 8; c < hidden; c += 256 * 8) {
    const float4 a = *reinterpret_cast<const float4*>(src + c), b = *reinterpret_cast<const float4*>(src + c + 4);
    uint4 o;
    o.x = pack_bf16(a.x, a.y), o.y = pack_bf16(a.z, a.w), o.z = pack_bf16(b.x, b.y), o.w = pack_bf16(b.z, b.w);
    for (int j = 0; j < top_k; ++j) *reinterpret_cast<uint4*>(xg + dst_s[j] + c) = o;
  }
}

/// One expert-aligned tile. Grid (column tiles, row tiles): x walks the column tiles of one row tile, so the
/// 128-row A tile is reused from L2 while the expert's weights stream through.
/// kUp: A = xg [P, K = hidden]; B rows 0..63 = w1[e, n0 .. n0 + 63], rows 64..127 = w3[e, same]; out = act [P, N = I]
///      bf16 silu(g) * u, n0 = blockIdx.x * 64.
/// else: A = act [P, K = I]; B rows = w2[e, n0 .. n0 + 127]; out = y [P, N = hidden] fp32, n0 = blockIdx.x * 128.
template <bool kUp>
__global__ void __launch_bounds__(kThreads) grouped_kernel(const bf16* __restrict__ A, const int32_t* __restrict__ offsets,
                                                          int E, const bf16* __restrict__ wa,
                                                          const bf16* __restrict__ wb, int64_t N, int64_t K,
                                                          bf16* __restrict__ act, float* __restrict__ y) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);

  // Which expert and which of its row tiles.
  int e = 0, tile = blockIdx.y, row0 = 0, rows = 0;
  for (; e < E; ++e) {
    const int c = offsets[e + 1] - offsets[e], nt = (c + BM - 1) / BM;
    if (tile < nt) {
      row0 = offsets[e] + tile * BM;
      rows = min(BM, c - tile * BM);
      break;
    }
    tile -= nt;
  }
  if (e == E) return;
  constexpr int kCols = kUp ? BB / 2 : BB;  // output columns per tile
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kCols;
  const bf16* Wa = wa + static_cast<int64_t>(e) * N * K;
  const bf16* Wb = kUp ? wb + static_cast<int64_t>(e) * N * K : nullptr;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp & 1, wn = warp >> 1;
  const int ktiles = static_cast<int>((K + BK - 1) / BK);

  // cp.async of k tile kt into stage s: A 128 x 32 and B 128 x 32 bf16 (512 16-byte chunks each, 2 per thread).
  auto load_stage = [&](int s, int kt) {
    bf16* As = smem + s * kStageElems;
    bf16* Bs = As + BM * LDK;
    const int64_t k0 = static_cast<int64_t>(kt) * BK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kThreads, r = c >> 2, kc = (c & 3) * 8;
      const bool ok = r < rows && k0 + kc < K;
      cp_async16(As + r * LDK + kc, ok ? A + static_cast<int64_t>(row0 + r) * K + k0 + kc : A, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kThreads, r = c >> 2, kc = (c & 3) * 8;
      const bf16* W = Wa;
      int64_t n = n0 + r;
      if constexpr (kUp) {
        if (r >= BB / 2) W = Wb, n -= BB / 2;
      }
      const bool ok = n < N && k0 + kc < K;
      cp_async16(Bs + r * LDK + kc, ok ? W + n * K + k0 + kc : Wa, ok ? 16 : 0);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  // The warp's two 16-row groups of B: up = the same 16 columns of w1 and w3, down = 32 consecutive w2 rows.
  const int base0 = kUp ? wn * 16 : wn * 32, base1 = kUp ? BB / 2 + wn * 16 : wn * 32 + 16;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit_group();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait_group<kStages - 2>();
    __syncthreads();  // stage kt landed for every thread; everyone finished computing stage kt - 1
    if (kt + kStages - 1 < ktiles) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit_group();
    const bf16* As = smem + (kt % kStages) * kStageElems;
    const bf16* Bs = As + BM * LDK;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[4][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) load_a(a[i], As, LDK, wm * 64 + i * 16, kk);
      load_b_nk(b[0], Bs, LDK, kk, base0);
      load_b_nk(b[1], Bs, LDK, kk, base1);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], a[i], b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
    }
  }
  cp_async_wait_group<0>();

  // Epilogue straight from the accumulators: c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, 2t..2t+1) per m16 x n8 tile.
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = wm * 64 + i * 16 + gq + h * 8;
      if (rl >= rows) continue;
      const int64_t row = row0 + rl;
      if constexpr (kUp) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // n8 tiles j (gate) and j + 2 (up) hold the same columns
          const int64_t n = n0 + wn * 16 + j * 8 + 2 * tq;
          if (n >= N) continue;
          const float g0 = acc[i][j][2 * h], g1 = acc[i][j][2 * h + 1];
          const float u0 = acc[i][j + 2][2 * h], u1 = acc[i][j + 2][2 * h + 1];
          *reinterpret_cast<uint32_t*>(act + row * N + n) = pack_bf16(silu(g0) * u0, silu(g1) * u1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t n = n0 + wn * 32 + j * 8 + 2 * tq;
          if (n >= N) continue;
          *reinterpret_cast<float2*>(y + row * N + n) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
      }
    }
}

template <bool kUp>
cudaError_t launch(const bf16* A, const int32_t* offsets, int64_t P, int E, const bf16* wa, const bf16* wb, int64_t N,
                   int64_t K, bf16* act, float* y, cudaStream_t stream) {
  if (P < 0 || E < 1 || N <= 0 || K <= 0 || N % 8 != 0 || K % 8 != 0) return cudaErrorInvalidValue;
  if (P == 0) return cudaSuccess;
  const int64_t row_tiles = (P + BM - 1) / BM + E;
  if (row_tiles > 65535) return cudaErrorInvalidValue;
  // The 80 KiB dynamic shared memory opt-in is per device: set once for each device this process launches on.
  static std::atomic<uint64_t> opted_in{0};
  if (const cudaError_t e = opt_in_dynamic_smem(grouped_kernel<kUp>, kSmemBytes, opted_in); e != cudaSuccess) return e;
  constexpr int kCols = kUp ? BB / 2 : BB;
  grouped_kernel<kUp><<<dim3(ceil_div(N, kCols), static_cast<unsigned>(row_tiles)), kThreads, kSmemBytes, stream>>>(
      A, offsets, E, wa, wb, N, K, act, y);
  return launch_status();
}

}  // namespace

cudaError_t moe_gather_rows(const float* x, int64_t xs, const int32_t* sorted, const int32_t* pair_row, int64_t T,
                            int top_k, int64_t hidden, bf16* xg, cudaStream_t stream) {
  if (T < 0 || top_k < 1 || top_k > 32 || hidden <= 0 || hidden % 8 != 0 || xs < hidden || xs % 4 != 0 ||
      T * top_k > 2147483647)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  if (kernel_tuning().prefill_row_kernels)
    gather_by_token_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(x, xs, pair_row, top_k, hidden, xg);
  else
    gather_kernel<<<static_cast<unsigned>(T * top_k), 256, 0, stream>>>(x, xs, sorted, top_k, hidden, xg);
  return launch_status();
}

namespace {
/// kAuto resolved: the Hopper kernels when switched on and runnable here.
bool use_wg(MoeGemmPath path) {
  return path == MoeGemmPath::kWgmma ||
         (path == MoeGemmPath::kAuto && kernel_tuning().moe_grouped_wg != 0 && moe_grouped_wg_supported());
}
}  // namespace

cudaError_t moe_grouped_up(const bf16* xg, const int32_t* offsets, int64_t P, int E, const bf16* w1, const bf16* w3,
                           int64_t I, int64_t hidden, bf16* act, cudaStream_t stream, MoeGemmPath path) {
  if (use_wg(path)) {
    const cudaError_t e = moe_grouped_up_wg(xg, offsets, P, E, w1, w3, I, hidden, act, stream);
    if (e != cudaErrorNotSupported || path == MoeGemmPath::kWgmma) return e;  // kAuto: unaligned operands fall back
  }
  return launch<true>(xg, offsets, P, E, w1, w3, I, hidden, act, nullptr, stream);
}

cudaError_t moe_grouped_down(const bf16* act, const int32_t* offsets, int64_t P, int E, const bf16* w2, int64_t hidden,
                             int64_t I, float* y, cudaStream_t stream, MoeGemmPath path) {
  if (use_wg(path)) {
    const cudaError_t e = moe_grouped_down_wg(act, offsets, P, E, w2, hidden, I, y, stream);
    if (e != cudaErrorNotSupported || path == MoeGemmPath::kWgmma) return e;
  }
  return launch<false>(act, offsets, P, E, w2, nullptr, hidden, I, nullptr, y, stream);
}

}  // namespace ssmserve::cuda::detail
