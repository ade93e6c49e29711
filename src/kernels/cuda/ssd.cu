// Owns the GPU Mamba-2 SSD scan (see ssd.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ssd.h"
#include "kernels/cuda/ssd_decode_math.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = kSsdRowsPerWarp;         // rows of P per warp
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;  // 16
constexpr int kMaxPerLane = kSsdMaxPerLane;           // N <= 256

/// Advances rows [p0, p0 + kRowsPerWarp) of head h over tokens [t0, t1), writing y rows (y_row0 + t - t0).
__device__ __forceinline__ void advance(const SsdInputs& in, const SsdParams& p, int h, int g, int p0, int lane,
                                        float (&st)[kRowsPerWarp][kMaxPerLane], int64_t t0, int64_t t1, float* y,
                                        int64_t y_stride, int64_t y_row0) {
  const int N = p.d_state, P = p.head_dim;
  const float Dh = p.D ? p.D[h] : 0.0f;
  for (int64_t t = t0; t < t1; ++t) {
    float dt, dA;
    ssd_dt(p, h, in.dt.data[t * in.dt.stride + h], dt, dA);
    const float* xt = in.x.data + t * in.x.stride + static_cast<int64_t>(h) * P;
    const float* Bt = in.B.data + t * in.B.stride + static_cast<int64_t>(g) * N;
    const float* Ct = in.C.data + t * in.C.stride + static_cast<int64_t>(g) * N;
    const float mine = ssd_token_rows(st, N, P, p0, lane, dt, dA, Dh, xt + p0, Bt, Ct);
    if (lane < kRowsPerWarp && p0 + lane < P)
      y[(y_row0 + t - t0) * y_stride + static_cast<int64_t>(h) * P + p0 + lane] = mine;
  }
}

/// Rounds v to the state dtype TS and back (a verify row's state between its tokens equals the stored one).
template <class TS>
__device__ __forceinline__ float state_round(float v) {
  TS t;
  store(&t, v);
  return load(&t);
}

/// Before the PDL wait of a decode kernel (KernelTuning::decode_prewait): the block's threads hint the L2 to fetch the
/// block's state rows [r0, r0 + rows) of head h in state block blk (0: none), which no kernel of the step writes
/// before the update. A hint only: never a result.
template <class TS>
__device__ __forceinline__ void prefetch_state_rows(const SsdParams& p, int32_t blk, int h, int r0, int rows) {
  const int P = p.head_dim, N = p.d_state, nr = min(rows, P - r0);
  if (blk == 0 || nr <= 0) return;
  const TS* base = static_cast<const TS*>(p.ssm_states.data) + blk * p.ssm_states.block_stride;
  const char* first = reinterpret_cast<const char*>(base + (static_cast<int64_t>(h) * P + r0) * N);
  const int64_t bytes = static_cast<int64_t>(nr) * N * static_cast<int64_t>(sizeof(TS));
  for (int64_t o = static_cast<int64_t>(threadIdx.x) * 128; o < bytes; o += static_cast<int64_t>(blockDim.x) * 128)
    pdl_prefetch_l2(first + o);
  if (threadIdx.x == 0) pdl_prefetch_l2(first + bytes - 1);  // the last line when the rows do not start on one
}

/// Grid (ceil(P / 16), H, sequences or decode rows). Prefill walks the sequence's chunks in order (its state block:
/// rows.state_indices[s]); decode walks the row's tokens (device_decode_rows.h), token j reading column j - 1's state
/// (held in registers) and storing the state after it into column j.
template <class TS>
__global__ void __launch_bounds__(kWarps * 32) ssd_kernel(SsdInputs in, SsdParams p, SsdChunkMetadataDev meta,
                                                           float* __restrict__ y, int64_t y_stride,
                                                           float* __restrict__ chunk_states, bool decode,
                                                           DeviceDecodeRows rows, bool prewait) {
  if (prewait)
    prefetch_state_rows<TS>(p, rows.src_block(blockIdx.z, 0), blockIdx.y, blockIdx.x * kRowsPerBlock, kRowsPerBlock);
  pdl_wait();
  pdl_launch_dependents();
  const int s = blockIdx.z, h = blockIdx.y;
  if (rows.is_null(s)) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int p0 = blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp;
  if (p0 >= p.head_dim) return;  // whole warp
  const int N = p.d_state, P = p.head_dim;
  const int g = h / (p.num_heads / p.n_groups);
  const int64_t head_elems = static_cast<int64_t>(P) * N;
  TS* const base = static_cast<TS*>(p.ssm_states.data) + h * head_elems;
  auto block_state = [&](int32_t blk) { return base + blk * p.ssm_states.block_stride; };
  TS* state = block_state(rows.src_block(s, 0));
  const bool init = decode ? true : meta.has_initial_states[s] != 0;

  float st[kRowsPerWarp][kMaxPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int n = lane + 32 * k, pr = p0 + r;
      st[r][k] = (init && n < N && pr < P) ? load(state + static_cast<int64_t>(pr) * N + n) : 0.0f;
    }

  if (decode) {
    const int nt = rows.num_tokens(s);
    const int64_t t0 = rows.first_token(s);
    for (int j = 0; j < nt; ++j) {
      advance(in, p, h, g, p0, lane, st, t0 + j, t0 + j + 1, y, y_stride, t0 + j);
      state = block_state(rows.dst_block(s, j));
      if (j + 1 == nt) break;  // the last token's state is stored below
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
        for (int k = 0; k < kMaxPerLane; ++k) {
          const int n = lane + 32 * k, pr = p0 + r;
          if (n < N && pr < P) {
            store(state + static_cast<int64_t>(pr) * N + n, st[r][k]);
            st[r][k] = state_round<TS>(st[r][k]);  // the next token continues from the stored state
          }
        }
    }
  } else {
    const int c_first = s == 0 ? 0 : meta.last_chunk_indices[s - 1] + 1, c_last = meta.last_chunk_indices[s];
    for (int c = c_first; c <= c_last; ++c) {
      const int64_t t0 = meta.cu_chunk_seqlen[c], t1 = meta.cu_chunk_seqlen[c + 1];
      advance(in, p, h, g, p0, lane, st, t0, t1, y, y_stride, t0);
      if (chunk_states) {
        float* cs = chunk_states + (static_cast<int64_t>(c) * p.num_heads + h) * head_elems;
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
          for (int k = 0; k < kMaxPerLane; ++k) {
            const int n = lane + 32 * k, pr = p0 + r;
            if (n < N && pr < P) cs[static_cast<int64_t>(pr) * N + n] = st[r][k];
          }
      }
      if (const int32_t sb = meta.chunk_store_blocks ? meta.chunk_store_blocks[c] : 0; sb != 0) {  // "all" mode
        TS* dst = block_state(sb);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
          for (int k = 0; k < kMaxPerLane; ++k) {
            const int n = lane + 32 * k, pr = p0 + r;
            if (n < N && pr < P) store(dst + static_cast<int64_t>(pr) * N + n, st[r][k]);
          }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int n = lane + 32 * k, pr = p0 + r;
      if (n < N && pr < P) store(state + static_cast<int64_t>(pr) * N + n, st[r][k]);
    }
}

/// Decode rows of a warp in update_kernel, and its lanes' consecutive states per row.
constexpr int kDecodeRows = 8;

/// VEC consecutive state elements as floats (one 8- or 16-byte access per 4 fp32 / 4 bf16 elements).
template <int VEC, class TS>
__device__ __forceinline__ void load_run(const TS* p, float (&v)[VEC]) {
  if constexpr (sizeof(TS) == 4) {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + i);
      v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      const uint2 q = *reinterpret_cast<const uint2*>(p + i);
      const TS* e = reinterpret_cast<const TS*>(&q);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i + j] = load(e + j);
    }
  }
}
template <int VEC, class TS>
__device__ __forceinline__ void store_run(TS* p, const float (&v)[VEC]) {
  if constexpr (sizeof(TS) == 4) {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) *reinterpret_cast<float4*>(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      uint2 q;
      TS* e = reinterpret_cast<TS*>(&q);
#pragma unroll
      for (int j = 0; j < 4; ++j) store(e + j, v[i + j]);
      *reinterpret_cast<uint2*>(p + i) = q;
    }
  }
}

/// Decode (one token per row) for d_state = 32 * VEC (VEC 4 or 8: d_state 128 or 256, the public Mamba-2 shapes):
/// lane l owns states [l * VEC, (l + 1) * VEC) of each of its warp's 8 head_dim rows, read and written as 8- or
/// 16-byte runs (contiguous over the warp), the y sum is each lane's run in order, then warp_sum. Same math as
/// ssd_kernel's decode step (not bit-identical: another summation order). Grid (ceil(P / 32), H, batch). prewait: as
/// ssd_kernel's.
template <class TS, int VEC>
__global__ void __launch_bounds__(kWarps * 32) update_kernel(SsdInputs in, SsdParams p, float* __restrict__ y,
                                                              int64_t y_stride, const int32_t* __restrict__ state_indices,
                                                              bool prewait) {
  if (prewait)
    prefetch_state_rows<TS>(p, state_indices[blockIdx.z], blockIdx.y, blockIdx.x * kWarps * kDecodeRows,
                            kWarps * kDecodeRows);
  pdl_wait();
  pdl_launch_dependents();
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y;
  const int32_t block = state_indices[b];
  if (block == 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int P = p.head_dim, N = p.d_state;
  const int p0 = (blockIdx.x * kWarps + warp) * kDecodeRows;
  if (p0 >= P) return;  // whole warp
  const int g = h / (p.num_heads / p.n_groups), n0 = lane * VEC;
  TS* state = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride +
              (static_cast<int64_t>(h) * P + p0) * N + n0;
  const int rows = min(kDecodeRows, P - p0);
  float st[kDecodeRows][VEC];
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r)
    if (r < rows) load_run<VEC>(state + static_cast<int64_t>(r) * N, st[r]);
  const float Ah = p.A[h], Dh = p.D ? p.D[h] : 0.0f, bias = p.dt_bias ? p.dt_bias[h] : 0.0f;
  float dt = softplus(in.dt.data[b * in.dt.stride + h] + bias);
  dt = fminf(fmaxf(dt, p.time_step_min), p.time_step_max);
  const float e = dt * Ah;
  const float dA = e < -60.0f ? 0.0f : expf(e);
  const float* Bt = in.B.data + b * in.B.stride + static_cast<int64_t>(g) * N + n0;
  const float* Ct = in.C.data + b * in.C.stride + static_cast<int64_t>(g) * N + n0;
  float bv[VEC], cv[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) bv[k] = Bt[k], cv[k] = Ct[k];
  const float* xt = in.x.data + b * in.x.stride + static_cast<int64_t>(h) * P + p0;
  float mine = 0.0f;  // lane r keeps row r's output
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    if (r >= rows) break;  // uniform over the warp
    const float xv = xt[r], dtx = dt * xv;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      st[r][k] = dA * st[r][k] + dtx * bv[k];
      acc += st[r][k] * cv[k];
    }
    acc = warp_sum(acc) + Dh * xv;
    if (lane == r) mine = acc;
  }
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r)
    if (r < rows) store_run<VEC>(state + static_cast<int64_t>(r) * N, st[r]);
  if (lane < rows) y[b * y_stride + static_cast<int64_t>(h) * P + p0 + lane] = mine;
}

bool bad(const SsdInputs& in, const SsdParams& p, int64_t y_stride) {
  const int64_t HP = static_cast<int64_t>(p.num_heads) * p.head_dim, GN = static_cast<int64_t>(p.n_groups) * p.d_state;
  return p.num_heads < 1 || p.head_dim < 1 || p.n_groups < 1 || p.d_state < 1 || p.d_state > 32 * kMaxPerLane ||
         p.num_heads % p.n_groups != 0 || p.num_heads > 65535 || p.A == nullptr || p.ssm_states.data == nullptr ||
         y_stride < HP || in.x.stride < HP || in.dt.stride < p.num_heads || in.B.stride < GN || in.C.stride < GN;
}

cudaError_t launch(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadataDev& meta, float* y,
                   int64_t y_stride, float* chunk_states, bool decode, DeviceDecodeRows state_rows, int rows,
                   cudaStream_t stream, bool pdl) {
  const dim3 grid(ceil_div(p.head_dim, kRowsPerBlock), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(rows));
  return visit_dtype(p.ssm_states.dtype, [&](auto tag) {
    return launch_pdl(pdl, ssd_kernel<decltype(tag)>, grid, dim3(kWarps * 32), 0, stream, in, p, meta, y, y_stride,
                      chunk_states, decode, state_rows, decode && pdl && kernel_tuning().decode_prewait);
  });
}

}  // namespace

cudaError_t ssd_chunk_scan_fwd(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadataDev& meta, float* y,
                               int64_t y_stride, float* chunk_states, cudaStream_t stream) {
  if (bad(in, p, y_stride) || meta.num_seqs < 0 || meta.num_seqs > 65535 || meta.nchunks < 0 ||
      (meta.num_seqs > 0 && (!meta.cu_chunk_seqlen || !meta.last_chunk_indices || !meta.state_indices ||
                             !meta.has_initial_states)))
    return cudaErrorInvalidValue;
  if (meta.num_seqs == 0) return cudaSuccess;
  if (meta.chunk_size >= 1 && meta.chunk_size <= 256 && meta.seq_idx)
    return ssd_chunked_fwd(in, p, meta, y, y_stride, chunk_states, stream);
  return launch(in, p, meta, y, y_stride, chunk_states, false, meta.state_indices, meta.num_seqs, stream, false);
}

cudaError_t ssd_state_update(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                             DeviceDecodeRows rows, int batch, cudaStream_t stream, bool pdl) {
  if (bad(in, p, y_stride) || batch < 0 || batch > 65535 || !rows.state_indices || rows.cols < 1)
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  return launch(in, p, SsdChunkMetadataDev{}, y, y_stride, nullptr, true, rows, batch, stream, pdl);
}

cudaError_t ssd_state_update_wide(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                                  const int32_t* state_indices, int batch, cudaStream_t stream, bool pdl) {
  if (bad(in, p, y_stride) || batch < 0 || batch > 65535) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  // The vectorized decode kernel where d_state is 128 or 256, the state is fp32 or bf16 and every state run is
  // aligned (16 bytes for fp32, 8 for bf16). Else the generic kernel.
  const DType sd = p.ssm_states.dtype;
  const size_t es = sd == DType::F32 ? 4 : 2;
  const auto aligned = [&](const void* q, int64_t stride_elems, size_t elem) {
    return reinterpret_cast<uintptr_t>(q) % (4 * elem) == 0 && (stride_elems * elem) % (4 * elem) == 0;
  };
  const bool vec = (p.d_state == 128 || p.d_state == 256) && (sd == DType::F32 || sd == DType::BF16) &&
                   aligned(p.ssm_states.data, p.ssm_states.block_stride, es);
  if (!vec) return launch(in, p, SsdChunkMetadataDev{}, y, y_stride, nullptr, true, state_indices, batch, stream, pdl);
  const dim3 grid(ceil_div(p.head_dim, kWarps * kDecodeRows), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(batch));
  const auto go = [&](auto kernel) {
    return launch_pdl(pdl, kernel, grid, dim3(kWarps * 32), 0, stream, in, p, y, y_stride, state_indices,
                      pdl && kernel_tuning().decode_prewait);
  };
  if (sd == DType::F32)
    return p.d_state == 128 ? go(update_kernel<float, 4>) : go(update_kernel<float, 8>);
  return p.d_state == 128 ? go(update_kernel<__nv_bfloat16, 4>) : go(update_kernel<__nv_bfloat16, 8>);
}

}  // namespace ssmserve::cuda
