// Owns the Hopper (sm_90a) grouped expert GEMMs of the GPU sparse MoE (moe_grouped_gemm.h, MoeGemmPath::kWgmma): the
// tile scheme of moe_grouped_gemm.cu (a CTA per (128-row tile of one expert's sorted rows, column tile)) on the copy
// engine and warpgroup MMAs. Per CTA: one producer warp whose lane 0 walks the k tiles, loading the A box
// [128 rows][64 k] and the B box [BN weight rows][64 k] (up: BN / 2 rows of w1 then the same rows of w3) by TMA
// (tma_tensor.cuh) into a ring of 128-byte-swizzled stages (full / empty mbarriers, tma_ring.cuh); two consumer
// warpgroups, each 64 rows x BN weight rows as 4 wgmma m64nBNk16 per stage with both operands K-major
// (wgmma_bf16.cuh), one stage's group in flight; the epilogue straight from the accumulators (up: act =
// bf16(silu(g) * u), gate and up in the same thread's registers; down: fp32 y). BN 128: 3 stages, 97 KB and 288
// threads per CTA, two CTAs per SM (one's epilogue stores overlap the other's loop); BN 256: 4 stages, 193 KB, one
// CTA per SM, 1.5x the FLOPs per byte of the L2. Rows past the expert's slice are loaded (the next expert's rows, or
// zeros past P) and never stored; k past K and weight rows past N are zeros from the copy engine. Each output element
// is the fixed k order 0, 16, 32, ... of fp32 wgmma accumulation over its own row and the weights: batch-invariant.
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/tma_ring.cuh"
#include "kernels/cuda/tma_tensor.cuh"
#include "kernels/cuda/wgmma_bf16.cuh"

namespace ssmserve::cuda::detail {
namespace {
using bf16 = __nv_bfloat16;

constexpr int BM = kMoeTileRows;            // rows (sorted pairs) per CTA tile: 64 per consumer warpgroup
constexpr int BK = 64;                      // k per stage: one 128-byte swizzle row of bf16
constexpr int kConsumerWarps = 8;           // two warpgroups
constexpr int kThreads = kConsumerWarps * 32 + 32;  // + the producer warp
constexpr int kTileA = BM * BK * 2;         // bytes of a stage's A box

/// The shape of a CTA for BN weight rows per tile (the wgmma N): 128 (3 stages of 32 KB, 97 KB, two CTAs per SM, 64
/// accumulators per thread) or 256 (4 stages of 48 KB, 193 KB, one CTA per SM, 128 accumulators).
template <int BN>
struct Cfg {
  static_assert(BN == 128 || BN == 256);
  static constexpr int kStages = BN == 128 ? 3 : 4;
  static constexpr int kMinBlocks = BN == 128 ? 2 : 1;
  static constexpr int kTileB = BN * BK * 2;
  static constexpr int kStageBytes = kTileA + kTileB;  // a multiple of 1024: swizzle atoms stay aligned
  // The ring, its 2 x kStages mbarriers, and the slack that aligns the ring to 1024 bytes.
  static constexpr size_t kSmemBytes = 1024 + static_cast<size_t>(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t);
};


/// The row tile `tile` of the launch (tiles numbered expert by expert, ceil(count / BM) per expert), found by one warp
/// (every warp of the CTA gets the same answer): 32 experts per step, the tile counts' inclusive scan by shuffles, the
/// first lane whose running count passes `tile` by ballot. Sets the expert, its first sorted row and the tile's row
/// count (1..BM); false when the tile is past the last expert's (the grid's spare tiles).
__device__ __forceinline__ bool find_tile(const int32_t* __restrict__ offsets, int E, int tile, int lane, int& e_out,
                                          int& row0, int& rows) {
  int before = 0;  // tiles of the experts before this step's 32
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    int off = 0, count = 0;
    if (e < E) off = offsets[e], count = offsets[e + 1] - off;
    const int nt = (count + BM - 1) / BM;
    int incl = nt;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, tile < before + incl);
    if (hit) {
      const int src = __ffs(hit) - 1;
      const int first = before + __shfl_sync(0xffffffffu, incl - nt, src);  // the expert's first tile
      const int local = tile - first;
      e_out = e0 + src;
      row0 = __shfl_sync(0xffffffffu, off, src) + local * BM;
      rows = min(BM, __shfl_sync(0xffffffffu, count, src) - local * BM);
      return true;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return false;
}

/// Grid (column tiles, row tiles), kThreads, Cfg<BN>::kSmemBytes. kUp: A = xg [P, K = hidden] (map ta), B rows
/// 0 .. BN / 2 - 1 = w1[e, n0 + those] (map tb), the rest = w3[e, the same] (map tb3); out act [P, N = I] bf16
/// silu(g) * u, n0 = blockIdx.x * BN / 2. Else: A [P, K]; B = w[e, n0 .. n0 + BN - 1] (map tb); out y [P, N] fp32,
/// n0 = blockIdx.x * BN. Maps: A 2D (K, P) boxes (64, 128); weights 3D (K, N, E) boxes (64, BN / 2 or BN, 1); all
/// 128-byte swizzled.
template <bool kUp, int BN>
__global__ void __launch_bounds__(kThreads, Cfg<BN>::kMinBlocks)
    grouped_wg_kernel(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                      const __grid_constant__ CUtensorMap tb3, const int32_t* __restrict__ offsets, int E, int64_t N,
                      int64_t K, bf16* __restrict__ act, float* __restrict__ y) {
  constexpr int kStages = Cfg<BN>::kStages, kTileB = Cfg<BN>::kTileB, kStageBytes = Cfg<BN>::kStageBytes;
  constexpr int kAcc = BN / 2;  // accumulators per thread: m64 x BN over 128 threads
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + ((1024 - (saddr(smem_raw) & 1023)) & 1023);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  // Warp-uniform by construction (shuffled from lane 0), so ptxas sees the wgmma paths as convergent.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0), lane = threadIdx.x & 31;

  int e = 0, row0 = 0, rows = 0;
  if (!find_tile(offsets, E, blockIdx.y, lane, e, row0, rows)) return;  // the same answer in every warp
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(saddr(full + s), 1), mbar_init(saddr(empty + s), kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the last CTA-wide barrier: the producer warp leaves once its copies are issued
  constexpr int kCols = kUp ? BN / 2 : BN;  // output columns per tile
  const int n0 = static_cast<int>(blockIdx.x) * kCols;
  const int ktiles = static_cast<int>((K + BK - 1) / BK);

  if (warp == kConsumerWarps) {
    if (lane == 0) {
      tma_prefetch_map(&ta);
      tma_prefetch_map(&tb);
      if constexpr (kUp) tma_prefetch_map(&tb3);
      for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt % kStages;
        // Fill kt of slot s waits for the consumers' release of fill kt - kStages (phase kt / kStages - 1).
        if (kt >= kStages) mbar_wait_bounded(saddr(empty + s), ((kt / kStages) + 1) & 1);
        const uint32_t bar = saddr(full + s), dst = saddr(smem + s * kStageBytes);
        mbar_expect_tx(bar, kStageBytes);
        tma_load_2d(dst, &ta, kt * BK, row0, bar);
        if constexpr (kUp) {
          tma_load_3d(dst + kTileA, &tb, kt * BK, n0, e, bar);
          tma_load_3d(dst + kTileA + kTileB / 2, &tb3, kt * BK, n0, e, bar);
        } else {
          tma_load_3d(dst + kTileA, &tb, kt * BK, n0, e, bar);
        }
      }
    }
    return;
  }

  // Consumer warpgroup wg: rows 64 wg .. 64 wg + 63 of the tile, all BN B rows.
  const int wg = warp >> 2;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < ktiles; ++kt) {
    const int s = kt % kStages;
    mbar_wait_bounded(saddr(full + s), (kt / kStages) & 1);
    const unsigned char* const as = smem + s * kStageBytes + wg * (64 * 128);  // 8 KB: 64 rows of 128 bytes
    const unsigned char* const bs = smem + s * kStageBytes + kTileA;
    wg_fence();
#pragma unroll
    for (int k = 0; k < BK / 16; ++k) {  // a 16-wide k step is a 32-byte start offset inside the swizzled rows
      const uint64_t da = wg_desc(as + 32 * k, 16, 1024, true), db = wg_desc(bs + 32 * k, 16, 1024, true);
      if constexpr (BN == 128)
        wgmma_ss_n128_k(acc, da, db);
      else
        wgmma_ss_n256_k(acc, da, db);
    }
    wg_commit();
    wg_wait<1>();  // stage kt - 1's MMAs are done: give its slot back
    if (kt > 0 && lane == 0) mbar_arrive(saddr(empty + (kt - 1) % kStages));
  }
  wg_wait<0>();
  wg_pin(acc);

  // Accumulator (wgmma_bf16.cuh): acc[4 j + 2 h + 0, 1] = (row 16 w + g + 8 h, columns 8 j + 2 t, + 1).
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rl = 64 * wg + 16 * (warp & 3) + g + 8 * h;
    if (rl >= rows) continue;
    const int64_t row = row0 + rl;
    if constexpr (kUp) {
#pragma unroll
      for (int j = 0; j < BN / 16; ++j) {  // columns 8 j + 2 t: w1 (gate) in tile j, w3 (up) in tile j + BN / 16
        const int64_t n = n0 + 8 * j + 2 * t;
        if (n >= N) continue;
        const float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
        const float u0 = acc[4 * (j + BN / 16) + 2 * h], u1 = acc[4 * (j + BN / 16) + 2 * h + 1];
        *reinterpret_cast<uint32_t*>(act + row * N + n) = pack_bf16(silu(g0) * u0, silu(g1) * u1);
      }
    } else {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int64_t n = n0 + 8 * j + 2 * t;
        if (n >= N) continue;
        *reinterpret_cast<float2*>(y + row * N + n) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      }
    }
  }
}

/// The tensor map of the row operand: [P, K] bf16 contiguous, boxes of 64 k x BM rows.
cudaError_t map_rows(CUtensorMap* m, const bf16* A, int64_t P, int64_t K) {
  const uint64_t dims[2] = {static_cast<uint64_t>(K), static_cast<uint64_t>(P)};
  const uint64_t strides[1] = {static_cast<uint64_t>(K) * 2};
  const uint32_t box[2] = {BK, BM};
  return tma_map_bf16_sw128(m, A, 2, dims, strides, box);
}
/// The tensor map of a stacked weight: [E, N, K] bf16 contiguous, boxes of 64 k x `rows` weight rows x 1 expert.
cudaError_t map_weights(CUtensorMap* m, const bf16* W, int E, int64_t N, int64_t K, uint32_t rows) {
  const uint64_t dims[3] = {static_cast<uint64_t>(K), static_cast<uint64_t>(N), static_cast<uint64_t>(E)};
  const uint64_t strides[2] = {static_cast<uint64_t>(K) * 2, static_cast<uint64_t>(N * K) * 2};
  const uint32_t box[3] = {BK, rows, 1};
  return tma_map_bf16_sw128(m, W, 3, dims, strides, box);
}

template <bool kUp, int BN>
cudaError_t launch_wg(const bf16* A, const int32_t* offsets, int64_t P, int E, const bf16* wa, const bf16* wb,
                      int64_t N, int64_t K, bf16* act, float* y, cudaStream_t stream) {
  if (P < 0 || E < 1 || N <= 0 || K <= 0 || N % 8 != 0 || K % 8 != 0) return cudaErrorInvalidValue;
  if (P == 0) return cudaSuccess;
  if (!moe_grouped_wg_supported()) return cudaErrorNotSupported;
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(A) || misaligned(wa) || (kUp && misaligned(wb))) return cudaErrorNotSupported;
  const int64_t row_tiles = (P + BM - 1) / BM + E;
  if (row_tiles > 65535 || K > (int64_t{1} << 31) - BK || N > (int64_t{1} << 31) - BN) return cudaErrorInvalidValue;
  constexpr uint32_t kBox = kUp ? BN / 2 : BN;  // weight rows per copy
  CUtensorMap ta, tb, tb3;
  cudaError_t e = map_rows(&ta, A, P, K);
  if (e == cudaSuccess) e = map_weights(&tb, wa, E, N, K, kBox);
  if (e == cudaSuccess) e = map_weights(&tb3, kUp ? wb : wa, E, N, K, kBox);
  if (e != cudaSuccess) return cudaErrorNotSupported;  // the driver refused a map: kAuto takes the mma.sync kernel
  static std::atomic<uint64_t> opted_in{0};
  constexpr size_t smem = Cfg<BN>::kSmemBytes;
  if ((e = opt_in_dynamic_smem(grouped_wg_kernel<kUp, BN>, smem, opted_in)) != cudaSuccess) return e;
  constexpr int kCols = kUp ? BN / 2 : BN;
  grouped_wg_kernel<kUp, BN><<<dim3(ceil_div(N, kCols), static_cast<unsigned>(row_tiles)), kThreads, smem, stream>>>(
      ta, tb, tb3, offsets, E, N, K, act, y);
  return launch_status();
}

/// The weight tile width of a call: KernelTuning::moe_grouped_wg 2 (128) or 3 (256), else by the depth: 256 from
/// K = 1024 (long k loops: one CTA per SM, 1.5x the FLOPs per L2 byte; the gated up at hidden 1536..2688 and the
/// relu^2 up), 128 below (short loops, e.g. the down at I = 512 with its fp32 output: two CTAs per SM, so one's
/// prologue and epilogue stores overlap the other's loop).
int tile_width(int64_t K) {
  const int v = kernel_tuning().moe_grouped_wg;
  return v == 2 ? 128 : v == 3 ? 256 : K >= kWideTileMinK ? 256 : 128;
}

}  // namespace

bool moe_grouped_wg_supported() {
  // Per device (bit d of `known`: checked; of `yes`: compute capability 9.0, the only target of the sm_90a build).
  static std::atomic<uint64_t> known{0}, yes{0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(known.load(std::memory_order_acquire) & bit)) {
    int major = 0, minor = 0;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
              minor == 0;
    ok = ok && tma_encoder() != nullptr;
    if (ok) yes.fetch_or(bit, std::memory_order_acq_rel);
    known.fetch_or(bit, std::memory_order_acq_rel);
  }
  return (yes.load(std::memory_order_acquire) & bit) != 0;
}

cudaError_t moe_grouped_up_wg(const bf16* xg, const int32_t* offsets, int64_t P, int E, const bf16* w1, const bf16* w3,
                              int64_t I, int64_t hidden, bf16* act, cudaStream_t stream) {
  return tile_width(hidden) == 128 ? launch_wg<true, 128>(xg, offsets, P, E, w1, w3, I, hidden, act, nullptr, stream)
                                 : launch_wg<true, 256>(xg, offsets, P, E, w1, w3, I, hidden, act, nullptr, stream);
}

cudaError_t moe_grouped_down_wg(const bf16* A, const int32_t* offsets, int64_t P, int E, const bf16* w, int64_t N,
                                int64_t K, float* y, cudaStream_t stream) {
  return tile_width(K) == 128 ? launch_wg<false, 128>(A, offsets, P, E, w, nullptr, N, K, nullptr, y, stream)
                                  : launch_wg<false, 256>(A, offsets, P, E, w, nullptr, N, K, nullptr, y, stream);
}

}  // namespace ssmserve::cuda::detail
