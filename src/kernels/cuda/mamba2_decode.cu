// Owns the Mamba-2 decode step in one launch (see mamba2_decode.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/gated_norm_vec.cuh"
#include "kernels/cuda/l2_loads.cuh"
#include "kernels/cuda/mamba2_decode.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/ssd_decode_math.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;
using bf16 = __nv_bfloat16;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kRowsPerBlock = kWarps * kSsdRowsPerWarp;  // head_dim rows per block: 32
constexpr int kMaxBC = 2 * 32 * kSsdMaxPerLane;          // a group's B and C channels: 2 * d_state <= 512
constexpr int kSlots = 1 + kMaxBC / kThreads;             // conv channels per thread: one x row, two B / C channels

struct FusedArgs {
  Mamba2DecodeArgs a;
  int64_t d_inner, group_size;
  int norm_threads, norm_vpt;  // the gated norm's GatedNormVecPlan
};

/// Grid (ceil(head_dim / 32), num_heads, rows), 256 threads. Block (bx, h, b): slot 0 of thread i < 32 is x channel
/// h * P + 32 bx + i (those < P), slots 1 and 2 the group's B / C channels j = i and i + 256 (j < 2N: B then C).
/// Warp w updates head rows p0 = 32 bx + 4 w .. + 4 (ssd_token_rows) from the block's conv outputs in shared memory.
template <class TS>
__global__ void __launch_bounds__(kThreads) mamba2_decode_kernel(FusedArgs f) {
  __shared__ float x_s[kRowsPerBlock];
  __shared__ float bc_s[kMaxBC];
  __shared__ float scratch[32];
  __shared__ int last_s;
  const Mamba2DecodeArgs& a = f.a;
  const SsdParams& sp = a.ssd;
  const ConvParams& cv = a.conv;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.z, h = blockIdx.y, r0 = blockIdx.x * kRowsPerBlock, p0 = r0 + warp * kSsdRowsPerWarp;
  const int P = sp.head_dim, N = sp.d_state, G = sp.n_groups, g = h / (sp.num_heads / G);
  const int64_t I = f.d_inner, GN = static_cast<int64_t>(G) * N;
  const int W = cv.width, S = W - 1;
  // Before the wait: the row's state block (uploaded before the step's first kernel), its SSM state rows and conv
  // windows (last written by this layer's previous step) and the constant taps: nothing the predecessor writes.
  // What an earlier grid wrote is read through the L2.
  const int32_t blk = load_cg(a.state_indices + b);
  // This thread's conv channels (slot q): column c in xBC (-1: none), taps, bias and window.
  int64_t ch[kSlots];
  float cw[kSlots][kConvMaxWidth], cwin[kSlots][kConvMaxWidth], cb[kSlots];
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    int64_t c = -1;
    if (q == 0) {
      if (tid < kRowsPerBlock && r0 + tid < P) c = static_cast<int64_t>(h) * P + r0 + tid;
    } else if (const int j = tid + (q - 1) * kThreads; j < 2 * N) {
      c = I + (j < N ? static_cast<int64_t>(g) * N + j : GN + static_cast<int64_t>(g) * N + (j - N));
    }
    ch[q] = blk != 0 ? c : -1;
    if (ch[q] < 0) continue;
    const TS* win = static_cast<const TS*>(cv.conv_states.data) + blk * cv.conv_states.block_stride + c;
#pragma unroll
    for (int k = 0; k < kConvMaxWidth; ++k) {
      if (k > S) break;
      cw[q][k] = cv.weight[c * W + k];
      if (k < S) cwin[q][k] = load_cg(win + k * cv.dim);
    }
    cb[q] = cv.bias ? cv.bias[c] : 0.0f;
  }
  float st[kSsdRowsPerWarp][kSsdMaxPerLane];
  TS* state = static_cast<TS*>(sp.ssm_states.data) + blk * sp.ssm_states.block_stride +
              (static_cast<int64_t>(h) * P) * N;
  const bool rows_here = blk != 0 && p0 < P;  // uniform over the warp
  if (rows_here) {
#pragma unroll
    for (int r = 0; r < kSsdRowsPerWarp; ++r)
#pragma unroll
      for (int k = 0; k < kSsdMaxPerLane; ++k) {
        const int n = lane + 32 * k, pr = p0 + r;
        st[r][k] = (n < N && pr < P) ? load_cg(state + static_cast<int64_t>(pr) * N + n) : 0.0f;
      }
  }
  // The head's dt_bias / A / D and this block's rows of the norm weight (the last block's norm reads every block's),
  // hinted into the L2 before the wait: after it they would be HBM round trips behind out_proj's weight stream.
  if (tid == 0) {
    if (sp.dt_bias) l2_hint(sp.dt_bias + h);
    l2_hint(sp.A + h);
    if (sp.D) l2_hint(sp.D + h);
  } else if (tid == 32 && r0 < P) {
    l2_hint(a.norm_weight + static_cast<int64_t>(h) * P + r0);
  }
  pdl_wait();  // proj comes from the in_proj GEMM, the direct predecessor
  pdl_launch_dependents();
  if (blk == 0) {  // a padding row: zero out rows (finite), every block of the row leaves, its counter untouched
    if (tid < kRowsPerBlock && r0 + tid < P)
      static_cast<bf16*>(a.out)[b * a.out_stride + static_cast<int64_t>(h) * P + r0 + tid] = __float2bfloat16_rn(0.0f);
    return;
  }
  const float* prow = a.proj + static_cast<int64_t>(b) * a.proj_stride;
  float xin[kSlots];
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    if (ch[q] < 0) continue;
    xin[q] = prow[I + ch[q]];
    const float v = conv_window_output(cw[q], cb[q], cwin[q], W, xin[q], cv.apply_silu);
    if (q == 0) {
      x_s[tid] = v;
      // This block's x channels: no other block reads their windows, so they shift now.
      TS* win = static_cast<TS*>(cv.conv_states.data) + blk * cv.conv_states.block_stride + ch[q];
#pragma unroll
      for (int k = 0; k < kConvMaxWidth - 1; ++k) {
        if (k >= S) break;
        store(win + k * cv.dim, k + 1 < S ? cwin[q][k + 1] : xin[q]);
      }
    } else {
      bc_s[tid + (q - 1) * kThreads] = v;
    }
  }
  __syncthreads();
  if (rows_here) {
    float dt, dA;
    ssd_dt(sp, h, prow[I + cv.dim + h], dt, dA);
    const float Dh = sp.D ? sp.D[h] : 0.0f;
    const float mine = ssd_token_rows(st, N, P, p0, lane, dt, dA, Dh, x_s + (p0 - r0), bc_s, bc_s + N);
#pragma unroll
    for (int r = 0; r < kSsdRowsPerWarp; ++r)
#pragma unroll
      for (int k = 0; k < kSsdMaxPerLane; ++k) {
        const int n = lane + 32 * k, pr = p0 + r;
        if (n < N && pr < P) store(state + static_cast<int64_t>(pr) * N + n, st[r][k]);
      }
    if (lane < kSsdRowsPerWarp && p0 + lane < P) a.y[b * I + static_cast<int64_t>(h) * P + p0 + lane] = mine;
  }
  // Arrival: the last block of (row, group) to finish has every y of the group and every block's read of the B / C
  // windows behind it.
  __threadfence();
  __syncthreads();
  if (tid == 0) {  // atomicInc wraps the count to 0 at the last arrival: zero again for the next launch
    const unsigned blocks = gridDim.x * static_cast<unsigned>(sp.num_heads / G);
    last_s = atomicInc(reinterpret_cast<unsigned*>(a.counters) + static_cast<int64_t>(b) * G + g, blocks - 1) == blocks - 1;
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
#pragma unroll
  for (int q = 1; q < kSlots; ++q) {
    if (ch[q] < 0) continue;
    TS* win = static_cast<TS*>(cv.conv_states.data) + blk * cv.conv_states.block_stride + ch[q];
#pragma unroll
    for (int k = 0; k < kConvMaxWidth - 1; ++k) {
      if (k >= S) break;
      store(win + k * cv.dim, k + 1 < S ? cwin[q][k + 1] : xin[q]);
    }
  }
  const int64_t g0 = static_cast<int64_t>(g) * f.group_size;
  gated_norm_group_in_block(a.y + b * I + g0, prow + g0, a.norm_weight + g0, a.eps, f.group_size, a.norm_before_gate,
                            static_cast<bf16*>(a.out) + b * a.out_stride + g0, f.norm_threads, f.norm_vpt, scratch);
}

GatedNormVecPlan norm_plan(const Mamba2DecodeArgs& a) {
  const int64_t I = static_cast<int64_t>(a.ssd.num_heads) * a.ssd.head_dim;
  return a.ssd.n_groups >= 1 && I % a.ssd.n_groups == 0
             ? gated_norm_vec_plan(a.y, I, a.proj, a.proj_stride, a.norm_weight, a.out, a.out_stride, a.out_dtype,
                                   I / a.ssd.n_groups)
             : GatedNormVecPlan{};
}

}  // namespace

bool mamba2_decode_fused_fits(const Mamba2DecodeArgs& a, int rows) {
  const SsdParams& p = a.ssd;
  const ConvParams& c = a.conv;
  const int64_t I = static_cast<int64_t>(p.num_heads) * p.head_dim, GN = static_cast<int64_t>(p.n_groups) * p.d_state;
  const DType sd = p.ssm_states.dtype;
  return rows >= 1 && rows <= kMamba2FusedMaxRows && p.num_heads >= 1 && p.num_heads <= 65535 && p.head_dim >= 1 &&
         p.head_dim <= 4096 && p.n_groups >= 1 && p.num_heads % p.n_groups == 0 && p.d_state >= 1 &&
         p.d_state <= 32 * kSsdMaxPerLane && p.A && p.ssm_states.data && c.width >= 1 && c.width <= kConvMaxWidth &&
         c.weight && (c.width == 1 || c.conv_states.data) && c.dim == I + 2 * GN && c.conv_states.dtype == sd &&
         (sd == DType::F32 || sd == DType::BF16) && a.proj && a.proj_stride >= I + c.dim + p.num_heads &&
         a.state_indices && a.y && a.norm_weight && a.out && a.out_stride >= I && a.out_dtype == DType::BF16 &&
         a.counters && norm_plan(a).vpt > 0;
}

cudaError_t mamba2_decode_fused(const Mamba2DecodeArgs& a, int rows, cudaStream_t stream, bool pdl) {
  if (!mamba2_decode_fused_fits(a, rows)) return cudaErrorInvalidValue;
  const GatedNormVecPlan plan = norm_plan(a);
  const int64_t I = static_cast<int64_t>(a.ssd.num_heads) * a.ssd.head_dim;
  const FusedArgs f{a, I, I / a.ssd.n_groups, plan.threads, plan.vpt};
  const dim3 grid(ceil_div(a.ssd.head_dim, kRowsPerBlock), static_cast<unsigned>(a.ssd.num_heads),
                  static_cast<unsigned>(rows));
  if (a.ssd.ssm_states.dtype == DType::BF16)
    return launch_pdl(pdl, mamba2_decode_kernel<bf16>, grid, dim3(kThreads), 0, stream, f);
  return launch_pdl(pdl, mamba2_decode_kernel<float>, grid, dim3(kThreads), 0, stream, f);
}

}  // namespace ssmserve::cuda
