// Owns the chunk-parallel Mamba-1 selective scan prefill (see selective_scan.h, selective_scan_chunked_fwd): the
// sequential recurrence s_t = exp(dt_t A) s_{t-1} + dt_t B_t u_t is linear in s, so a chunk's end state from
// state s_in is exp(A sum dt) s_in + s_local (its end state from zero). Pass 1 finds (s_local, sum dt) of every
// chunk in parallel, pass 2 carries s_in along each sequence's chunks (and writes the final state back), pass 3
// rescans every chunk from its s_in for y (fp32, or bf16 for the next GEMM). One thread per channel holds its
// d_state <= 16 states in registers; B_t and C_t are staged in shared memory 64 tokens at a time (the same for
// every channel; small stages keep many blocks per SM), and each thread's per-token inputs are loaded 4 tokens
// ahead of the recurrence (measured on the H200: the walk was bound by load latency, not by its 16 MUFU exps per
// token). Decays are exp2(dt * A log2 e), one MUFU op each (moving a share of them to an FMA-pipe polynomial was
// measured slower: the walk is issue-bound once loads are hidden; so was reading u from the conv's bf16 copy).
// Workspace [floats]: s_local / s_in [nchunks, 16, dim] and sum dt [nchunks, dim] from the caller or the pool.
#include <cuda_bf16.h>


#include "kernels/cuda/common.cuh"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kNS = 16;        // states per thread (d_state <= 16, padded with A = B = 0)
constexpr int kMaxChunk = 256;
constexpr int kThreads = 128;  // channels per block
constexpr int kStage = 64;     // tokens of B / C staged in shared memory at a time
constexpr int kAhead = 4;      // tokens whose delta / u / z loads are in flight ahead of the scan (kStage % kAhead == 0)
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ bool live(const ChunkMetadataDev& m, int c) { return m.state_indices[m.seq_idx[c]] != 0; }

/// Element i of a state buffer of dtype `t` = v, rounded as store() rounds (pass 3's "all"-mode stores: the kernel is
/// not templated on the state dtype).
__device__ __forceinline__ void store_as(DType t, void* base, int64_t i, float v) {
  if (t == DType::BF16) store(static_cast<__nv_bfloat16*>(base) + i, v);
  else if (t == DType::F16) store(static_cast<__half*>(base) + i, v);
  else store(static_cast<float*>(base) + i, v);
}

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/// softplus(x) = log1p(exp(x)) (x <= 20, else x) with the MUFU exp (log1pf stays exact: dt is often ~1e-3).
__device__ __forceinline__ float softplus_fast(float x) { return x <= 20.0f ? log1pf(__expf(x)) : x; }
/// SiLU(x) = x / (1 + exp(-x)) with the MUFU exp and division (relative error ~1e-7).
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

/// Stages rows [l0, l0 + n) of the chunk's B (or C) [len, N] into s[n][kNS], zero-padded.
__device__ __forceinline__ void stage(float (*s)[kNS], const DevRows& src, int64_t t0, int l0, int n, int N) {
  for (int i = threadIdx.x; i < n * kNS; i += kThreads) {
    const int l = i / kNS, k = i % kNS;
    s[l][k] = k < N ? src.data[(t0 + l0 + l) * src.stride + k] : 0.0f;
  }
}

/// Grid (ceil(dim / 128), nchunks). kOut = false: pass 1 (from zero; writes s_local, sum dt). kOut = true: pass 3
/// (from s_in; writes y as TY).
template <bool kOut, class TY>
__global__ void __launch_bounds__(kThreads) chunk_kernel(ScanInputs in, ScanParams p, ChunkMetadataDev m,
                                                          float* __restrict__ hs, float* __restrict__ sumdt,
                                                          TY* __restrict__ y, int64_t y_stride,
                                                          const int32_t* __restrict__ qsl) {
  const int c = blockIdx.y;
  if (!live(m, c)) return;
  const int N = p.d_state;
  const int64_t dim = p.dim, t0 = m.cu_chunk_seqlen[c];
  const int len = min(m.cu_chunk_seqlen[c + 1] - m.cu_chunk_seqlen[c], m.chunk_size);
  // "all" mode (pass 3): the stores of the chunk's row that fall in it, by row offset (`next` = -1: none left).
  int si = 0, si_end = 0, r0 = 0;  // r0: the chunk's first token as a row offset
  if (kOut && m.stores.num > 0) {
    const int row = m.seq_idx[c];
    r0 = static_cast<int>(t0 - qsl[row]);
    si = m.stores.start[row], si_end = m.stores.start[row + 1];
    while (si < si_end && m.stores.offset[si] <= r0) ++si;
  }
  int next = si < si_end ? m.stores.offset[si] : -1;
  __shared__ float sB[kStage][kNS];
  __shared__ float sC[kOut ? kStage : 1][kNS];
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const bool valid = ch < dim;
  const int64_t cc = valid ? ch : 0;  // invalid lanes compute on channel 0 and store nothing (they stage B / C)
  float a[kNS], st[kNS];
#pragma unroll
  for (int n = 0; n < kNS; ++n) {
    a[n] = n < N ? p.A[cc * N + n] * kLog2e : 0.0f;
    st[n] = kOut ? hs[(static_cast<int64_t>(c) * kNS + n) * dim + cc] : 0.0f;
  }
  const float dbias = p.delta_bias ? p.delta_bias[cc] : 0.0f, Dc = p.D ? p.D[cc] : 0.0f;
  const bool gate = kOut && in.z.data != nullptr;
  const float* dp = in.delta.data + t0 * in.delta.stride + cc;
  const float* up = in.u.data + t0 * in.u.stride + cc;
  const float* zp = gate ? in.z.data + t0 * in.z.stride + cc : nullptr;
  // The per-token inputs of the next kAhead tokens are loaded while the current kAhead are scanned (several
  // loads in flight per thread: the walk is otherwise bound by memory latency, not by its arithmetic).
  float cd[kAhead], cu[kAhead], cz[kAhead], nd[kAhead], nu[kAhead], nz[kAhead];
  const auto fetch = [&](int l0, float* d, float* u, float* z) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int l = l0 + i;
      const bool ok = l < len;
      d[i] = ok ? dp[static_cast<int64_t>(l) * in.delta.stride] : 0.0f;
      u[i] = ok ? up[static_cast<int64_t>(l) * in.u.stride] : 0.0f;
      z[i] = (ok && gate) ? zp[static_cast<int64_t>(l) * in.z.stride] : 0.0f;
    }
  };
  fetch(0, cd, cu, cz);
  float sum = 0.0f;
  for (int l0 = 0; l0 < len; l0 += kStage) {
    const int n_st = min(kStage, len - l0);
    __syncthreads();  // the previous stage is consumed
    stage(sB, in.B, t0, l0, n_st, N);
    if (kOut) stage(sC, in.C, t0, l0, n_st, N);
    __syncthreads();
    for (int j0 = 0; j0 < n_st; j0 += kAhead) {
      fetch(l0 + j0 + kAhead, nd, nu, nz);
#pragma unroll
      for (int i = 0; i < kAhead; ++i) {
        const int j = j0 + i;
        if (j < n_st) {  // uniform over the block
          float dt = cd[i] + dbias;
          if (p.delta_softplus) dt = softplus_fast(dt);
          const float u = cu[i], du = dt * u;
          float acc = 0.0f;
#pragma unroll
          for (int n = 0; n < kNS; ++n) {
            const float x = dt * a[n];
            st[n] = fast_exp2(x) * st[n] + du * sB[j][n];
            if (kOut) acc += st[n] * sC[j][n];
          }
          if (kOut) {
            float out = acc + Dc * u;
            if (gate) out *= silu_fast(cz[i]);
            if (valid) store(y + (t0 + l0 + j) * y_stride + ch, out);
            if (r0 + l0 + j + 1 == next) {  // uniform over the block
              const int64_t at = m.stores.block[si] * p.ssm_states.block_stride + ch * N;
              if (valid)
#pragma unroll
                for (int n = 0; n < kNS; ++n)
                  if (n < N) store_as(p.ssm_states.dtype, p.ssm_states.data, at + n, st[n]);
              ++si;
              next = si < si_end ? m.stores.offset[si] : -1;
            }
          } else {
            sum += dt;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kAhead; ++i) cd[i] = nd[i], cu[i] = nu[i], cz[i] = nz[i];
    }
  }
  if (!kOut && valid) {
#pragma unroll
    for (int n = 0; n < kNS; ++n) hs[(static_cast<int64_t>(c) * kNS + n) * dim + ch] = st[n];
    sumdt[static_cast<int64_t>(c) * dim + ch] = sum;
  }
}

/// Pass 2. Grid (ceil(dim * N / 256), num_seqs): element e = n * dim + channel walks sequence s's chunks, its
/// loads one chunk ahead of its stores.
template <class TS>
__global__ void __launch_bounds__(256) carry_kernel(ScanParams p, ChunkMetadataDev m, float* __restrict__ hs,
                                                    const float* __restrict__ sumdt) {
  const int s = blockIdx.y;
  const int32_t block = m.state_indices[s];
  const int64_t dim = p.dim, e = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (block == 0 || e >= dim * p.d_state) return;
  const int n = static_cast<int>(e / dim);
  const int64_t ch = e % dim;
  TS* st = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + ch * p.d_state + n;
  const float a = p.A[ch * p.d_state + n];
  float S = m.has_initial_states[s] ? load(st) : 0.0f;
  const int c_first = s == 0 ? 0 : m.last_chunk_indices[s - 1] + 1, c_last = m.last_chunk_indices[s];
  float local = hs[(static_cast<int64_t>(c_first) * kNS + n) * dim + ch];
  float sd = sumdt[static_cast<int64_t>(c_first) * dim + ch];
  for (int c = c_first; c <= c_last; ++c) {
    float local_next = 0.0f, sd_next = 0.0f;
    if (c < c_last) {
      local_next = hs[(static_cast<int64_t>(c + 1) * kNS + n) * dim + ch];
      sd_next = sumdt[static_cast<int64_t>(c + 1) * dim + ch];
    }
    hs[(static_cast<int64_t>(c) * kNS + n) * dim + ch] = S;
    S = expf(a * sd) * S + local;
    local = local_next, sd = sd_next;
  }
  store(st, S);
}

}  // namespace

size_t scan_workspace_bytes(int64_t dim, int64_t nchunks) {
  return static_cast<size_t>((nchunks * kNS * dim + 63) / 64 * 64 + nchunks * dim) * sizeof(float);
}

cudaError_t selective_scan_chunked_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                                       const ChunkMetadataDev& m, const int32_t* query_start_loc,
                                       cudaStream_t stream) {
  return selective_scan_chunked_fwd_out(in, p, y, DType::F32, y_stride, m, query_start_loc, stream);
}

cudaError_t selective_scan_chunked_fwd_out(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                           int64_t y_stride, const ChunkMetadataDev& m,
                                           const int32_t* query_start_loc, cudaStream_t stream) {
  if (y_dtype != DType::F32 && y_dtype != DType::BF16) return cudaErrorInvalidValue;
  if (p.d_state > kNS || m.chunk_size < 1 || m.chunk_size > kMaxChunk || !m.seq_idx || !m.cu_chunk_seqlen ||
      !m.last_chunk_indices) {
    if (y_dtype != DType::F32) return cudaErrorInvalidValue;  // the sequential form writes fp32 only
    return selective_scan_fwd(in, p, static_cast<float*>(y), y_stride, query_start_loc, m.state_indices,
                              m.has_initial_states, m.num_seqs, stream, m.stores);
  }
  if (p.dim < 1 || p.d_state < 1 || p.A == nullptr || y_stride < p.dim || in.u.stride < p.dim ||
      in.delta.stride < p.dim || in.B.stride < p.d_state || in.C.stride < p.d_state ||
      (in.z.data && in.z.stride < p.dim) || p.ssm_states.data == nullptr || m.num_seqs < 0 || m.num_seqs > 65535 ||
      m.nchunks < 0 || m.nchunks > 65535 || !m.state_indices || !m.has_initial_states ||
      (m.stores.num > 0 && (!query_start_loc || !m.stores.start || !m.stores.offset || !m.stores.block)))
    return cudaErrorInvalidValue;
  if (m.num_seqs == 0 || m.nchunks == 0) return cudaSuccess;
  const int64_t nc = m.nchunks, dim = p.dim;
  const int64_t n_hs = (nc * kNS * dim + 63) / 64 * 64;
  void* base = m.workspace;
  const bool own = base == nullptr || m.workspace_bytes < scan_workspace_bytes(dim, nc);
  if (own) {
    keep_pool_memory();
    if (const cudaError_t e = cudaMallocAsync(&base, scan_workspace_bytes(dim, nc), stream); e != cudaSuccess)
      return e;
  }
  float* hs = static_cast<float*>(base);
  float* sumdt = hs + n_hs;
  const dim3 grid(ceil_div(dim, kThreads), static_cast<unsigned>(nc));
  LaunchProfile prof(stream);
  chunk_kernel<false, float><<<grid, kThreads, 0, stream>>>(in, p, m, hs, sumdt, nullptr, y_stride, query_start_loc);
  prof.mark("scan pass 1 (local)");
  cudaError_t e = launch_status();
  if (e == cudaSuccess)
    e = visit_dtype(p.ssm_states.dtype, [&](auto tag) {
      carry_kernel<decltype(tag)><<<dim3(ceil_div(dim * p.d_state, 256), static_cast<unsigned>(m.num_seqs)), 256, 0,
                                    stream>>>(p, m, hs, sumdt);
      return launch_status();
    });
  prof.mark("scan pass 2 (carry)");
  if (e == cudaSuccess) {
    if (y_dtype == DType::BF16)
      chunk_kernel<true, __nv_bfloat16><<<grid, kThreads, 0, stream>>>(in, p, m, hs, sumdt,
                                                                      static_cast<__nv_bfloat16*>(y), y_stride,
                                                                      query_start_loc);
    else
      chunk_kernel<true, float><<<grid, kThreads, 0, stream>>>(in, p, m, hs, sumdt, static_cast<float*>(y), y_stride,
                                                              query_start_loc);
    e = launch_status();
  }
  prof.mark("scan pass 3 (output)");
  const cudaError_t f = own ? cudaFreeAsync(base, stream) : cudaSuccess;
  return e != cudaSuccess ? e : f;
}

}  // namespace ssmserve::cuda
