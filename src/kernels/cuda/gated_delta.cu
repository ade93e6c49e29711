// Owns the gated delta rule's decode kernel and the fused input preparation on the GPU (math and layout in
// kernels/cuda/gated_delta.h; the prefill is gated_delta_prefill.cu).
//
// Decode napkin math (Qwen3.5-9B layer: Hv = 32, Dk = Dv = 128, fp32 state): 2 MiB read + 2 MiB written per row,
// ~3 * 0.5 M FMAs per row, so ~0.4 FLOP/byte: bound by HBM (4.8 TB/s peak: ~0.9 us per row per layer, ~0.2 ms
// at batch 256).
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/gated_delta_step.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {

using detail::launch_status;
using namespace gdn;

// ---- decode -----------------------------------------------------------------------------------------------------

/// Block (row b = blockIdx.x, value head h = blockIdx.y, column slice blockIdx.z of kCols columns). Thread t owns
/// the 4 columns cg * 4 .. +3 (cg = t % kCG) of the key rows rg + kRG * i (rg = t / kCG, i < 4): a warp reads
/// 32 / kCG rows x kCols contiguous elements per load. A verify row's tokens run one after another
/// (device_decode_rows.h), the state kept in registers between them, rounded as stored. prewait: before the PDL wait,
/// the first thread of each key row hints the L2 to fetch the row's slice of the block's state (no kernel of the step
/// writes it before this one; KernelTuning::decode_prewait).
template <class TS, int kDk, int kCols>
__global__ void __launch_bounds__((kCols / 4) * (kDk / kRowsPerThread))
    decode_kernel(GatedDeltaInputs in, GatedDeltaParams p, float* __restrict__ out, int64_t out_stride,
                  DeviceDecodeRows rows, bool prewait) {
  constexpr int kCG = kCols / 4, kRG = kDk / kRowsPerThread;
  __shared__ StepSmem<kDk, kCols> sm;
  if (prewait && threadIdx.x % kCG == 0) {
    const int32_t blk = rows.src_block(blockIdx.x, 0);
    if (blk != 0) {
      const TS* S = static_cast<const TS*>(p.states.data) + blk * p.states.block_stride +
                    static_cast<int64_t>(blockIdx.y) * kDk * p.head_v_dim + blockIdx.z * kCols;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const TS* row = S + static_cast<int64_t>(threadIdx.x / kCG + kRG * i) * p.head_v_dim;
        detail::pdl_prefetch_l2(row);
        detail::pdl_prefetch_l2(row + kCols - 1);  // the slice may cross a line
      }
    }
  }
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const int b = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kCols, tid = threadIdx.x;
  const int Dv = p.head_v_dim, kh = h / (p.num_v_heads / p.num_k_heads);
  const int nt = rows.num_tokens(b);
  const int64_t t0 = rows.first_token(b);
  auto out_row = [&](int64_t t) { return out + t * out_stride + static_cast<int64_t>(h) * Dv + col0; };
  if (rows.is_null(b)) {  // padding / null block: no state I/O, zero outputs
    for (int j = 0; j < nt; ++j)
      if (tid < kCols) out_row(t0 + j)[tid] = 0.0f;
    return;
  }
  const int cg = tid % kCG, rg = tid / kCG;
  auto state_at = [&](int32_t blk) {
    return static_cast<TS*>(p.states.data) + blk * p.states.block_stride + static_cast<int64_t>(h) * kDk * Dv + col0 +
           cg * 4;
  };
  // The slice's state, all loads in flight before the first use.
  float4 s[kRowsPerThread];
  {
    const TS* S = state_at(rows.src_block(b, 0));
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) s[i] = load4(S + static_cast<int64_t>(rg + kRG * i) * Dv);
  }
  for (int j = 0; j < nt; ++j) {
    float4 n[kRowsPerThread];
    token_step<kDk, kCols>(in, t0 + j, h, kh, col0, Dv, out_row(t0 + j), s, n, sm, j > 0);
    // The new state goes to this token's column (column 0 in place for a plain row); the next token continues from
    // the stored (rounded) values.
    TS* S = state_at(rows.dst_block(b, j));
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      TS* dst = S + static_cast<int64_t>(rg + kRG * i) * Dv;
      store4(dst, n[i]);
      if (j + 1 < nt) s[i] = load4(dst);
    }
  }
}

/// Column slice width of the sequential prefill: the decode kernel's in batch-invariant mode.
constexpr int kSequentialCols = 16;

/// Sequential prefill (batch-invariant mode): block (sequence = blockIdx.x, value head blockIdx.y, column slice
/// blockIdx.z of kCols columns) walks the sequence's tokens one by one with token_step, exactly the decode kernel's
/// per-token arithmetic (the state rounded to the state dtype after every token, as decode stores and reloads it).
/// Starts from the sequence's block when num_computed > 0 (else zeros); writes the state after each store offset into
/// the store's block and the final state into the sequence's block.
template <class TS, int kDk, int kCols>
__global__ void __launch_bounds__((kCols / 4) * (kDk / kRowsPerThread))
    sequential_prefill_kernel(GatedDeltaInputs in, GatedDeltaParams p, float* __restrict__ out, int64_t out_stride,
                              const int32_t* __restrict__ qsl, const int32_t* __restrict__ num_computed,
                              const int32_t* __restrict__ state_indices, DevStateStores stores) {
  constexpr int kCG = kCols / 4, kRG = kDk / kRowsPerThread;
  __shared__ StepSmem<kDk, kCols> sm;
  const int seq = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kCols, tid = threadIdx.x;
  const int Dv = p.head_v_dim, kh = h / (p.num_v_heads / p.num_k_heads);
  const int64_t t0 = qsl[seq];
  const int nt = qsl[seq + 1] - qsl[seq];
  const int32_t blk = state_indices[seq];
  auto out_row = [&](int64_t t) { return out + t * out_stride + static_cast<int64_t>(h) * Dv + col0; };
  if (blk == 0) {  // null row: no state I/O, zero outputs
    for (int j = 0; j < nt; ++j)
      if (tid < kCols) out_row(t0 + j)[tid] = 0.0f;
    return;
  }
  if (nt <= 0) return;
  const int cg = tid % kCG, rg = tid / kCG;
  auto state_at = [&](int32_t b) {
    return static_cast<TS*>(p.states.data) + b * p.states.block_stride + static_cast<int64_t>(h) * kDk * Dv + col0 +
           cg * 4;
  };
  auto write_state = [&](int32_t b, const float4 (&v)[kRowsPerThread]) {
    TS* S = state_at(b);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) store4(S + static_cast<int64_t>(rg + kRG * i) * Dv, v[i]);
  };
  float4 s[kRowsPerThread];
  if (num_computed[seq] > 0) {
    const TS* S = state_at(blk);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) s[i] = load4(S + static_cast<int64_t>(rg + kRG * i) * Dv);
  } else {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) s[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  int next = 0, last = 0;  // this sequence's stores [next, last)
  if (stores.num > 0) next = stores.start[seq], last = stores.start[seq + 1];
  for (int j = 0; j < nt; ++j) {
    float4 n[kRowsPerThread];
    token_step<kDk, kCols>(in, t0 + j, h, kh, col0, Dv, out_row(t0 + j), s, n, sm, j > 0);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) s[i] = round4(n[i], TS{});
    for (; next < last && stores.offset[next] <= j + 1; ++next)
      if (stores.offset[next] == j + 1 && stores.block[next] > 0) write_state(stores.block[next], s);
  }
  write_state(blk, s);
}

template <class TS, int kDk>
cudaError_t launch_decode(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                          DeviceDecodeRows rows, int batch, bool batch_invariant, cudaStream_t stream, bool pdl) {
  // 32-column slices when that still gives ~2 blocks per SM (132 SMs), else 16 (more, smaller blocks at batch 1).
  // The slice width sets the reduction order over the key rows: batch-invariant mode keeps 16 at every batch size
  // (the sequential prefill's width).
  const int64_t blocks32 = static_cast<int64_t>(batch) * p.num_v_heads * (p.head_v_dim / 32);
  const bool prewait = pdl && kernel_tuning().decode_prewait;  // only useful while a predecessor runs
  if (!batch_invariant && p.head_v_dim % 32 == 0 && blocks32 >= 256) {
    constexpr int kCols = 32;
    return detail::launch_pdl(pdl, decode_kernel<TS, kDk, kCols>, dim3(batch, p.num_v_heads, p.head_v_dim / kCols),
                              dim3((kCols / 4) * (kDk / 4)), 0, stream, in, p, out, out_stride, rows, prewait);
  }
  constexpr int kCols = 16;
  return detail::launch_pdl(pdl, decode_kernel<TS, kDk, kCols>, dim3(batch, p.num_v_heads, p.head_v_dim / kCols),
                            dim3((kCols / 4) * (kDk / 4)), 0, stream, in, p, out, out_stride, rows, prewait);
}

template <class TS, int kDk>
cudaError_t launch_sequential_prefill(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                                      int64_t out_stride, const int32_t* qsl, const int32_t* num_computed,
                                      const int32_t* state_indices, int num_seqs, const DevStateStores& stores,
                                      cudaStream_t stream) {
  constexpr int kCols = kSequentialCols;
  sequential_prefill_kernel<TS, kDk, kCols><<<dim3(num_seqs, p.num_v_heads, p.head_v_dim / kCols),
                                              (kCols / 4) * (kDk / 4), 0, stream>>>(in, p, out, out_stride, qsl,
                                                                                   num_computed, state_indices, stores);
  return launch_status();
}

// ---- prepare ----------------------------------------------------------------------------------------------------

/// One warp per (token, key head) = global warp index; lanes stride over Dk.
__global__ void prepare_kernel(GatedDeltaPrepareArgs a, int64_t num_tokens, int Hk, int Hv, int Dk) {
  detail::pdl_wait();
  detail::pdl_launch_dependents();
  const int64_t gw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (gw >= num_tokens * Hk) return;
  const int64_t t = gw / Hk;
  const int kh = static_cast<int>(gw % Hk);
  const float* q = a.q + t * a.q_stride + static_cast<int64_t>(kh) * Dk;
  const float* k = a.k + t * a.k_stride + static_cast<int64_t>(kh) * Dk;
  float sq = 0.0f, sk = 0.0f;
  for (int i = lane; i < Dk; i += 32) {
    sq = fmaf(q[i], q[i], sq);
    sk = fmaf(k[i], k[i], sk);
  }
  sq = detail::warp_sum(sq);
  sk = detail::warp_sum(sk);
  // All lanes hold the sums before any lane overwrites its elements (in-place use).
  const float rq = 1.0f / sqrtf(sq + 1e-6f) / sqrtf(static_cast<float>(Dk)), rk = 1.0f / sqrtf(sk + 1e-6f);
  float* qo = a.q_out + t * a.q_out_stride + static_cast<int64_t>(kh) * Dk;
  float* ko = a.k_out + t * a.k_out_stride + static_cast<int64_t>(kh) * Dk;
  for (int i = lane; i < Dk; i += 32) {
    const float qv = q[i], kv = k[i];
    qo[i] = qv * rq;
    ko[i] = kv * rk;
  }
  const int ratio = Hv / Hk;
  if (lane < ratio) {
    const int h = kh * ratio + lane;
    const float x = a.a[t * a.a_stride + h] + a.dt_bias[h];
    a.g[t * a.g_stride + h] = -expf(a.A_log[h]) * detail::softplus(x);
    a.beta[t * a.beta_stride + h] = 1.0f / (1.0f + expf(-a.b[t * a.b_stride + h]));
  }
}

bool strides_ok(const GatedDeltaInputs& in, const GatedDeltaParams& p) {
  const int64_t qk = static_cast<int64_t>(p.num_k_heads) * p.head_k_dim;
  const int64_t vw = static_cast<int64_t>(p.num_v_heads) * p.head_v_dim;
  return in.q_stride >= qk && in.k_stride >= qk && in.v_stride >= vw && in.g_stride >= p.num_v_heads &&
         in.beta_stride >= p.num_v_heads;
}

bool heads_ok(const GatedDeltaParams& p) {
  return p.num_k_heads > 0 && p.num_v_heads > 0 && p.num_v_heads % p.num_k_heads == 0 && p.head_k_dim > 0 &&
         p.head_v_dim > 0 && p.states.data != nullptr && p.states.block_stride >= static_cast<int64_t>(p.num_v_heads) *
         p.head_k_dim * p.head_v_dim;
}

}  // namespace

bool gated_delta_decode_supported(const GatedDeltaParams& p) {
  const int dk = p.head_k_dim;
  return heads_ok(p) && (dk == 32 || dk == 64 || dk == 128 || dk == 256) && p.head_v_dim % 16 == 0 &&
         p.states.block_stride % 4 == 0 && reinterpret_cast<uintptr_t>(p.states.data) % 16 == 0;
}

bool gated_delta_prefill_supported(const GatedDeltaParams& p) {
  return heads_ok(p) && p.head_k_dim % 4 == 0 && p.head_k_dim <= 128 && p.head_v_dim % 4 == 0 &&
         p.chunk_size >= 1 && p.chunk_size <= 64;
}

cudaError_t gated_delta_decode(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                               DeviceDecodeRows rows, int batch, cudaStream_t stream, bool batch_invariant, bool pdl) {
  if (!gated_delta_decode_supported(p) || !strides_ok(in, p) || batch < 0 || !rows.state_indices || rows.cols < 1 ||
      out_stride < static_cast<int64_t>(p.num_v_heads) * p.head_v_dim || p.num_v_heads > 65535)
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  return detail::visit_dtype(p.states.dtype, [&](auto tag) -> cudaError_t {
    using TS = decltype(tag);
    switch (p.head_k_dim) {
      case 32: return launch_decode<TS, 32>(in, p, out, out_stride, rows, batch, batch_invariant, stream, pdl);
      case 64: return launch_decode<TS, 64>(in, p, out, out_stride, rows, batch, batch_invariant, stream, pdl);
      case 128: return launch_decode<TS, 128>(in, p, out, out_stride, rows, batch, batch_invariant, stream, pdl);
      default: return launch_decode<TS, 256>(in, p, out, out_stride, rows, batch, batch_invariant, stream, pdl);
    }
  });
}

cudaError_t gated_delta_prefill_sequential(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                                           int64_t out_stride, const int32_t* query_start_loc,
                                           const int32_t* num_computed, const int32_t* state_indices, int num_seqs,
                                           cudaStream_t stream, const DevStateStores& stores) {
  if (!gated_delta_decode_supported(p) || !strides_ok(in, p) || num_seqs < 0 ||
      out_stride < static_cast<int64_t>(p.num_v_heads) * p.head_v_dim || p.num_v_heads > 65535)
    return cudaErrorInvalidValue;
  if (num_seqs == 0) return cudaSuccess;
  if (!query_start_loc || !num_computed || !state_indices || !out ||
      (stores.num > 0 && (!stores.start || !stores.offset || !stores.block)))
    return cudaErrorInvalidValue;
  return detail::visit_dtype(p.states.dtype, [&](auto tag) -> cudaError_t {
    using TS = decltype(tag);
    const auto run = [&](auto dk) {
      return launch_sequential_prefill<TS, decltype(dk)::value>(in, p, out, out_stride, query_start_loc, num_computed,
                                                                state_indices, num_seqs, stores, stream);
    };
    switch (p.head_k_dim) {
      case 32: return run(std::integral_constant<int, 32>{});
      case 64: return run(std::integral_constant<int, 64>{});
      case 128: return run(std::integral_constant<int, 128>{});
      default: return run(std::integral_constant<int, 256>{});
    }
  });
}

cudaError_t gated_delta_prepare(const GatedDeltaPrepareArgs& a, int64_t num_tokens, int num_k_heads, int num_v_heads,
                                int head_k_dim, cudaStream_t stream, bool pdl) {
  const int64_t qk = static_cast<int64_t>(num_k_heads) * head_k_dim;
  if (num_tokens < 0 || num_k_heads <= 0 || num_v_heads <= 0 || num_v_heads % num_k_heads != 0 ||
      num_v_heads / num_k_heads > 32 || head_k_dim <= 0 || head_k_dim > 1024 || a.q_stride < qk ||
      a.k_stride < qk || a.q_out_stride < qk || a.k_out_stride < qk || a.a_stride < num_v_heads ||
      a.b_stride < num_v_heads || a.g_stride < num_v_heads || a.beta_stride < num_v_heads)
    return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t warps = num_tokens * num_k_heads;
  return detail::launch_pdl(pdl, prepare_kernel, dim3(detail::ceil_div(warps * 32, kThreads)), dim3(kThreads), 0, stream,
                            a, num_tokens, num_k_heads, num_v_heads, head_k_dim);
}

}  // namespace ssmserve::cuda
