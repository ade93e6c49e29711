// Owns the fused decode kernels (see decode_ops.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kNormThreads = 256;

template <class TO>
__global__ void __launch_bounds__(kNormThreads) norm_rows_kernel(const float* __restrict__ x, int64_t x_stride,
                                                                 float* residual, int64_t res_stride,
                                                                 const float* __restrict__ weight, float eps,
                                                                 const int32_t* __restrict__ rows, int64_t H,
                                                                 bool write_residual, TO* out, int64_t out_stride) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x, r = rows ? rows[i] : i;
  float* res = residual + r * res_stride;
  const float* xr = x ? x + r * x_stride : nullptr;
  float ss = 0.0f;
  for (int64_t h = threadIdx.x; h < H; h += kNormThreads) {
    float v = res[h];
    if (xr) {
      v += xr[h];
      if (write_residual) res[h] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);  // also orders the residual writes before the re-reads below
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
  TO* o = out + i * out_stride;
  for (int64_t h = threadIdx.x; h < H; h += kNormThreads) {
    const float v = (xr && !write_residual) ? res[h] + xr[h] : res[h];
    store(o + h, v * inv * weight[h]);
  }
}

constexpr int kConvThreads = 128, kMaxWidth = 8;

template <class TS>
__global__ void conv_update_dual_kernel(const float* __restrict__ x, int64_t x_stride, float* __restrict__ out,
                                        int64_t out_stride, __nv_bfloat16* __restrict__ out2, int64_t out2_stride,
                                        ConvParams p, const int32_t* __restrict__ state_indices) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kConvThreads + threadIdx.x;
  const int b = blockIdx.x;
  if (c >= p.dim) return;
  const int32_t block = state_indices[b];
  if (block == 0) return;
  const int W = p.width, S = W - 1;
  const int64_t D = p.dim;
  TS* state = static_cast<TS*>(p.conv_states.data) + block * p.conv_states.block_stride;
  const float xv = x[b * x_stride + c];
  float acc = p.bias ? p.bias[c] : 0.0f;  // causal_conv1d.cu's order: bias, then taps oldest to newest
  float win[kMaxWidth];
#pragma unroll
  for (int k = 0; k < kMaxWidth - 1; ++k) {
    if (k >= S) break;
    win[k] = load(state + k * D + c);
    acc = fmaf(p.weight[c * W + k], win[k], acc);
  }
  acc = fmaf(p.weight[c * W + S], xv, acc);
#pragma unroll
  for (int k = 0; k < kMaxWidth - 1; ++k) {
    if (k >= S) break;
    store(state + k * D + c, k + 1 < S ? win[k + 1] : xv);
  }
  const float v = p.apply_silu ? silu(acc) : acc;
  out[b * out_stride + c] = v;
  if (out2) out2[b * out2_stride + c] = __float2bfloat16_rn(v);
}

constexpr int kScanThreads = 128, kMaxPerLane = 8;

/// selective_scan.cu's scan_kernel for one token per row (same operation order).
template <class TS, class TY>
__global__ void __launch_bounds__(kScanThreads) scan_update_kernel(ScanInputs in, ScanParams p, TY* __restrict__ y,
                                                                   int64_t y_stride,
                                                                   const int32_t* __restrict__ state_indices,
                                                                   int lanes) {
  pdl_wait();
  pdl_launch_dependents();
  const int s = blockIdx.y;
  const int32_t block = state_indices[s];
  if (block == 0) return;
  const int N = p.d_state;
  const int group = threadIdx.x / lanes, lane = threadIdx.x % lanes;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (kScanThreads / lanes) + group;
  const bool valid = c < p.dim;
  const int64_t cc = valid ? c : 0;
  const int64_t t = s;
  TS* state = static_cast<TS*>(p.ssm_states.data) + block * p.ssm_states.block_stride + cc * N;
  float dt = in.delta.data[t * in.delta.stride + cc] + (p.delta_bias ? p.delta_bias[cc] : 0.0f);
  if (p.delta_softplus) dt = softplus(dt);
  const float u = in.u.data[t * in.u.stride + cc];
  const float* Bt = in.B.data + t * in.B.stride;
  const float* Ct = in.C.data + t * in.C.stride;
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int n = lane + k * lanes;
    if (n < N) {
      const bool on = valid;
      const float a = on ? p.A[cc * N + n] : 0.0f;
      const float st = on ? load(state + n) : 0.0f;
      const float sn = expf(dt * a) * st + dt * Bt[n] * u;
      if (on) store(state + n, sn);
      acc += sn * Ct[n];
    }
  }
  for (int o = lanes >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o, lanes);
  if (valid && lane == 0) {
    float outv = acc + (p.D ? p.D[cc] : 0.0f) * u;
    if (in.z.data) outv *= silu(in.z.data[t * in.z.stride + cc]);
    store(y + t * y_stride + cc, outv);
  }
}

/// norms.cu's gated_rms_norm_kernel with the PDL wait: one block per (row, group).
template <class TO>
__global__ void gated_norm_kernel(const float* y, int64_t y_stride, const float* __restrict__ z, int64_t z_stride,
                                  const float* __restrict__ weight, float eps, int64_t group_size,
                                  bool norm_before_gate, TO* out, int64_t out_stride) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x, g0 = blockIdx.y * group_size;
  const float* yt = y + t * y_stride;
  const float* zt = z + t * z_stride;
  float ss = 0.0f;
  for (int64_t d = g0 + threadIdx.x; d < g0 + group_size; d += blockDim.x) {
    const float h = norm_before_gate ? yt[d] : yt[d] * silu(zt[d]);
    ss += h * h;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(group_size) + eps);
  TO* o = out + t * out_stride;
  for (int64_t d = g0 + threadIdx.x; d < g0 + group_size; d += blockDim.x) {
    const float h = norm_before_gate ? yt[d] : yt[d] * silu(zt[d]);
    float v = h * inv * weight[d];
    if (norm_before_gate) v *= silu(zt[d]);
    store(o + d, v);
  }
}

int lanes_for(int N) {
  int l = 1;
  while (l < N && l < 32) l *= 2;
  return l;
}

}  // namespace

cudaError_t add_rms_norm_rows(const float* x, int64_t x_stride, float* residual, int64_t res_stride,
                              const float* weight, float eps, const int32_t* rows, int64_t n, int64_t H,
                              bool write_residual, void* out, DType out_dtype, int64_t out_stride, bool pdl,
                              cudaStream_t stream) {
  if (n < 0 || H < 1 || res_stride < H || out_stride < H || (x && x_stride < H) || n > 2147483647 ||
      (out_dtype != DType::F32 && out_dtype != DType::BF16) || (rows && write_residual) || !residual || !weight)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n));
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, norm_rows_kernel<__nv_bfloat16>, grid, dim3(kNormThreads), 0, stream, x, x_stride,
                      residual, res_stride, weight, eps, rows, H, write_residual, static_cast<__nv_bfloat16*>(out),
                      out_stride);
  return launch_pdl(pdl, norm_rows_kernel<float>, grid, dim3(kNormThreads), 0, stream, x, x_stride, residual,
                    res_stride, weight, eps, rows, H, write_residual, static_cast<float*>(out), out_stride);
}

cudaError_t conv1d_update_dual(const float* x, int64_t x_stride, float* out, int64_t out_stride, void* out_bf16,
                               int64_t out_bf16_stride, const ConvParams& p, const int32_t* state_indices, int batch,
                               bool pdl, cudaStream_t stream) {
  if (p.dim < 1 || p.width < 1 || p.width > kMaxWidth || !p.weight || (p.width > 1 && !p.conv_states.data) ||
      p.dim > 65535LL * kConvThreads || x_stride < p.dim || out_stride < p.dim || batch < 0 ||
      (out_bf16 && out_bf16_stride < p.dim) || batch > 2147483647)
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(batch), ceil_div(p.dim, kConvThreads));
  return visit_dtype(p.conv_states.dtype, [&](auto tag) {
    return launch_pdl(pdl, conv_update_dual_kernel<decltype(tag)>, grid, dim3(kConvThreads), 0, stream, x, x_stride,
                      out, out_stride, static_cast<__nv_bfloat16*>(out_bf16), out_bf16_stride, p, state_indices);
  });
}

cudaError_t selective_state_update_out(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                       int64_t y_stride, const int32_t* state_indices, int batch, bool pdl,
                                       cudaStream_t stream) {
  if (p.dim < 1 || p.d_state < 1 || p.d_state > 32 * kMaxPerLane || !p.A || y_stride < p.dim ||
      in.u.stride < p.dim || in.delta.stride < p.dim || in.B.stride < p.d_state || in.C.stride < p.d_state ||
      (in.z.data && in.z.stride < p.dim) || !p.ssm_states.data || batch < 0 || batch > 65535 ||
      (y_dtype != DType::F32 && y_dtype != DType::BF16))
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const int lanes = lanes_for(p.d_state);
  const dim3 grid(ceil_div(p.dim, kScanThreads / lanes), static_cast<unsigned>(batch));
  return visit_dtype(p.ssm_states.dtype, [&](auto tag) {
    using TS = decltype(tag);
    if (y_dtype == DType::BF16)
      return launch_pdl(pdl, scan_update_kernel<TS, __nv_bfloat16>, grid, dim3(kScanThreads), 0, stream, in, p,
                        static_cast<__nv_bfloat16*>(y), y_stride, state_indices, lanes);
    return launch_pdl(pdl, scan_update_kernel<TS, float>, grid, dim3(kScanThreads), 0, stream, in, p,
                      static_cast<float*>(y), y_stride, state_indices, lanes);
  });
}

cudaError_t gated_rms_norm_pdl(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                               float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, void* out,
                               DType out_dtype, int64_t out_stride, bool pdl, cudaStream_t stream) {
  if (T < 0 || D < 1 || group_size < 1 || D % group_size != 0 || y_stride < D || z_stride < D || out_stride < D ||
      T > 2147483647 || D / group_size > 65535 || (out_dtype != DType::F32 && out_dtype != DType::BF16))
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(D / group_size));
  int threads = 32;  // norms.cu's threads_for(group_size / 4): the same block shape, so the same sums
  while (threads < 1024 && threads < group_size / 4) threads *= 2;
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, gated_norm_kernel<__nv_bfloat16>, grid, dim3(threads), 0, stream, y, y_stride, z, z_stride,
                      weight, eps, group_size, norm_before_gate, static_cast<__nv_bfloat16*>(out), out_stride);
  return launch_pdl(pdl, gated_norm_kernel<float>, grid, dim3(threads), 0, stream, y, y_stride, z, z_stride, weight,
                    eps, group_size, norm_before_gate, static_cast<float*>(out), out_stride);
}

}  // namespace ssmserve::cuda
