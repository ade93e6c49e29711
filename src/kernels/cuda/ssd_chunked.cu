// Owns the chunked (tensor-core) form of the Mamba-2 SSD prefill (see ssd.h). Per chunk c of length len <= L
// (chunk_size), head h of group g, with dt_l = clamp(softplus(dt_raw + dt_bias)), cs_l = sum_{j <= l} dt_j A_h
// (the chunk cumsum) and the state entering the chunk s_in (P x N):
//   chunk state   S_c   = sum_l x_l (dt_l exp(cs_last - cs_l)) B_l^T            [P x N]  (x^T (w . B))
//   state passing s_in(c+1) = exp(cs_last(c)) s_in(c) + S_c                     (along each sequence)
//   chunk scan    y_l   = sum_{s <= l} (C_l . B_s) exp(cs_l - cs_s) dt_s x_s + exp(cs_l) C_l s_in^T + D x_l
// Workspace [floats]: dt and cs [nchunks, H, L], cs_last [nchunks, H], states [nchunks, H, P, N] (S_c, then
// s_in in place), CB [nchunks, G, L, L]; from the stream-ordered pool, freed at the end of the call.
// The chunk-state and chunk-scan tiles stream their operands through a 4-stage cp.async pipeline
// (mma_tile.cuh, block_gemm_async): with one slice of register prefetch they waited on load latency.
// SsdParams::bf16_products: chunk state and chunk scan on bf16 tensor cores instead (ssd_chunked_bf16.cu), with
// bf16 copies of x, B, C and of the chunk-entry states (written instead of the fp32 ones) in the workspace.
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/ssd.h"
#include "kernels/cuda/ssd_chunked_common.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kMaxChunk = kSsdMaxChunk;
using Ws = SsdWs;
__device__ __forceinline__ bool live(const ChunkMetadataDev& m, int c) { return chunk_live(m, c); }
__device__ __forceinline__ int chunk_len(const ChunkMetadataDev& m, int c) { return chunk_tokens(m, c); }

/// Grid (nchunks, ceil(H / 8)), 256 threads: warp w does head blockIdx.y * 8 + w with a warp scan per 32 tokens.
__global__ void __launch_bounds__(256) cumsum_kernel(SsdInputs in, SsdParams p, ChunkMetadataDev m, Ws ws) {
  const int c = blockIdx.x, h = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (h >= p.num_heads || !live(m, c)) return;
  const int L = m.chunk_size, len = chunk_len(m, c);
  const int64_t t0 = m.cu_chunk_seqlen[c];
  const float A = p.A[h], bias = p.dt_bias ? p.dt_bias[h] : 0.0f;
  float* dto = ws.dt + (static_cast<int64_t>(c) * p.num_heads + h) * L;
  float* cso = ws.cs + (static_cast<int64_t>(c) * p.num_heads + h) * L;
  float carry = 0.0f;
  for (int l0 = 0; l0 < len; l0 += 32) {
    const int l = l0 + lane;
    float dt = 0.0f;
    if (l < len) {
      dt = softplus(in.dt.data[(t0 + l) * in.dt.stride + h] + bias);
      dt = fminf(fmaxf(dt, p.time_step_min), p.time_step_max);
    }
    float v = dt * A;
    for (int o = 1; o < 32; o <<= 1) {
      const float u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += u;
    }
    v += carry;
    if (l < len) dto[l] = dt, cso[l] = v;
    carry = __shfl_sync(0xffffffffu, v, 31);
  }
  if (lane == 0) ws.cs_last[static_cast<int64_t>(c) * p.num_heads + h] = carry;
}

/// Grid (nchunks, H, ceil(P / 64) * ceil(N / 64)): S_c[p0:+64, n0:+64] = sum_l x[l, p] w[l] B[l, n].
template <bool kExact>
__global__ void __launch_bounds__(kTileThreads, 2) chunk_state_kernel(SsdInputs in, SsdParams p, ChunkMetadataDev m,
                                                                    Ws ws) {
  const int c = blockIdx.x, h = blockIdx.y;
  if (!live(m, c)) return;
  const int P = p.head_dim, N = p.d_state, H = p.num_heads, L = m.chunk_size, len = chunk_len(m, c);
  const int pt = ceil_div(P, kTileM), p0 = (blockIdx.z % pt) * kTileM, n0 = (blockIdx.z / pt) * kTileN;
  const int g = h / (H / p.n_groups);
  const int64_t t0 = m.cu_chunk_seqlen[c], ch = static_cast<int64_t>(c) * H + h;
  __shared__ float smem[kTileSmemFloats];
  __shared__ float sw[kMaxChunk];
  extern __shared__ float raw[];  // kAsyncSmemFloats: the cp.async stages
  const float csl = ws.cs_last[ch];
  for (int l = threadIdx.x; l < len; l += kTileThreads) sw[l] = ws.dt[ch * L + l] * __expf(csl - ws.cs[ch * L + l]);
  __syncthreads();
  const float* x = in.x.data + t0 * in.x.stride + static_cast<int64_t>(h) * P;
  const float* B = in.B.data + t0 * in.B.stride + static_cast<int64_t>(g) * N;
  TileAcc acc;
  acc.zero();
  block_gemm_async<kExact, true, true>(
      acc, len,
      [&](int mi, int k) { return p0 + mi < P ? x + static_cast<int64_t>(k) * in.x.stride + p0 + mi : nullptr; },
      [&](int mi, int k, float v) { return p0 + mi < P ? v * sw[k] : 0.0f; },
      [&](int k, int ni) { return n0 + ni < N ? B + static_cast<int64_t>(k) * in.B.stride + n0 + ni : nullptr; },
      [&](int, int ni, float v) { return n0 + ni < N ? v : 0.0f; }, smem, raw, x);
  float* out = ws.states + ch * P * N;
  acc.for_each([&](int r, int col, float v) {
    if (p0 + r < P && n0 + col < N) out[static_cast<int64_t>(p0 + r) * N + n0 + col] = v;
  });
}

/// Grid (nchunks, G, ceil(L / 64)^2): CB[l, s] = C_l . B_s for the tiles on or below the diagonal.
template <bool kExact>
__global__ void __launch_bounds__(kTileThreads, 2) cb_kernel(SsdInputs in, SsdParams p, ChunkMetadataDev m, Ws ws) {
  const int c = blockIdx.x, g = blockIdx.y;
  if (!live(m, c)) return;
  const int L = m.chunk_size, len = chunk_len(m, c), nt = ceil_div(L, kTileM);
  const int l0 = (blockIdx.z / nt) * kTileM, s0 = (blockIdx.z % nt) * kTileN;
  if (s0 > l0 || l0 >= len) return;
  const int N = p.d_state;
  const int64_t t0 = m.cu_chunk_seqlen[c];
  const float* C = in.C.data + t0 * in.C.stride + static_cast<int64_t>(g) * N;
  const float* B = in.B.data + t0 * in.B.stride + static_cast<int64_t>(g) * N;
  __shared__ float smem[kTileSmemFloats];
  TileAcc acc;
  acc.zero();
  block_gemm<kExact, false, false>(
      acc, N, [&](int mi, int k) { return l0 + mi < len ? C[(l0 + mi) * in.C.stride + k] : 0.0f; },
      [&](int k, int ni) { return s0 + ni < len ? B[(s0 + ni) * in.B.stride + k] : 0.0f; }, smem);
  float* out = ws.cb + (static_cast<int64_t>(c) * p.n_groups + g) * L * L;
  acc.for_each([&](int r, int col, float v) {
    if (l0 + r < len && s0 + col < len) out[static_cast<int64_t>(l0 + r) * L + s0 + col] = v;
  });
}

/// "all" mode: element `at` of block `block`'s state (block 0: no store) = S in the state dtype TS.
template <class TS>
__device__ __forceinline__ void store_chunk_end(const SsdParams& p, int32_t block, int64_t at, float S) {
  if (block != 0) store(static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + at, S);
}

/// Grid (ceil(P * N / 256), H, num_seqs): walks sequence s's chunks, replacing S_c by the state entering chunk c,
/// writing chunk-end states when asked and the final state to the pool.
template <class TS>
__global__ void __launch_bounds__(256) state_pass_kernel(SsdParams p, ChunkMetadataDev m, Ws ws,
                                                         float* __restrict__ chunk_states) {
  const int s = blockIdx.z, h = blockIdx.y;
  const int32_t block = m.state_indices[s];
  const int64_t PN = static_cast<int64_t>(p.head_dim) * p.d_state;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (block == 0 || e >= PN) return;
  const int H = p.num_heads;
  TS* st = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + h * PN + e;
  float S = m.has_initial_states[s] ? load(st) : 0.0f;
  const int c_first = s == 0 ? 0 : m.last_chunk_indices[s - 1] + 1, c_last = m.last_chunk_indices[s];
  // Loads run one chunk ahead of the stores (the compiler cannot reorder them across the possibly aliasing
  // stores itself), so the walk is not one memory latency per chunk.
  int64_t ch = static_cast<int64_t>(c_first) * H + h;
  float local = ws.states[ch * PN + e], decay = expf(ws.cs_last[ch]);
  for (int c = c_first; c <= c_last; ++c) {
    const int64_t ch_next = ch + H;
    float local_next = 0.0f, decay_next = 0.0f;
    if (c < c_last) local_next = ws.states[ch_next * PN + e], decay_next = expf(ws.cs_last[ch_next]);
    ws.states[ch * PN + e] = S;
    S = decay * S + local;
    if (chunk_states) chunk_states[ch * PN + e] = S;
    if (m.chunk_store_blocks) store_chunk_end<TS>(p, m.chunk_store_blocks[c], h * PN + e, S);
    ch = ch_next, local = local_next, decay = decay_next;
  }
  store(st, S);
}

/// The bf16 tiles' state passing: as state_pass_kernel, but the entering states go to ws.states_h (bf16, the chunk
/// scan's operand) only, so ws.states is read-only here and the loads of kAhead chunks are issued together.
template <class TS>
__global__ void __launch_bounds__(256) state_pass_bf16_kernel(SsdParams p, ChunkMetadataDev m, Ws ws,
                                                              float* __restrict__ chunk_states) {
  constexpr int kAhead = 8;
  const int s = blockIdx.z, h = blockIdx.y;
  const int32_t block = m.state_indices[s];
  const int64_t PN = static_cast<int64_t>(p.head_dim) * p.d_state;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (block == 0 || e >= PN) return;
  const int H = p.num_heads;
  TS* st = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + h * PN + e;
  float S = m.has_initial_states[s] ? load(st) : 0.0f;
  const int c_first = s == 0 ? 0 : m.last_chunk_indices[s - 1] + 1, c_last = m.last_chunk_indices[s];
  for (int c0 = c_first; c0 <= c_last; c0 += kAhead) {
    float local[kAhead], cl[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int64_t ch = static_cast<int64_t>(c0 + j) * H + h;
      const bool ok = c0 + j <= c_last;
      local[j] = ok ? __ldg(ws.states + ch * PN + e) : 0.0f;
      cl[j] = ok ? __ldg(ws.cs_last + ch) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (c0 + j > c_last) break;
      const int64_t ch = static_cast<int64_t>(c0 + j) * H + h;
      ws.states_h[ch * PN + e] = __float2bfloat16_rn(S);
      S = expf(cl[j]) * S + local[j];
      if (chunk_states) chunk_states[ch * PN + e] = S;
      if (m.chunk_store_blocks) store_chunk_end<TS>(p, m.chunk_store_blocks[c0 + j], h * PN + e, S);
    }
  }
  store(st, S);
}

/// Grid (nchunks, H, ceil(L / 64) * ceil(P / 64)): y rows [l0, l0 + 64), columns [p0, p0 + 64) of head h.
template <bool kExact>
__global__ void __launch_bounds__(kTileThreads, 2) chunk_scan_kernel(SsdInputs in, SsdParams p, ChunkMetadataDev m,
                                                                   Ws ws, float* __restrict__ y, int64_t y_stride) {
  const int c = blockIdx.x, h = blockIdx.y;
  if (!live(m, c)) return;
  const int P = p.head_dim, N = p.d_state, H = p.num_heads, L = m.chunk_size, len = chunk_len(m, c);
  const int nt = ceil_div(L, kTileM), l0 = (blockIdx.z % nt) * kTileM, p0 = (blockIdx.z / nt) * kTileN;
  if (l0 >= len) return;
  const int g = h / (H / p.n_groups), seq = m.seq_idx[c];
  const bool has_state = (c > 0 && m.seq_idx[c - 1] == seq) || m.has_initial_states[seq] != 0;
  const int64_t t0 = m.cu_chunk_seqlen[c], ch = static_cast<int64_t>(c) * H + h;
  const int lmax = min(len, l0 + kTileM);
  __shared__ float smem[kTileSmemFloats];
  __shared__ float scs[kMaxChunk], sdt[kMaxChunk];
  extern __shared__ float raw[];  // kAsyncSmemFloats: the cp.async stages
  for (int l = threadIdx.x; l < lmax; l += kTileThreads) scs[l] = ws.cs[ch * L + l], sdt[l] = ws.dt[ch * L + l];
  __syncthreads();
  const float* x = in.x.data + t0 * in.x.stride + static_cast<int64_t>(h) * P;
  const float* cb = ws.cb + (static_cast<int64_t>(c) * p.n_groups + g) * L * L;
  TileAcc acc;
  acc.zero();
  // Intra-chunk: (CB . decay . dt)[l, s] x[s, p] over s < lmax (causal: s <= l).
  block_gemm_async<kExact, false, true>(
      acc, lmax,
      [&](int mi, int k) {
        const int l = l0 + mi;
        return (l < len && k <= l) ? cb + static_cast<int64_t>(l) * L + k : nullptr;
      },
      [&](int mi, int k, float v) {
        const int l = l0 + mi;
        return (l < len && k <= l) ? v * __expf(scs[l] - scs[k]) * sdt[k] : 0.0f;
      },
      [&](int k, int ni) { return p0 + ni < P ? x + static_cast<int64_t>(k) * in.x.stride + p0 + ni : nullptr; },
      [&](int, int ni, float v) { return p0 + ni < P ? v : 0.0f; }, smem, raw, x);
  // Inter-chunk: exp(cs[l]) C[l, :] s_in[p, :]^T.
  if (has_state) {
    const float* C = in.C.data + t0 * in.C.stride + static_cast<int64_t>(g) * N;
    const float* sin = ws.states + ch * P * N;
    block_gemm_async<kExact, false, false>(
        acc, N,
        [&](int mi, int k) { return l0 + mi < len ? C + static_cast<int64_t>(l0 + mi) * in.C.stride + k : nullptr; },
        [&](int mi, int, float v) { return l0 + mi < len ? v * __expf(scs[l0 + mi]) : 0.0f; },
        [&](int k, int ni) { return p0 + ni < P ? sin + static_cast<int64_t>(p0 + ni) * N + k : nullptr; },
        [&](int, int ni, float v) { return p0 + ni < P ? v : 0.0f; }, smem, raw, x);
  }
  const float Dh = p.D ? p.D[h] : 0.0f;
  acc.for_each([&](int r, int col, float v) {
    const int l = l0 + r, pp = p0 + col;
    if (l < len && pp < P) y[(t0 + l) * y_stride + static_cast<int64_t>(h) * P + pp] = v + Dh * x[l * in.x.stride + pp];
  });
}

cudaError_t launch_state_pass(const SsdParams& p, const ChunkMetadataDev& m, const Ws& ws, float* chunk_states,
                              cudaStream_t stream) {
  const dim3 grid(ceil_div(static_cast<int64_t>(p.head_dim) * p.d_state, 256), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(m.num_seqs));
  return visit_dtype(p.ssm_states.dtype, [&](auto tag) {
    if (ws.states_h)
      state_pass_bf16_kernel<decltype(tag)><<<grid, 256, 0, stream>>>(p, m, ws, chunk_states);
    else
      state_pass_kernel<decltype(tag)><<<grid, 256, 0, stream>>>(p, m, ws, chunk_states);
    return launch_status();
  });
}

/// The bf16 tiles (ssd_chunked_bf16.cu): cumsum, bf16 copies of x / B / C (unless ws already holds the caller's),
/// C B^T (fp32 out), state passing (writing the bf16 chunk-entry states), chunk states, chunk scan.
cudaError_t launch_bf16(const SsdInputs& in, const SsdParams& p, const ChunkMetadataDev& m, Ws ws, float* y,
                        int64_t y_stride, float* chunk_states, __nv_bfloat16* convert_to,
                        cudaStream_t stream) {
  const unsigned nc = static_cast<unsigned>(m.nchunks), H = static_cast<unsigned>(p.num_heads);
  LaunchProfile prof(stream);
  cumsum_kernel<<<dim3(nc, ceil_div(H, 8)), 256, 0, stream>>>(in, p, m, ws);
  prof.mark("ssd cumsum");
  if (convert_to) {  // ws.xh / bh / ch become the padded copies
    const int64_t T = static_cast<int64_t>(m.nchunks) * m.chunk_size;
    __nv_bfloat16* xh = convert_to;
    __nv_bfloat16* bh = xh + T * ws.xh_stride;
    __nv_bfloat16* ch = bh + T * ws.bh_stride;
    ws.xh = xh, ws.bh = bh, ws.ch = ch;
    if (const cudaError_t e = ssd_bf16_convert(in, p, m, ws, xh, bh, ch, stream); e != cudaSuccess) return e;
    prof.mark("ssd bf16 convert");
  }
  if (const cudaError_t e = ssd_bf16_chunk_state(p, m, ws, stream); e != cudaSuccess) return e;
  prof.mark("ssd bf16 chunk_state");
  if (const cudaError_t e = ssd_bf16_cb(p, m, ws, stream); e != cudaSuccess) return e;
  prof.mark("ssd bf16 cb");
  if (const cudaError_t e = launch_state_pass(p, m, ws, chunk_states, stream); e != cudaSuccess) return e;
  prof.mark("ssd state_pass");
  const cudaError_t e = ssd_bf16_chunk_scan(in, p, m, ws, y, y_stride, stream);
  prof.mark("ssd bf16 chunk_scan");
  return e;
}

/// The chunk-state / chunk-scan tiles go through the cp.async pipeline (block_gemm_async).
template <bool kExact>
cudaError_t launch_all(const SsdInputs& in, const SsdParams& p, const ChunkMetadataDev& m, Ws ws, float* y,
                       int64_t y_stride, float* chunk_states, cudaStream_t stream) {
  const unsigned nc = static_cast<unsigned>(m.nchunks), H = static_cast<unsigned>(p.num_heads);
  const int L = m.chunk_size, nt = ceil_div(L, kTileM);
  LaunchProfile prof(stream);
  cumsum_kernel<<<dim3(nc, ceil_div(H, 8)), 256, 0, stream>>>(in, p, m, ws);
  prof.mark("ssd cumsum");
  constexpr int kRawBytes = kAsyncSmemFloats * sizeof(float);  // the cp.async stages (dynamic)
  // Per call, not once per process: the attribute belongs to the current device (tensor-parallel ranks).
  for (const void* k : {reinterpret_cast<const void*>(chunk_state_kernel<kExact>),
                        reinterpret_cast<const void*>(chunk_scan_kernel<kExact>)})
    if (const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kRawBytes);
        e != cudaSuccess)
      return e;
  chunk_state_kernel<kExact><<<dim3(nc, H, ceil_div(p.head_dim, kTileM) * ceil_div(p.d_state, kTileN)),
                               kTileThreads, kRawBytes, stream>>>(in, p, m, ws);
  prof.mark("ssd chunk_state");
  cb_kernel<kExact><<<dim3(nc, static_cast<unsigned>(p.n_groups), nt * nt), kTileThreads, 0, stream>>>(in, p, m, ws);
  prof.mark("ssd cb");
  if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;
  const cudaError_t e = launch_state_pass(p, m, ws, chunk_states, stream);
  prof.mark("ssd state_pass");
  if (e != cudaSuccess) return e;
  chunk_scan_kernel<kExact><<<dim3(nc, H, nt * ceil_div(p.head_dim, kTileN)), kTileThreads, kRawBytes, stream>>>(
      in, p, m, ws, y, y_stride);
  prof.mark("ssd chunk_scan");
  return launch_status();
}

}  // namespace

namespace {
struct WsLayout {
  int64_t n_cs, n_last, n_st, n_cb;
  int64_t n_cv = 0, n_sh = 0;  // bf16 tiles only (floats: two bf16 each): convert's copies, chunk-entry states
  int Pp = 0, Np = 0;
  /// reads_copies: the bf16 tiles read the caller's x / B / C rows (ssd_uses_bf16_copies), so no converted copies.
  WsLayout(const SsdParams& p, int64_t nc, int64_t L, bool reads_copies) {
    const auto up = [](int64_t n) { return (n + 63) / 64 * 64; };  // 256-byte aligned pieces
    const int64_t H = p.num_heads;
    n_cs = up(nc * H * L), n_last = up(nc * H), n_st = up(nc * H * p.head_dim * p.d_state),
    n_cb = up(nc * p.n_groups * L * L);
    if (ssd_bf16_tiles(p, static_cast<int>(L))) {
      Pp = ssd_pad_head_dim(p.head_dim), Np = ssd_pad_d_state(p.d_state);
      // x rows [nc * L, H * Pp], then B and C rows [nc * L, G * Np] (each piece a multiple of 16 bytes)
      if (!reads_copies) n_cv = up((nc * L * (H * Pp + 2 * p.n_groups * Np) + 1) / 2);
      n_sh = up((n_st + 1) / 2);
    }
  }
  size_t bytes() const { return static_cast<size_t>(2 * n_cs + n_last + n_st + n_cb + n_cv + n_sh) * sizeof(float); }
};

bool aligned16(const void* ptr, int64_t stride) {
  return ptr && reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && stride % 8 == 0 && stride > 0;
}
}  // namespace

bool ssd_uses_bf16_copies(const SsdInputs& in, const SsdParams& p, int chunk_size) {
  const int64_t HP = static_cast<int64_t>(p.num_heads) * p.head_dim, GN = static_cast<int64_t>(p.n_groups) * p.d_state;
  return chunk_size >= 8 && chunk_size <= kMaxChunk && ssd_bf16_tiles(p, chunk_size) && p.head_dim % 64 == 0 &&
         p.d_state % 128 == 0 && aligned16(in.x_h.data, in.x_h.stride) && aligned16(in.B_h.data, in.B_h.stride) &&
         aligned16(in.C_h.data, in.C_h.stride) && in.x_h.stride >= HP && in.B_h.stride >= GN && in.C_h.stride >= GN;
}

size_t ssd_workspace_bytes(const SsdParams& p, int64_t nchunks, int chunk_size, const SsdInputs* in) {
  return WsLayout(p, nchunks, chunk_size, in && ssd_uses_bf16_copies(*in, p, chunk_size)).bytes();
}

cudaError_t ssd_chunked_fwd(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadataDev& m, float* y,
                            int64_t y_stride, float* chunk_states, cudaStream_t stream) {
  if (m.chunk_size < 1 || m.chunk_size > kMaxChunk || !m.seq_idx) return cudaErrorInvalidValue;
  if (m.nchunks == 0 || m.num_seqs == 0) return cudaSuccess;
  const bool reads_copies = ssd_uses_bf16_copies(in, p, m.chunk_size);
  const WsLayout lay(p, m.nchunks, m.chunk_size, reads_copies);
  void* base = m.workspace;
  const bool own = base == nullptr || m.workspace_bytes < lay.bytes();
  if (own) {
    keep_pool_memory();
    if (const cudaError_t e = cudaMallocAsync(&base, lay.bytes(), stream); e != cudaSuccess) return e;
  }
  Ws ws;
  ws.dt = static_cast<float*>(base);
  ws.cs = ws.dt + lay.n_cs;
  ws.cs_last = ws.cs + lay.n_cs;
  ws.states = ws.cs_last + lay.n_last;
  ws.cb = ws.states + lay.n_st;
  cudaError_t e = cudaSuccess;
  if (lay.n_sh > 0) {
    float* f = ws.cb + lay.n_cb;
    ws.states_h = reinterpret_cast<__nv_bfloat16*>(f + lay.n_cv);
    __nv_bfloat16* convert_to = nullptr;
    if (reads_copies) {
      ws.xh = static_cast<const __nv_bfloat16*>(in.x_h.data), ws.xh_stride = in.x_h.stride;
      ws.bh = static_cast<const __nv_bfloat16*>(in.B_h.data), ws.bh_stride = in.B_h.stride;
      ws.ch = static_cast<const __nv_bfloat16*>(in.C_h.data), ws.ch_stride = in.C_h.stride;
      ws.Pp = p.head_dim, ws.Np = p.d_state;
    } else {
      convert_to = reinterpret_cast<__nv_bfloat16*>(f);
      ws.Pp = lay.Pp, ws.Np = lay.Np;
      ws.xh_stride = static_cast<int64_t>(p.num_heads) * lay.Pp;
      ws.bh_stride = ws.ch_stride = static_cast<int64_t>(p.n_groups) * lay.Np;
    }
    e = launch_bf16(in, p, m, ws, y, y_stride, chunk_states, convert_to, stream);
  } else {
    e = p.exact_products ? launch_all<true>(in, p, m, ws, y, y_stride, chunk_states, stream)
                         : launch_all<false>(in, p, m, ws, y, y_stride, chunk_states, stream);
  }
  const cudaError_t f = own ? cudaFreeAsync(base, stream) : cudaSuccess;
  return e != cudaSuccess ? e : f;
}

}  // namespace ssmserve::cuda
