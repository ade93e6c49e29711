// Owns the GPU Mamba-1 selective scan (see selective_scan.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 128;
constexpr int kMaxPerLane = 8;  // d_state <= 32 * 8

/// Block (blockIdx.x, blockIdx.y): channels [blockIdx.x * (kThreads / lanes), ...) of sequence blockIdx.y
/// (prefill, qsl != nullptr) or of decode row blockIdx.y (qsl == nullptr: one token, initial state always).
template <class TS>
__global__ void __launch_bounds__(kThreads) scan_kernel(ScanInputs in, ScanParams p, float* __restrict__ y,
                                                         int64_t y_stride, const int32_t* __restrict__ qsl,
                                                         const int32_t* __restrict__ state_indices,
                                                         const uint8_t* __restrict__ has_init, int lanes,
                                                         DevStateStores stores) {
  const int s = blockIdx.y;
  const int32_t block = state_indices[s];
  if (block == 0) return;  // uniform over the block
  const int N = p.d_state;
  const int group = threadIdx.x / lanes, lane = threadIdx.x % lanes;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (kThreads / lanes) + group;
  const bool valid = c < p.dim;  // invalid groups still take part in the shuffles
  const int64_t cc = valid ? c : 0;
  const int64_t t0 = qsl ? qsl[s] : s, t1 = qsl ? qsl[s + 1] : s + 1;
  const bool init = qsl ? has_init[s] != 0 : true;
  TS* state = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + cc * N;

  float st[kMaxPerLane], a[kMaxPerLane];
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int n = lane + k * lanes;
    const bool on = valid && n < N;
    a[k] = on ? p.A[cc * N + n] : 0.0f;
    st[k] = (on && init) ? load(state + n) : 0.0f;
  }
  const float dbias = p.delta_bias ? p.delta_bias[cc] : 0.0f;
  const float Dc = p.D ? p.D[cc] : 0.0f;
  // "all" mode: the next store of this sequence (row offset `next`, -1: none left).
  int si = 0, si_end = 0;
  if (qsl && stores.num > 0) si = stores.start[s], si_end = stores.start[s + 1];
  int64_t next = si < si_end ? stores.offset[si] : -1;
  for (int64_t t = t0; t < t1; ++t) {
    float dt = in.delta.data[t * in.delta.stride + cc] + dbias;
    if (p.delta_softplus) dt = softplus(dt);
    const float u = in.u.data[t * in.u.stride + cc];
    const float* Bt = in.B.data + t * in.B.stride;
    const float* Ct = in.C.data + t * in.C.stride;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxPerLane; ++k) {
      const int n = lane + k * lanes;
      if (n < N) {
        const float sn = expf(dt * a[k]) * st[k] + dt * Bt[n] * u;
        st[k] = sn;
        acc += sn * Ct[n];
      }
    }
    for (int o = lanes >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o, lanes);
    if (valid && lane == 0) {
      float out = acc + Dc * u;
      if (in.z.data) out *= silu(in.z.data[t * in.z.stride + cc]);
      y[(qsl ? t : s) * y_stride + cc] = out;
    }
    if (t - t0 + 1 == next) {  // uniform over the block
      TS* dst = static_cast<TS*>(p.ssm_states.data) + stores.block[si] * p.ssm_states.block_stride + cc * N;
#pragma unroll
      for (int k = 0; k < kMaxPerLane; ++k) {
        const int n = lane + k * lanes;
        if (valid && n < N) store(dst + n, st[k]);
      }
      ++si;
      next = si < si_end ? stores.offset[si] : -1;
    }
  }
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int n = lane + k * lanes;
    if (valid && n < N) store(state + n, st[k]);
  }
}

int lanes_for(int N) {
  int l = 1;
  while (l < N && l < 32) l *= 2;
  return l;
}

bool bad(const ScanInputs& in, const ScanParams& p, int64_t y_stride) {
  return p.dim < 1 || p.d_state < 1 || p.d_state > 32 * kMaxPerLane || p.A == nullptr || y_stride < p.dim ||
         in.u.stride < p.dim || in.delta.stride < p.dim || in.B.stride < p.d_state || in.C.stride < p.d_state ||
         (in.z.data && in.z.stride < p.dim) || p.ssm_states.data == nullptr;
}

cudaError_t launch(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride, const int32_t* qsl,
                   const int32_t* state_indices, const uint8_t* has_init, int rows, cudaStream_t stream,
                   const DevStateStores& stores = {}) {
  const int lanes = lanes_for(p.d_state);
  const dim3 grid(ceil_div(p.dim, kThreads / lanes), static_cast<unsigned>(rows));
  return visit_dtype(p.ssm_states.dtype, [&](auto tag) {
    scan_kernel<decltype(tag)><<<grid, kThreads, 0, stream>>>(in, p, y, y_stride, qsl, state_indices, has_init, lanes,
                                                              stores);
    return launch_status();
  });
}

constexpr int kWideThreads = 128, kWideNS = 16;  // selective_state_update_wide: threads per block, d_state max
constexpr int kWideLanes = 4, kWidePerLane = kWideNS / kWideLanes;  // lanes per channel, states per lane
constexpr int kWideChannels = kWideThreads / kWideLanes;            // channels per block

/// Four consecutive lanes per (row, channel), each holding 4 of the channel's d_state <= 16 states in registers: a
/// warp's state loads and stores are contiguous 16-byte vectors (512 bytes per instruction when fp32 and
/// d_state == 16), and few registers per thread keep enough loads in flight at large decode batches. The y sum
/// is each lane's 4 products in state order, then a 2-step butterfly over the 4 lanes. Grid (ceil(dim / 32),
/// batch).
template <class TS, class TY>
__global__ void __launch_bounds__(kWideThreads) scan_update_wide_kernel(ScanInputs in, ScanParams p,
                                                                        TY* __restrict__ y, int64_t y_stride,
                                                                        const int32_t* __restrict__ state_indices) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t b = blockIdx.y;
  const int32_t block = state_indices[b];
  if (block == 0) return;  // uniform over the block
  const int q = threadIdx.x % kWideLanes, n0 = q * kWidePerLane, N = p.d_state;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kWideChannels + threadIdx.x / kWideLanes;
  const bool on = c < p.dim;  // every lane still reaches the shuffles below
  float acc = 0.0f, u = 0.0f;
  if (on) {
    TS* state = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + c * N;
    const float* A = p.A + c * N;
    const float* Bt = in.B.data + b * in.B.stride;
    const float* Ct = in.C.data + b * in.C.stride;
    float dt = in.delta.data[b * in.delta.stride + c] + (p.delta_bias ? p.delta_bias[c] : 0.0f);
    if (p.delta_softplus) dt = softplus(dt);
    u = in.u.data[b * in.u.stride + c];
    const bool vec = sizeof(TS) == 4 && N == kWideNS && (reinterpret_cast<uintptr_t>(state) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(A) & 15) == 0;
    float st[kWidePerLane], a[kWidePerLane];
    if (vec) {
      const float4 s4 = reinterpret_cast<const float4*>(state)[q], a4 = reinterpret_cast<const float4*>(A)[q];
      st[0] = s4.x, st[1] = s4.y, st[2] = s4.z, st[3] = s4.w;
      a[0] = a4.x, a[1] = a4.y, a[2] = a4.z, a[3] = a4.w;
    } else {
#pragma unroll
      for (int j = 0; j < kWidePerLane; ++j) {
        st[j] = n0 + j < N ? load(state + n0 + j) : 0.0f;
        a[j] = n0 + j < N ? A[n0 + j] : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kWidePerLane; ++j) {
      const int n = n0 + j;
      const float Bv = n < N ? Bt[n] : 0.0f, Cv = n < N ? Ct[n] : 0.0f;
      st[j] = expf(dt * a[j]) * st[j] + dt * Bv * u;
      acc += st[j] * Cv;
    }
    if (vec) {
      reinterpret_cast<float4*>(state)[q] = make_float4(st[0], st[1], st[2], st[3]);
    } else {
#pragma unroll
      for (int j = 0; j < kWidePerLane; ++j)
        if (n0 + j < N) store(state + n0 + j, st[j]);
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (on && q == 0) {
    float outv = acc + (p.D ? p.D[c] : 0.0f) * u;
    if (in.z.data) outv *= silu(in.z.data[b * in.z.stride + c]);
    store(y + b * y_stride + c, outv);
  }
}

}  // namespace

cudaError_t selective_scan_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                               const int32_t* query_start_loc, const int32_t* state_indices,
                               const uint8_t* has_initial_states, int num_seqs, cudaStream_t stream,
                               const DevStateStores& stores) {
  if (bad(in, p, y_stride) || num_seqs < 0 || num_seqs > 65535 || !query_start_loc ||
      (stores.num > 0 && (!stores.start || !stores.offset || !stores.block)))
    return cudaErrorInvalidValue;
  if (num_seqs == 0) return cudaSuccess;
  return launch(in, p, y, y_stride, query_start_loc, state_indices, has_initial_states, num_seqs, stream, stores);
}

cudaError_t selective_state_update(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                                   const int32_t* state_indices, int batch, cudaStream_t stream) {
  if (bad(in, p, y_stride) || batch < 0 || batch > 65535) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  return launch(in, p, y, y_stride, nullptr, state_indices, nullptr, batch, stream);
}

cudaError_t selective_state_update_wide(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                        int64_t y_stride, const int32_t* state_indices, int batch, bool pdl,
                                        cudaStream_t stream) {
  if (p.dim < 1 || p.d_state < 1 || p.d_state > kWideNS || !p.A || y_stride < p.dim || in.u.stride < p.dim ||
      in.delta.stride < p.dim || in.B.stride < p.d_state || in.C.stride < p.d_state ||
      (in.z.data && in.z.stride < p.dim) || !p.ssm_states.data || batch < 0 || batch > 65535 ||
      (y_dtype != DType::F32 && y_dtype != DType::BF16))
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const dim3 grid(ceil_div(p.dim, kWideChannels), static_cast<unsigned>(batch));
  return visit_dtype(p.ssm_states.dtype, [&](auto tag) {
    using TS = decltype(tag);
    if (y_dtype == DType::BF16)
      return launch_pdl(pdl, scan_update_wide_kernel<TS, __nv_bfloat16>, grid, dim3(kWideThreads), 0, stream, in, p,
                        static_cast<__nv_bfloat16*>(y), y_stride, state_indices);
    return launch_pdl(pdl, scan_update_wide_kernel<TS, float>, grid, dim3(kWideThreads), 0, stream, in, p,
                      static_cast<float*>(y), y_stride, state_indices);
  });
}

}  // namespace ssmserve::cuda
