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

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src) : "memory");
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

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
  // Everything as cp.async copies (no registers held: all of a block's ~2,000 pieces in flight at once, one
  // round trip): the weights as bf16 (16-byte pieces: I, R and cpc are multiples of 8), the small f32 arrays in
  // 16-byte pieces, the states in their storage type in 4-byte pieces.
  auto* wx16 = reinterpret_cast<__nv_bfloat16*>(wx);
  auto* wdt16 = reinterpret_cast<__nv_bfloat16*>(wdt);
  TS* cstT = reinterpret_cast<TS*>(cst);
  TS* sstT = reinterpret_cast<TS*>(sst);
  const int v8 = nc / 8;
  for (int i = tid; i < XD * v8; i += kThreads)
    cp_async16(wx16 + (i / v8) * cpc + 8 * (i % v8), p.w_x + static_cast<int64_t>(i / v8) * p.I + c0 + 8 * (i % v8));
  for (int i = tid; i < nc * R / 8; i += kThreads) cp_async16(wdt16 + 8 * i, p.w_dt + c0 * R + 8 * i);
  for (int i = tid; i < nc * N / 4; i += kThreads) cp_async16(As + 4 * i, p.A + c0 * N + 4 * i);
  for (int i = tid; i < nc * W / 4; i += kThreads) cp_async16(cw + 4 * i, p.conv_w + c0 * W + 4 * i);
  auto per_channel = [&](const float* src, float* dst) {  // D, dt_bias, conv bias (zeros when absent)
    for (int j = tid; j < nc / 4; j += kThreads) {
      if (src) cp_async16(dst + 4 * j, src + c0 + 4 * j);
      else reinterpret_cast<float4*>(dst)[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  per_channel(p.D, Ds), per_channel(p.dt_bias, dtb), per_channel(p.conv_b, cb);
  constexpr int kPer4 = 4 / sizeof(TS);  // state elements per 4-byte piece
  const int cw4 = nc / kPer4, sw4 = nc * N / kPer4;
  for (int i = tid; i < M * S * cw4; i += kThreads) {  // conv windows [M][S][cpc]
    const int m = i / (S * cw4), k = (i / cw4) % S, j = i % cw4;
    const TS* src = static_cast<const TS*>(p.conv_states) + p.state_indices[m] * p.conv_block_stride + k * p.I + c0;
    cp_async4(cstT + (m * S + k) * cpc + kPer4 * j, src + kPer4 * j);
  }
  for (int i = tid; i < M * sw4; i += kThreads) {  // SSM states [M][cpc][N]
    const int m = i / sw4, j = i % sw4;
    const TS* src = static_cast<const TS*>(p.ssm_states) + p.state_indices[m] * p.ssm_block_stride + c0 * N;
    cp_async4(sstT + m * cpc * N + kPer4 * j, src + kPer4 * j);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  stamp(p, 1);
  pdl_wait();
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();  // the shared-memory constants above, copied by other threads
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
    for (int k = 0; k < S; ++k) acc = fmaf(cw[cl * W + k], load(cstT + (m * S + k) * cpc + cl), acc);
    acc = fmaf(cw[cl * W + S], xv, acc);
    const float u = p.conv_silu ? silu(acc) : acc;
    us[m * cpc + cl] = u;
    u16[m * cpc + cl] = bf16_round(u);
    if (blk != 0) {
      TS* cs = static_cast<TS*>(p.conv_states) + blk * p.conv_block_stride + c0 + cl;
      for (int k = 0; k < S; ++k) store(cs + k * p.I, k + 1 < S ? load(cstT + (m * S + k + 1) * cpc + cl) : xv);
    }
  }
  __syncthreads();

  // 2. x_proj partial sums over this slice's channels, in channel order.
  for (int i = tid; i < M * XD; i += kThreads) {
    const int m = i / XD, r = i % XD;
    float acc = 0.0f;
    for (int cl = 0; cl < nc; ++cl) acc = fmaf(__bfloat162float(wx16[r * cpc + cl]), u16[m * cpc + cl], acc);
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
    for (int k = lane; k < R; k += 32) acc = fmaf(__bfloat162float(wdt16[cl * R + k]), bf16_round(xd[m * XD + k]), acc);
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
    const TS* st = sstT + (m * cpc + cl) * N;
    TS* gs = static_cast<TS*>(p.ssm_states) + blk * p.ssm_block_stride + (c0 + cl) * N;
    float acc = 0.0f;
    for (int n = 0; n < N; ++n) {
      const float sn = expf(dt * As[cl * N + n]) * load(st + n) + dt * Bt[n] * u;
      store(gs + n, sn);
      acc += sn * Ct[n];
    }
    const float v = (acc + Ds[cl] * u) * silu(zs[m * cpc + cl]);
    p.y[static_cast<int64_t>(m) * p.y_stride + c0 + cl] = __float2bfloat16_rn(v);
  }
  stamp(p, 6);
  // The successor (out_proj) becomes resident only now: its blocks streaming W during the phases above slowed
  // them ~3x (session 9, phase times).
  pdl_launch_dependents();
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
  if (I < 8 || I > (1 << 24) || I % 8 != 0 || N < 1 || N > kMaxState || R < 8 || R > kMaxRank || R % 8 != 0 ||
      W < 1 || W > kConvMaxWidth)
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
  // cp.async pieces: 16-byte aligned weights and per-channel arrays, 4-byte aligned state blocks.
  const auto al = [](const void* q, size_t n) { return reinterpret_cast<uintptr_t>(q) % n == 0; };
  const size_t ts = dtype_size(s.ssm_states.dtype);
  if (!al(a.w_x, 16) || !al(a.w_dt, 16) || !al(s.A, 16) || !al(c.weight, 16) || !al(s.D, 16) ||
      !al(s.delta_bias, 16) || !al(c.bias, 16) || !al(c.conv_states.data, 4) || !al(s.ssm_states.data, 4) ||
      (c.conv_states.block_stride * ts) % 4 != 0 || (s.ssm_states.block_stride * ts) % 4 != 0)
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
