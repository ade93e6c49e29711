// Owns the elementwise GPU activations and residual steps (see activations.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

__global__ void silu_kernel(float* __restrict__ x, int64_t xs, int64_t cols) {
  float* row = x + static_cast<int64_t>(blockIdx.x) * xs;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] = silu(row[c]);
}

/// Columns per block of the row-slicing kernels below (grid (T, ceil(cols / kActCols))): a decode row of a wide
/// projection spreads over the GPU instead of one block.
constexpr int kActCols = 1024;

/// out = o * sigmoid(g), a kActCols slice of one row per block.
template <class TO>
__global__ void gate_kernel(const float* __restrict__ o, int64_t os, const float* __restrict__ g, int64_t gs,
                            int64_t cols, TO* __restrict__ out, int64_t outs) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int64_t end = min(cols, static_cast<int64_t>(blockIdx.y + 1) * kActCols);
  for (int64_t c = static_cast<int64_t>(blockIdx.y) * kActCols + threadIdx.x; c < end; c += blockDim.x)
    store(out + t * outs + c, sigmoid_gate_value(o[t * os + c], g[t * gs + c]));
}

/// gate_kernel for prefill-sized steps (KernelTuning::prefill_row_kernels, T >= 64): grid (T, ceil(cols / 2048)),
/// 256 threads, 8 consecutive columns per thread with 16-byte loads and 16- (bf16) / 32-byte (fp32) stores; the same
/// per-element expression. cols and strides multiples of 8, rows 16-byte aligned (sigmoid_gate checks).
template <class TO>
__global__ void __launch_bounds__(256) gate_vec_kernel(const float* __restrict__ o, int64_t os,
                                                       const float* __restrict__ g, int64_t gs, int64_t cols,
                                                       TO* __restrict__ out, int64_t outs) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x, c = (static_cast<int64_t>(blockIdx.y) * 256 + threadIdx.x) * 8;
  if (c >= cols) return;
  const float4 o0 = *reinterpret_cast<const float4*>(o + t * os + c), o1 = *reinterpret_cast<const float4*>(o + t * os + c + 4);
  const float4 g0 = *reinterpret_cast<const float4*>(g + t * gs + c), g1 = *reinterpret_cast<const float4*>(g + t * gs + c + 4);
  const float ov[8] = {o0.x, o0.y, o0.z, o0.w, o1.x, o1.y, o1.z, o1.w};
  const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
  __align__(16) TO v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) store(v + i, sigmoid_gate_value(ov[i], gv[i]));
  const uint4* src = reinterpret_cast<const uint4*>(v);
  uint4* dst = reinterpret_cast<uint4*>(out + t * outs + c);
  for (size_t i = 0; i < sizeof(v) / 16; ++i) dst[i] = src[i];
}

/// gated: out = silu(gu[:, :I]) * gu[:, I:2I]; else out = relu(gu[:, :I])^2.
/// Grid (T, ceil(I / kActCols)): each block a slice of one row, so a decode row of a wide MLP spreads over the GPU.
/// interleaved8: gate c at column 16 (c / 8) + c % 8, up c 8 columns after it (mlp_activation).
template <class TO>
__global__ void mlp_act_kernel(const float* __restrict__ gu, int64_t gs, int64_t I, bool gated, TO* __restrict__ out,
                               int64_t outs, bool interleaved8) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const float* r = gu + t * gs;
  const int64_t end = min(I, static_cast<int64_t>(blockIdx.y + 1) * kActCols);
  for (int64_t c = static_cast<int64_t>(blockIdx.y) * kActCols + threadIdx.x; c < end; c += blockDim.x) {
    const int64_t gc = interleaved8 ? 16 * (c / 8) + c % 8 : c, uc = interleaved8 ? gc + 8 : I + c;
    store(out + t * outs + c, mlp_act_value(r[gc], gated ? r[uc] : 0.0f, gated));
  }
}

__global__ void residual_kernel(float* h, const float* x, float a, const float* y, float b, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    h[i] = residual_step(x[i], a, y[i], b);
}

__global__ void residual2_kernel(float* h, float a1, const float* x, float b1, float a2, const float* y, float b2, int64_t n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    h[i] = residual_step(residual_step(h[i], a1, x[i], b1), a2, y[i], b2);  // residual_kernel's step, twice
  }
}

/// Grid (T), 256 threads: s = block_sigmoid_dot(x[t], w), then out[t] += s * y[t] (one FMA per column; the same bits
/// as sparse_moe's combine with MoeSharedAdd::gate).
__global__ void __launch_bounds__(256) gated_add_kernel(float* __restrict__ out, int64_t os, const float* __restrict__ y,
                                                        int64_t ys, const float* __restrict__ x, int64_t xs,
                                                        const float* __restrict__ w, int64_t H) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const float s = block_sigmoid_dot(x + t * xs, w, H, scratch);
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) out[t * os + c] = __fmaf_rn(s, y[t * ys + c], out[t * os + c]);
}

/// One block of 256 threads per row: s[t] = block_sigmoid_dot(x[t], w), gated_add_kernel's and combine_kernel's s.
__global__ void __launch_bounds__(256) sigmoid_gate_rows_kernel(const float* __restrict__ x, int64_t xs,
                                                                const float* __restrict__ w, int64_t H,
                                                                float* __restrict__ s) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const float v = block_sigmoid_dot(x + t * xs, w, H, scratch);
  if (threadIdx.x == 0) s[t] = v;
}

}  // namespace

cudaError_t silu_inplace(float* x, int64_t x_stride, int64_t T, int64_t cols, cudaStream_t stream) {
  if (T < 0 || cols < 0 || x_stride < cols) return cudaErrorInvalidValue;
  if (T == 0 || cols == 0) return cudaSuccess;
  silu_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(x, x_stride, cols);
  return launch_status();
}

cudaError_t sigmoid_gate(const float* o, int64_t o_stride, const float* g, int64_t g_stride, int64_t T, int64_t cols,
                         void* out, DType out_dtype, int64_t out_stride, cudaStream_t stream, bool pdl) {
  if (T < 0 || cols < 0 || o_stride < cols || g_stride < cols || out_stride < cols || out_dtype == DType::F16 ||
      T > 2147483647 || ceil_div(cols, kActCols) > 65535)
    return cudaErrorInvalidValue;
  if (T == 0 || cols == 0) return cudaSuccess;
  const auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (kernel_tuning().prefill_row_kernels && T >= 64 && cols % 8 == 0 && o_stride % 8 == 0 && g_stride % 8 == 0 &&
      out_stride % 8 == 0 && al16(o) && al16(g) && al16(out)) {
    const dim3 vgrid(static_cast<unsigned>(T), ceil_div(cols, 2048));
    if (out_dtype == DType::BF16)
      return launch_pdl(pdl, gate_vec_kernel<__nv_bfloat16>, vgrid, dim3(256), 0, stream, o, o_stride, g, g_stride,
                        cols, static_cast<__nv_bfloat16*>(out), out_stride);
    return launch_pdl(pdl, gate_vec_kernel<float>, vgrid, dim3(256), 0, stream, o, o_stride, g, g_stride, cols,
                      static_cast<float*>(out), out_stride);
  }
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(ceil_div(cols, kActCols)));
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, gate_kernel<__nv_bfloat16>, grid, dim3(256), 0, stream, o, o_stride, g, g_stride, cols,
                      static_cast<__nv_bfloat16*>(out), out_stride);
  return launch_pdl(pdl, gate_kernel<float>, grid, dim3(256), 0, stream, o, o_stride, g, g_stride, cols,
                    static_cast<float*>(out), out_stride);
}

cudaError_t mlp_activation(const float* gu, int64_t gu_stride, int64_t T, int64_t I, bool gated, void* out, DType out_dtype,
                           int64_t out_stride, cudaStream_t stream, bool pdl, bool interleaved8) {
  if (T < 0 || I < 0 || T > 2147483647 || ceil_div(I, kActCols) > 65535 || gu_stride < (gated ? 2 * I : I) || out_stride < I || out_dtype == DType::F16 ||
      (interleaved8 && (!gated || I % 8 != 0)))
    return cudaErrorInvalidValue;
  if (T == 0 || I == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(ceil_div(I, kActCols)));
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, mlp_act_kernel<__nv_bfloat16>, grid, dim3(256), 0, stream, gu, gu_stride, I, gated,
                      static_cast<__nv_bfloat16*>(out), out_stride, interleaved8);
  return launch_pdl(pdl, mlp_act_kernel<float>, grid, dim3(256), 0, stream, gu, gu_stride, I, gated,
                    static_cast<float*>(out), out_stride, interleaved8);
}

cudaError_t scaled_residual(float* h, const float* x, float a, const float* y, float b, int64_t n, cudaStream_t stream,
                            bool pdl) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 4096));
  return launch_pdl(pdl, residual_kernel, dim3(blocks), dim3(256), 0, stream, h, x, a, y, b, n);
}

cudaError_t scaled_residual2(float* h, float a1, const float* x, float b1, float a2, const float* y, float b2, int64_t n,
                             cudaStream_t stream, bool pdl) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(n, 256), 4096));
  return launch_pdl(pdl, residual2_kernel, dim3(blocks), dim3(256), 0, stream, h, a1, x, b1, a2, y, b2, n);
}

cudaError_t sigmoid_gated_add(float* out, int64_t out_stride, const float* y, int64_t y_stride, const float* x, int64_t x_stride,
                              const float* w, int64_t T, int64_t H, cudaStream_t stream, bool pdl) {
  if (T < 0 || T > 2147483647 || H < 0 || out_stride < H || y_stride < H || x_stride < H) return cudaErrorInvalidValue;
  if (T == 0 || H == 0) return cudaSuccess;
  return launch_pdl(pdl, gated_add_kernel, dim3(static_cast<unsigned>(T)), dim3(256), 0, stream, out, out_stride, y,
                    y_stride, x, x_stride, w, H);
}

cudaError_t sigmoid_gate_rows(const float* x, int64_t x_stride, const float* w, int64_t T, int64_t H, float* s,
                              cudaStream_t stream, bool pdl) {
  if (T < 0 || T > 2147483647 || H < 0 || x_stride < H || (T > 0 && (!x || !w || !s))) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  return launch_pdl(pdl, sigmoid_gate_rows_kernel, dim3(static_cast<unsigned>(T)), dim3(256), 0, stream, x, x_stride, w,
                    H, s);
}

}  // namespace ssmserve::cuda
