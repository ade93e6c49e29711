// Owns the Gated DeltaNet decode step in one launch (see gated_delta_decode_fused.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/gated_delta_decode_fused.h"
#include "kernels/cuda/gated_delta_step.cuh"
#include "kernels/cuda/gated_norm_vec.cuh"
#include "kernels/cuda/l2_loads.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using namespace gdn;
using bf16 = __nv_bfloat16;

struct FusedArgs {
  GdnDecodeArgs a;
  int norm_threads, norm_vpt;  // the per-head gated norm's GatedNormVecPlan
};

/// The decode kernel's column slice for `rows` rows outside batch-invariant mode (gated_delta.cu's launch_decode):
/// 32 columns when that still gives ~2 blocks per SM, else 16. The slice sets the reduction order over the key rows.
int slice_cols(const GatedDeltaParams& p, int rows) {
  const int64_t blocks32 = static_cast<int64_t>(rows) * p.num_v_heads * (p.head_v_dim / 32);
  return p.head_v_dim % 32 == 0 && blocks32 >= 256 ? 32 : 16;
}

/// Block (row b, value head h, column slice z of kCols columns), (kCols / 4) (kDk / 4) threads: the decode kernel's
/// block. Conv channel j = tid + q * threads (slot q) of the block's 2 kDk + kCols: q then k of key head kh, then v of
/// columns col0.. of head h.
template <class TS, int kDk, int kCols>
__global__ void __launch_bounds__((kCols / 4) * (kDk / kRowsPerThread)) gdn_decode_fused_kernel(FusedArgs f) {
  constexpr int kCG = kCols / 4, kRG = kDk / kRowsPerThread, kThreads = kCG * kRG;
  constexpr int kChannels = 2 * kDk + kCols, kSlots = (kChannels + kThreads - 1) / kThreads;
  __shared__ StepSmem<kDk, kCols> sm;
  __shared__ float v_s[kCols];
  __shared__ float scratch[32];
  __shared__ int last_v, last_k;
  const GdnDecodeArgs& a = f.a;
  const GatedDeltaParams& p = a.gdn;
  const ConvParams& cv = a.conv;
  const int tid = threadIdx.x, b = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kCols;
  const int Hk = p.num_k_heads, Hv = p.num_v_heads, Dv = p.head_v_dim, kh = h / (Hv / Hk);
  const int64_t Kd = static_cast<int64_t>(Hk) * kDk, Vd = static_cast<int64_t>(Hv) * Dv;
  const int W = cv.width, S = W - 1;
  const int cg = tid % kCG, rg = tid / kCG;
  // Before the wait: the row's block (uploaded before the step's first kernel), its state slice and conv windows (last
  // written by this layer's previous step) and the constant taps: nothing the predecessor writes. What an earlier
  // grid wrote is read through the L2.
  const int32_t blk = load_cg(a.state_indices + b);
  int64_t ch[kSlots];
  float cw[kSlots][kConvMaxWidth], cwin[kSlots][kConvMaxWidth], cb[kSlots];
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    const int j = tid + q * kThreads;
    ch[q] = -1;
    if (blk == 0 || j >= kChannels) continue;
    ch[q] = j < kDk ? kh * kDk + j : j < 2 * kDk ? Kd + kh * kDk + (j - kDk) : 2 * Kd + static_cast<int64_t>(h) * Dv + col0 + (j - 2 * kDk);
    const TS* win = static_cast<const TS*>(cv.conv_states.data) + blk * cv.conv_states.block_stride + ch[q];
#pragma unroll
    for (int k = 0; k < kConvMaxWidth; ++k) {
      if (k > S) break;
      cw[q][k] = cv.weight[ch[q] * W + k];
      if (k < S) cwin[q][k] = load_cg(win + k * cv.dim);
    }
    cb[q] = cv.bias ? cv.bias[ch[q]] : 0.0f;
  }
  TS* state = static_cast<TS*>(p.states.data) + blk * p.states.block_stride + static_cast<int64_t>(h) * kDk * Dv +
              col0 + cg * 4;
  float4 s[kRowsPerThread];
  if (blk != 0) {
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) s[i] = load4_cg(state + static_cast<int64_t>(rg + kRG * i) * Dv);
  }
  // The head's A_log / dt_bias and its norm-weight columns, hinted into the L2 before the wait: after it they would be
  // HBM round trips behind out_proj's weight stream.
  if (tid == 0) {
    l2_hint(a.A_log + h);
    l2_hint(a.dt_bias + h);
  } else if (tid == 32) {
    l2_hint(a.norm_weight + static_cast<int64_t>(h) * Dv + col0);
  }
  pdl_wait();  // proj comes from the in_proj GEMM, the direct predecessor
  pdl_launch_dependents();
  const float* prow = a.proj + static_cast<int64_t>(b) * a.proj_stride;
  bf16* orow = static_cast<bf16*>(a.out) + static_cast<int64_t>(b) * a.out_stride + static_cast<int64_t>(h) * Dv + col0;
  if (blk == 0) {  // a padding row: zero out rows (the separate kernels' norm of the decode kernel's zero outputs, up to sign)
    if (tid < kCols) orow[tid] = __float2bfloat16_rn(0.0f);
    return;
  }
  // 1. The conv of the block's channels; its own v channels' windows shift now (no other block reads them).
  float xin[kSlots];
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    if (ch[q] < 0) continue;
    const int j = tid + q * kThreads;
    xin[q] = prow[ch[q]];
    const float v = conv_window_output(cw[q], cb[q], cwin[q], W, xin[q], cv.apply_silu);
    if (j < kDk) {
      sm.sq[j] = v;
    } else if (j < 2 * kDk) {
      sm.sk[j - kDk] = v;
    } else {
      v_s[j - 2 * kDk] = v;
      TS* win = static_cast<TS*>(cv.conv_states.data) + blk * cv.conv_states.block_stride + ch[q];
#pragma unroll
      for (int k = 0; k < kConvMaxWidth - 1; ++k) {
        if (k >= S) break;
        store(win + k * cv.dim, k + 1 < S ? cwin[q][k + 1] : xin[q]);
      }
    }
  }
  __syncthreads();
  // 2. The preparation (gated_delta.cu's prepare_kernel, one warp): q, k L2-normalised in place.
  if (tid < 32) {
    float sq = 0.0f, sk = 0.0f;
    for (int i = tid; i < kDk; i += 32) {
      sq = fmaf(sm.sq[i], sm.sq[i], sq);
      sk = fmaf(sm.sk[i], sm.sk[i], sk);
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float rq = 1.0f / sqrtf(sq + 1e-6f) / sqrtf(static_cast<float>(kDk)), rk = 1.0f / sqrtf(sk + 1e-6f);
    for (int i = tid; i < kDk; i += 32) {
      const float qv = sm.sq[i], kv = sm.sk[i];
      sm.sq[i] = qv * rq;
      sm.sk[i] = kv * rk;
    }
  }
  const float x = prow[cv.dim + Vd + Hv + h] + a.dt_bias[h];  // a
  const float g = -expf(a.A_log[h]) * softplus(x);
  const float beta = 1.0f / (1.0f + expf(-prow[cv.dim + Vd + h]));  // b
  __syncthreads();
  // 3. The token step (the decode kernel's), the state stored in place.
  float* o = a.o + static_cast<int64_t>(b) * Vd + static_cast<int64_t>(h) * Dv;
  float4 n[kRowsPerThread];
  token_step_core<kDk, kCols>(expf(g), beta, v_s, o + col0, s, n, sm);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) store4(state + static_cast<int64_t>(rg + kRG * i) * Dv, n[i]);
  // 4. Arrivals: the last block of (row, value head) has every output of the head behind it, the last of (row, key
  // head) every read of the q / k windows.
  __threadfence();
  __syncthreads();
  if (tid == 0) {  // atomicInc wraps each count to 0 at its last arrival: zero again for the next launch
    auto* cnt = reinterpret_cast<unsigned*>(a.counters);
    const unsigned per_head = Dv / kCols, per_key = (Hv / Hk) * per_head;
    last_v = atomicInc(cnt + static_cast<int64_t>(b) * Hv + h, per_head - 1) == per_head - 1;
    last_k = atomicInc(cnt + static_cast<int64_t>(kGdnFusedMaxRows) * Hv + static_cast<int64_t>(b) * Hk + kh, per_key - 1) ==
             per_key - 1;
  }
  __syncthreads();
  if (last_k) {
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      if (ch[q] < 0 || tid + q * kThreads >= 2 * kDk) continue;
      TS* win = static_cast<TS*>(cv.conv_states.data) + blk * cv.conv_states.block_stride + ch[q];
#pragma unroll
      for (int k = 0; k < kConvMaxWidth - 1; ++k) {
        if (k >= S) break;
        store(win + k * cv.dim, k + 1 < S ? cwin[q][k + 1] : xin[q]);
      }
    }
  }
  if (!last_v) return;
  __threadfence();
  gated_norm_group_in_block(o, prow + cv.dim + static_cast<int64_t>(h) * Dv, a.norm_weight + static_cast<int64_t>(h) * Dv,
                            a.eps, Dv, true, orow - col0, f.norm_threads, f.norm_vpt, scratch);
}

GatedNormVecPlan norm_plan(const GdnDecodeArgs& a) {
  const GatedDeltaParams& p = a.gdn;
  const int64_t Vd = static_cast<int64_t>(p.num_v_heads) * p.head_v_dim;
  return gated_norm_vec_plan(a.o, Vd, a.proj + a.conv.dim, a.proj_stride, a.norm_weight, a.out, a.out_stride,
                             a.out_dtype, p.head_v_dim);
}

template <class TS, int kDk>
cudaError_t launch(const FusedArgs& f, int rows, int cols, cudaStream_t stream, bool pdl) {
  const GatedDeltaParams& p = f.a.gdn;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(p.num_v_heads), static_cast<unsigned>(p.head_v_dim / cols));
  if (cols == 32)
    return launch_pdl(pdl, gdn_decode_fused_kernel<TS, kDk, 32>, grid, dim3(8 * (kDk / 4)), 0, stream, f);
  return launch_pdl(pdl, gdn_decode_fused_kernel<TS, kDk, 16>, grid, dim3(4 * (kDk / 4)), 0, stream, f);
}

}  // namespace

bool gated_delta_decode_fused_fits(const GdnDecodeArgs& a, int rows) {
  const GatedDeltaParams& p = a.gdn;
  const ConvParams& c = a.conv;
  if (rows < 1 || rows > kGdnFusedMaxRows || !gated_delta_decode_supported(p) || p.num_v_heads > 65535) return false;
  const int64_t Kd = static_cast<int64_t>(p.num_k_heads) * p.head_k_dim, Vd = static_cast<int64_t>(p.num_v_heads) * p.head_v_dim;
  const DType sd = p.states.dtype;
  if (c.width < 1 || c.width > kConvMaxWidth || !c.weight || (c.width > 1 && !c.conv_states.data) ||
      c.dim != 2 * Kd + Vd || c.conv_states.dtype != sd || (sd != DType::F32 && sd != DType::BF16) || !a.proj ||
      a.proj_stride < c.dim + Vd + 2 * p.num_v_heads || !a.A_log || !a.dt_bias || !a.state_indices || !a.o ||
      !a.norm_weight || !a.out || a.out_stride < Vd || a.out_dtype != DType::BF16 || !a.counters)
    return false;
  const GatedNormVecPlan plan = norm_plan(a);
  const int threads = (slice_cols(p, rows) / 4) * (p.head_k_dim / 4);
  return plan.vpt > 0 && plan.threads <= threads;
}

cudaError_t gated_delta_decode_fused(const GdnDecodeArgs& a, int rows, cudaStream_t stream, bool pdl) {
  if (!gated_delta_decode_fused_fits(a, rows)) return cudaErrorInvalidValue;
  const GatedNormVecPlan plan = norm_plan(a);
  const FusedArgs f{a, plan.threads, plan.vpt};
  const int cols = slice_cols(a.gdn, rows);
  const bool bf = a.gdn.states.dtype == DType::BF16;
  switch (a.gdn.head_k_dim) {
    case 32: return bf ? launch<bf16, 32>(f, rows, cols, stream, pdl) : launch<float, 32>(f, rows, cols, stream, pdl);
    case 64: return bf ? launch<bf16, 64>(f, rows, cols, stream, pdl) : launch<float, 64>(f, rows, cols, stream, pdl);
    case 128: return bf ? launch<bf16, 128>(f, rows, cols, stream, pdl) : launch<float, 128>(f, rows, cols, stream, pdl);
    default: return bf ? launch<bf16, 256>(f, rows, cols, stream, pdl) : launch<float, 256>(f, rows, cols, stream, pdl);
  }
}

}  // namespace ssmserve::cuda
