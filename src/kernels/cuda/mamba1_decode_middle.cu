// Owns the one-kernel middle of a Mamba-1 decode step (see mamba1_decode_middle.h).
#include "kernels/cuda/mamba1_decode_middle.h"

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

// 128 threads: a block's registers fit next to in_proj's blocks on an SM, so the grid becomes resident (and loads its
// constants) while in_proj streams.
constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kMaxState = 64, kMaxRank = 512, kMaxBlocks = 256;
constexpr size_t kCounterBytes = 256;  // two 64-bit arrival counters, padded

struct Params {
  const float* xz;
  int64_t xz_stride;
  const float* conv_w;
  const float* conv_b;
  void* conv_states;
  int64_t conv_block_stride;
  int width;
  bool conv_silu;
  const __nv_bfloat16* w_x;
  const __nv_bfloat16* w_dt;
  const float* A;
  const float* D;
  const float* dt_bias;
  bool softplus_dt;
  void* ssm_states;
  int64_t ssm_block_stride;
  __nv_bfloat16* y;
  int64_t y_stride;
  const int32_t* state_indices;
  int M, N, R, XD;
  int64_t I;
  int cpc;                          // channels per block (the last block may have fewer)
  bool vec;                         // 16-byte weight loads (I, R and cpc multiples of 8, aligned weights)
  unsigned long long* counters;     // [2] arrivals, only ever incremented (a launch adds gridDim.x to each)
  float* partials;                  // [gridDim.x][M][XD] x_proj partial sums
  float* xdbl;                      // [M][XD] x_proj outputs
  unsigned long long* timing;       // [gridDim.x][8] phase timestamps (SSMSERVE_MIDDLE_TIMING=1), or nullptr
};

__device__ __forceinline__ void stamp(const Params& p, int k) {
  if (p.timing && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    p.timing[blockIdx.x * 8 + k] = t;
  }
}

/// Shared memory carve-up of one block (floats): sizes from (cpc, M, N, R, XD, width).
struct Smem {
  int wx, wdt, A, D, dtb, cw, cb, cst, sst, u, u16, z, xdbl, delta, total;
  __host__ __device__ Smem(int cpc, int M, int N, int R, int XD, int W) {
    int o = 0;
    auto take = [&](int n) { const int at = o; o += (n + 3) / 4 * 4; return at; };  // 16-byte aligned pieces
    wx = take(XD * cpc), wdt = take(cpc * R), A = take(cpc * N), D = take(cpc), dtb = take(cpc);
    cw = take(cpc * W), cb = take(cpc), cst = take(M * (W - 1) * cpc), sst = take(M * cpc * N);
    u = take(M * cpc), u16 = take(M * cpc), z = take(M * cpc), xdbl = take(M * XD), delta = take(M * cpc);
    total = o;
  }
};

/// Grid-wide arrival on a monotonically increasing 64-bit counter (all blocks co-resident): every launch adds
/// gridDim.x, so the launch's target is the next multiple of gridDim.x above a block's own arrival. Traps after
/// ~10 s of waiting (blocks not co-resident) instead of hanging.
__device__ __forceinline__ void grid_arrive_wait(unsigned long long* ctr) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long n = gridDim.x, old = atomicAdd(ctr, 1ull), target = (old / n + 1) * n;
    unsigned long long v = 0;
    for (long long spins = 0;; ++spins) {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(ctr) : "memory");
      if (v >= target) break;
      if (spins > (1ll << 27)) __trap();
      __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

/// dst(i, v) for i < n with v = src(i): each thread's loads issued in batches of B before their stores (so B
/// global loads per thread are in flight, not one).
template <int B, class Src, class Dst>
__device__ __forceinline__ void batched_copy(int n, Src src, Dst dst) {
  for (int base = threadIdx.x; base < n; base += B * kThreads) {
    float v[B];
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int i = base + j * kThreads;
      v[j] = i < n ? src(i) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int i = base + j * kThreads;
      if (i < n) dst(i, v[j]);
    }
  }
}

/// Eight bf16 values at 16-byte aligned src + 8 * unit(i) widened into dst + 8 * i, for i < n (batches of B).
template <int B, class Unit, class DUnit>
__device__ __forceinline__ void copy_bf16x8(int n, const __nv_bfloat16* src, Unit unit, float* dst, DUnit dunit) {
  for (int base = threadIdx.x; base < n; base += B * kThreads) {
    uint4 v[B];
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int i = base + j * kThreads;
      if (i < n) v[j] = __ldg(reinterpret_cast<const uint4*>(src) + unit(i));
    }
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int i = base + j * kThreads;
      if (i >= n) continue;
      const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&v[j]);
      float* d = dst + 8 * dunit(i);
#pragma unroll
      for (int e = 0; e < 8; ++e) d[e] = __bfloat162float(h[e]);
    }
  }
}

template <class TS>
__global__ void __launch_bounds__(kThreads, 1) middle_kernel(Params p) {
  extern __shared__ __align__(16) float sm[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int M = p.M, N = p.N, R = p.R, XD = p.XD, W = p.width, S = W - 1, cpc = p.cpc;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * cpc;
  const int nc = static_cast<int>(p.I - c0 < cpc ? p.I - c0 : cpc);
  const Smem L(cpc, M, N, R, XD, W);
  float *wx = sm + L.wx, *wdt = sm + L.wdt, *As = sm + L.A, *Ds = sm + L.D, *dtb = sm + L.dtb, *cw = sm + L.cw;
  float *cb = sm + L.cb, *cst = sm + L.cst, *sst = sm + L.sst, *us = sm + L.u, *u16 = sm + L.u16, *zs = sm + L.z;
  float *xd = sm + L.xdbl, *dl = sm + L.delta;
  stamp(p, 0);

  // 0. Before the PDL wait: this slice's constants and its rows' states (only this kernel of this layer writes
  //    them, in an earlier step) into shared memory.
  if (p.vec) {  // I, R multiples of 8, cpc a multiple of 8: 16-byte rows pieces
    const int v8 = nc / 8, cv8 = cpc / 8;
    copy_bf16x8<4>(XD * v8, p.w_x, [&](int i) { return (static_cast<int64_t>(i / v8) * p.I + c0) / 8 + i % v8; }, wx,
                   [&](int i) { return static_cast<int64_t>(i / v8) * cv8 + i % v8; });
    copy_bf16x8<4>(nc * R / 8, p.w_dt, [&](int i) { return c0 * R / 8 + i; }, wdt,
                   [&](int i) { return static_cast<int64_t>(i); });
  } else {
    batched_copy<8>(XD * nc, [&](int i) { return __bfloat162float(p.w_x[static_cast<int64_t>(i / nc) * p.I + c0 + i % nc]); },
                    [&](int i, float v) { wx[(i / nc) * cpc + i % nc] = v; });
    batched_copy<8>(nc * R, [&](int i) { return __bfloat162float(p.w_dt[c0 * R + i]); },
                    [&](int i, float v) { wdt[i] = v; });
  }
  batched_copy<4>(nc * N, [&](int i) { return p.A[c0 * N + i]; }, [&](int i, float v) { As[i] = v; });
  batched_copy<4>(nc * W, [&](int i) { return p.conv_w[c0 * W + i]; }, [&](int i, float v) { cw[i] = v; });
  batched_copy<4>(3 * nc,
                  [&](int i) {
                    const int64_t c = c0 + i % nc;
                    const float* a = i < nc ? p.D : i < 2 * nc ? p.dt_bias : p.conv_b;
                    return a ? a[c] : 0.0f;
                  },
                  [&](int i, float v) { (i < nc ? Ds : i < 2 * nc ? dtb : cb)[i % nc] = v; });
  // The rows' states: conv windows [M][S][cpc], SSM states [M][cpc][N].
  batched_copy<8>(M * S * nc,
                  [&](int i) {
                    const int m = i / (S * nc), k = (i / nc) % S, cl = i % nc;
                    const TS* cs = static_cast<const TS*>(p.conv_states) + p.state_indices[m] * p.conv_block_stride;
                    return load(cs + k * p.I + c0 + cl);
                  },
                  [&](int i, float v) { cst[(i / nc) * cpc + i % nc] = v; });
  batched_copy<8>(M * nc * N,
                  [&](int i) {
                    const int m = i / (nc * N), j = i % (nc * N);
                    const TS* ss = static_cast<const TS*>(p.ssm_states) + p.state_indices[m] * p.ssm_block_stride;
                    return load(ss + c0 * N + j);
                  },
                  [&](int i, float v) { sst[(i / (nc * N)) * cpc * N + i % (nc * N)] = v; });
  stamp(p, 1);
  pdl_wait();
  pdl_launch_dependents();
  __syncthreads();  // the shared-memory constants above, written by other threads
  stamp(p, 2);

  // 1. Conv update (conv_update_channel's order: bias, taps oldest to newest, SiLU), its bf16 rounding (x_proj's
  //    operand), the gate input z; the shifted window back to the state.
  for (int i = tid; i < M * nc; i += kThreads) {
    const int m = i / nc, cl = i % nc;
    const int32_t blk = p.state_indices[m];
    const float* xr = p.xz + static_cast<int64_t>(m) * p.xz_stride;
    const float xv = xr[c0 + cl];
    zs[m * cpc + cl] = xr[p.I + c0 + cl];
    float acc = cb[cl];
    for (int k = 0; k < S; ++k) acc = fmaf(cw[cl * W + k], cst[(m * S + k) * cpc + cl], acc);
    acc = fmaf(cw[cl * W + S], xv, acc);
    const float u = p.conv_silu ? silu(acc) : acc;
    us[m * cpc + cl] = u;
    u16[m * cpc + cl] = bf16_round(u);
    if (blk != 0) {
      TS* cs = static_cast<TS*>(p.conv_states) + blk * p.conv_block_stride + c0 + cl;
      for (int k = 0; k < S; ++k) store(cs + k * p.I, k + 1 < S ? cst[(m * S + k + 1) * cpc + cl] : xv);
    }
  }
  __syncthreads();

  // 2. x_proj partial sums over this slice's channels, in channel order.
  for (int i = tid; i < M * XD; i += kThreads) {
    const int m = i / XD, r = i % XD;
    float acc = 0.0f;
    for (int cl = 0; cl < nc; ++cl) acc = fmaf(wx[r * cpc + cl], u16[m * cpc + cl], acc);
    p.partials[(static_cast<int64_t>(blockIdx.x) * M + m) * XD + r] = acc;
  }
  stamp(p, 3);
  grid_arrive_wait(p.counters);
  stamp(p, 4);

  // 3. x_proj outputs: pair (m, r) by one warp of the grid; lane k adds blocks k, k + 32, ... in order, then a
  //    fixed butterfly.
  const int gwarps = gridDim.x * kWarps;
  for (int q = blockIdx.x * kWarps + warp; q < M * XD; q += gwarps) {
    const int m = q / XD, r = q % XD;
    float v[kMaxBlocks / 32];
#pragma unroll
    for (int j = 0; j < kMaxBlocks / 32; ++j) {  // all loads in flight, then the sum in block order
      const int k = lane + 32 * j;
      v[j] = k < static_cast<int>(gridDim.x) ? __ldcg(p.partials + (static_cast<int64_t>(k) * M + m) * XD + r) : 0.0f;
    }
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxBlocks / 32; ++j) acc += v[j];
    acc = warp_sum(acc);
    if (lane == 0) p.xdbl[q] = acc;
  }
  grid_arrive_wait(p.counters + 1);
  stamp(p, 5);
  for (int i = tid; i < M * XD; i += kThreads) xd[i] = __ldcg(p.xdbl + i);
  __syncthreads();

  // 4. dt_proj for (row, channel) by one warp: lane k adds k, k + 32, ... of dt_low (bf16-rounded, as the chain's
  //    operand) in order, then the butterfly; + dt_bias, softplus.
  for (int q = warp; q < M * nc; q += kWarps) {
    const int m = q / nc, cl = q % nc;
    float acc = 0.0f;
    for (int k = lane; k < R; k += 32) acc = fmaf(wdt[cl * R + k], bf16_round(xd[m * XD + k]), acc);
    acc = warp_sum(acc);
    if (lane == 0) {
      const float dt = acc + dtb[cl];
      dl[m * cpc + cl] = p.softplus_dt ? softplus(dt) : dt;
    }
  }
  __syncthreads();

  // 5. Selective state update of (row, channel), states in order n = 0..N-1; D skip, SiLU(z) gate; bf16 y.
  for (int i = tid; i < M * nc; i += kThreads) {
    const int m = i / nc, cl = i % nc;
    const int32_t blk = p.state_indices[m];
    if (blk == 0) continue;
    const float dt = dl[m * cpc + cl], u = us[m * cpc + cl];
    const float* Bt = xd + m * XD + R;
    const float* Ct = Bt + N;
    float* st = sst + (m * cpc + cl) * N;
    TS* gs = static_cast<TS*>(p.ssm_states) + blk * p.ssm_block_stride + (c0 + cl) * N;
    float acc = 0.0f;
    for (int n = 0; n < N; ++n) {
      const float sn = expf(dt * As[cl * N + n]) * st[n] + dt * Bt[n] * u;
      store(gs + n, sn);
      acc += sn * Ct[n];
    }
    const float v = (acc + Ds[cl] * u) * silu(zs[m * cpc + cl]);
    p.y[static_cast<int64_t>(m) * p.y_stride + c0 + cl] = __float2bfloat16_rn(v);
  }
  stamp(p, 6);
}

unsigned long long* timing_buffer() {  // SSMSERVE_MIDDLE_TIMING=1: the phase timestamps of the last launch
  static unsigned long long* b = [] () -> unsigned long long* {
    const char* e = std::getenv("SSMSERVE_MIDDLE_TIMING");
    void* d = nullptr;
    if (!(e && e[0] == '1') || cudaMalloc(&d, kMaxBlocks * 8 * sizeof(unsigned long long)) != cudaSuccess) return nullptr;
    return static_cast<unsigned long long*>(d);
  }();
  return b;
}

int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return v > 0 ? v : 132;
  }();
  return n;
}

/// Channels per block: a multiple of 8 (16-byte weight pieces) with at most one block per SM (<= kMaxBlocks).
int max_blocks() {  // SSMSERVE_MIDDLE_BLOCKS=<n> (benchmarks; changes the summation order)
  static const int n = [] {
    const char* e = std::getenv("SSMSERVE_MIDDLE_BLOCKS");
    const int v = e && *e ? std::atoi(e) : 0;
    return std::clamp(v > 0 ? v : num_sms(), 1, std::min(num_sms(), kMaxBlocks));
  }();
  return n;
}

int channels_per_block(int64_t I) {
  const int64_t blocks = max_blocks();
  return static_cast<int>(((I + blocks - 1) / blocks + 7) / 8 * 8);
}

size_t smem_bytes(int64_t I, int N, int64_t R, int W) {
  const Smem L(channels_per_block(I), kMiddleMaxRows, N, static_cast<int>(R), static_cast<int>(R) + 2 * N, W);
  return static_cast<size_t>(L.total) * sizeof(float);
}

int max_smem() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
      return 0;
    return v;
  }();
  return n;
}

}  // namespace

std::vector<unsigned long long> mamba1_decode_middle_timing(int64_t I) {
  std::vector<unsigned long long> t;
  if (!timing_buffer()) return t;
  const int blocks = static_cast<int>((I + channels_per_block(I) - 1) / channels_per_block(I));
  t.resize(static_cast<size_t>(blocks) * 8);
  if (cudaMemcpy(t.data(), timing_buffer(), t.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost) != cudaSuccess)
    t.clear();
  return t;
}

bool mamba1_decode_middle_supported(int64_t I, int N, int64_t R, int W) {
  if (I < 1 || I > (1 << 24) || N < 1 || N > kMaxState || R < 1 || R > kMaxRank || W < 1 || W > kConvMaxWidth)
    return false;
  return smem_bytes(I, N, R, W) <= static_cast<size_t>(max_smem());
}

size_t mamba1_decode_middle_workspace(int64_t I, int N, int64_t R) {
  const int64_t blocks = (I + channels_per_block(I) - 1) / channels_per_block(I), XD = R + 2LL * N;
  return kCounterBytes + static_cast<size_t>((blocks + 1) * kMiddleMaxRows * XD) * sizeof(float);
}

cudaError_t mamba1_decode_middle(const Mamba1DecodeMiddleArgs& a, bool pdl, cudaStream_t stream) {
  const ConvParams& c = a.conv;
  const ScanParams& s = a.scan;
  const int64_t I = s.dim;
  if (a.batch < 0 || a.batch > kMiddleMaxRows || c.dim != I || !a.xz || a.xz_stride < 2 * I || !c.weight ||
      (c.width > 1 && !c.conv_states.data) || !a.w_x || !a.w_dt || !s.A || !s.ssm_states.data ||
      s.ssm_states.dtype != c.conv_states.dtype || !a.y || a.y_stride < I || !a.state_indices || !a.workspace ||
      !mamba1_decode_middle_supported(I, s.d_state, a.dt_rank, c.width) ||
      a.workspace_bytes < mamba1_decode_middle_workspace(I, s.d_state, a.dt_rank))
    return cudaErrorInvalidValue;
  if (a.batch == 0) return cudaSuccess;
  Params p{};
  p.xz = a.xz, p.xz_stride = a.xz_stride;
  p.conv_w = c.weight, p.conv_b = c.bias, p.conv_states = c.conv_states.data;
  p.conv_block_stride = c.conv_states.block_stride, p.width = c.width, p.conv_silu = c.apply_silu;
  p.w_x = static_cast<const __nv_bfloat16*>(a.w_x), p.w_dt = static_cast<const __nv_bfloat16*>(a.w_dt);
  p.A = s.A, p.D = s.D, p.dt_bias = s.delta_bias, p.softplus_dt = s.delta_softplus;
  p.ssm_states = s.ssm_states.data, p.ssm_block_stride = s.ssm_states.block_stride;
  p.y = static_cast<__nv_bfloat16*>(a.y), p.y_stride = a.y_stride, p.state_indices = a.state_indices;
  p.M = a.batch, p.N = s.d_state, p.R = static_cast<int>(a.dt_rank), p.XD = p.R + 2 * p.N, p.I = I;
  p.cpc = channels_per_block(I);
  p.timing = timing_buffer();
  p.vec = I % 8 == 0 && a.dt_rank % 8 == 0 && reinterpret_cast<uintptr_t>(a.w_x) % 16 == 0 &&
          reinterpret_cast<uintptr_t>(a.w_dt) % 16 == 0;
  const int blocks = static_cast<int>((I + p.cpc - 1) / p.cpc);
  auto* base = static_cast<char*>(a.workspace);
  p.counters = reinterpret_cast<unsigned long long*>(base);
  p.partials = reinterpret_cast<float*>(base + kCounterBytes);
  p.xdbl = p.partials + static_cast<int64_t>(blocks) * kMiddleMaxRows * p.XD;
  // Shared memory for this launch's rows (the support check sized it for kMiddleMaxRows).
  const size_t smem = static_cast<size_t>(Smem(p.cpc, p.M, p.N, p.R, p.XD, p.width).total) * sizeof(float);
  return visit_dtype(s.ssm_states.dtype, [&](auto tag) -> cudaError_t {
    auto kernel = middle_kernel<decltype(tag)>;
    if (smem > 48 * 1024)
      if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                     static_cast<int>(smem));
          e != cudaSuccess)
        return e;
    return launch_pdl(pdl, kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, stream, p);
  });
}

}  // namespace ssmserve::cuda
