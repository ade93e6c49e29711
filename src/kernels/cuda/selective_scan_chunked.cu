// Owns the chunk-parallel Mamba-1 selective scan prefill (see selective_scan.h, selective_scan_chunked_fwd): the
// sequential recurrence s_t = exp(dt_t A) s_{t-1} + dt_t B_t u_t is linear in s, so a chunk's end state from
// state s_in is exp(A sum dt) s_in + s_local (its end state from zero). Pass 1 finds (s_local, sum dt) of every
// chunk in parallel, pass 2 carries s_in along each sequence's chunks (and writes the final state back), pass 3
// rescans every chunk from its s_in for y. One thread per channel holds its d_state <= 16 states in registers;
// B_t and C_t of the chunk are staged in shared memory (the same for every channel). Workspace [floats]:
// s_local / s_in [nchunks, 16, dim] and sum dt [nchunks, dim] from the stream-ordered pool.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kNS = 16;        // states per thread (d_state <= 16, padded with A = B = 0)
constexpr int kMaxChunk = 256;
constexpr int kThreads = 128;  // channels per block

__device__ __forceinline__ bool live(const ChunkMetadataDev& m, int c) { return m.state_indices[m.seq_idx[c]] != 0; }

/// Stages rows [0, len) of the chunk's B (or C) [len, N] into s[len][kNS], zero-padded.
__device__ __forceinline__ void stage(float (*s)[kNS], const DevRows& src, int64_t t0, int len, int N) {
  for (int i = threadIdx.x; i < len * kNS; i += kThreads) {
    const int l = i / kNS, n = i % kNS;
    s[l][n] = n < N ? src.data[(t0 + l) * src.stride + n] : 0.0f;
  }
}

/// Grid (ceil(dim / 128), nchunks). kOut = false: pass 1 (from zero; writes s_local, sum dt). kOut = true: pass 3
/// (from s_in; writes y).
template <bool kOut>
__global__ void __launch_bounds__(kThreads) chunk_kernel(ScanInputs in, ScanParams p, ChunkMetadataDev m,
                                                          float* __restrict__ hs, float* __restrict__ sumdt,
                                                          float* __restrict__ y, int64_t y_stride) {
  const int c = blockIdx.y;
  if (!live(m, c)) return;
  const int N = p.d_state;
  const int64_t dim = p.dim, t0 = m.cu_chunk_seqlen[c];
  const int len = min(m.cu_chunk_seqlen[c + 1] - m.cu_chunk_seqlen[c], m.chunk_size);
  __shared__ float sB[kMaxChunk][kNS];
  __shared__ float sC[kOut ? kMaxChunk : 1][kNS];
  stage(sB, in.B, t0, len, N);
  if (kOut) stage(sC, in.C, t0, len, N);
  __syncthreads();
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (ch >= dim) return;
  float a[kNS], st[kNS];
#pragma unroll
  for (int n = 0; n < kNS; ++n) {
    a[n] = n < N ? p.A[ch * N + n] : 0.0f;
    st[n] = kOut ? hs[(static_cast<int64_t>(c) * kNS + n) * dim + ch] : 0.0f;
  }
  const float dbias = p.delta_bias ? p.delta_bias[ch] : 0.0f, Dc = p.D ? p.D[ch] : 0.0f;
  float sum = 0.0f;
#pragma unroll 4
  for (int l = 0; l < len; ++l) {
    const int64_t t = t0 + l;
    float dt = in.delta.data[t * in.delta.stride + ch] + dbias;
    if (p.delta_softplus) dt = softplus(dt);
    const float u = in.u.data[t * in.u.stride + ch];
    const float zv = (kOut && in.z.data) ? in.z.data[t * in.z.stride + ch] : 0.0f;
    const float du = dt * u;
    float acc = 0.0f;
#pragma unroll
    for (int n = 0; n < kNS; ++n) {
      st[n] = __expf(dt * a[n]) * st[n] + du * sB[l][n];
      if (kOut) acc += st[n] * sC[l][n];
    }
    if (kOut) {
      float out = acc + Dc * u;
      if (in.z.data) out *= silu(zv);
      y[t * y_stride + ch] = out;
    } else {
      sum += dt;
    }
  }
  if (!kOut) {
#pragma unroll
    for (int n = 0; n < kNS; ++n) hs[(static_cast<int64_t>(c) * kNS + n) * dim + ch] = st[n];
    sumdt[static_cast<int64_t>(c) * dim + ch] = sum;
  }
}

/// Pass 2. Grid (ceil(dim * N / 256), num_seqs): element e = n * dim + channel walks sequence s's chunks.
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
  for (int c = c_first; c <= c_last; ++c) {
    float* h = hs + (static_cast<int64_t>(c) * kNS + n) * dim + ch;
    const float local = *h;
    *h = S;
    S = expf(a * sumdt[static_cast<int64_t>(c) * dim + ch]) * S + local;
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
  if (p.d_state > kNS || m.chunk_size < 1 || m.chunk_size > kMaxChunk || !m.seq_idx || !m.cu_chunk_seqlen ||
      !m.last_chunk_indices)
    return selective_scan_fwd(in, p, y, y_stride, query_start_loc, m.state_indices, m.has_initial_states, m.num_seqs,
                              stream);
  if (p.dim < 1 || p.d_state < 1 || p.A == nullptr || y_stride < p.dim || in.u.stride < p.dim ||
      in.delta.stride < p.dim || in.B.stride < p.d_state || in.C.stride < p.d_state ||
      (in.z.data && in.z.stride < p.dim) || p.ssm_states.data == nullptr || m.num_seqs < 0 || m.num_seqs > 65535 ||
      m.nchunks < 0 || !m.state_indices || !m.has_initial_states)
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
  chunk_kernel<false><<<grid, kThreads, 0, stream>>>(in, p, m, hs, sumdt, y, y_stride);
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
    chunk_kernel<true><<<grid, kThreads, 0, stream>>>(in, p, m, hs, sumdt, y, y_stride);
    e = launch_status();
  }
  prof.mark("scan pass 3 (output)");
  const cudaError_t f = own ? cudaFreeAsync(base, stream) : cudaSuccess;
  return e != cudaSuccess ? e : f;
}

}  // namespace ssmserve::cuda
