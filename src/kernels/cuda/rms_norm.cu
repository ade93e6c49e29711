// Owns the GPU norms and the embedding gather (see rms_norm.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gated_norm_vec.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rms_norm.h"

#include <algorithm>

namespace ssmserve::cuda {
namespace {
using namespace detail;

template <class TT>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const TT* __restrict__ table, int64_t vocab,
                                 int64_t H, float* __restrict__ out, int64_t out_stride) {
  pdl_wait();  // ids may be the previous step's picks (multi-step decode)
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  float* o = out + t * out_stride;
  for (int64_t h = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; h < H;
       h += static_cast<int64_t>(gridDim.y) * blockDim.x)
    o[h] = ok ? load(table + static_cast<int64_t>(id) * H + h) : 0.0f;
}

template <class TO>
__global__ void add_rms_norm_kernel(const float* __restrict__ x, int64_t x_stride, float* residual,
                                    int64_t res_stride, const float* __restrict__ weight, float eps, int64_t H,
                                    TO* out, int64_t out_stride) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  float* r = residual + t * res_stride;
  const float* xt = x ? x + t * x_stride : nullptr;
  float ss = 0.0f;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float v = r[h];
    if (xt) {
      v += xt[h];
      r[h] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
  TO* o = out + t * out_stride;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) store(o + h, r[h] * inv * weight[h]);
}

/// One block per (row, group).
template <class TO>
__global__ void gated_rms_norm_kernel(const float* y, int64_t y_stride, const float* __restrict__ z,
                                      int64_t z_stride, const float* __restrict__ weight, float eps,
                                      int64_t group_size, bool norm_before_gate, TO* out, int64_t out_stride) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x, g0 = blockIdx.y * group_size;
  const float* yt = y + t * y_stride;
  const float* zt = z + t * z_stride;
  float ss = 0.0f;
  for (int64_t d = g0 + threadIdx.x; d < g0 + group_size; d += blockDim.x) {
    const float h = norm_before_gate ? yt[d] : yt[d] * silu(zt[d]);
    ss += h * h;
  }
  ss = block_sum(ss, scratch);  // also orders every read of y before the writes below (out may alias y)
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(group_size) + eps);
  TO* o = out + t * out_stride;
  for (int64_t d = g0 + threadIdx.x; d < g0 + group_size; d += blockDim.x) {
    const float h = norm_before_gate ? yt[d] : yt[d] * silu(zt[d]);
    float v = h * inv * weight[d];
    if (norm_before_gate) v *= silu(zt[d]);
    store(o + d, v);
  }
}

template <class TO>
__global__ void cast_rows_kernel(const float* __restrict__ in, int64_t in_stride, int64_t cols, TO* __restrict__ out,
                                 int64_t out_stride) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;
  for (int64_t c = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.y) * blockDim.x)
    store(out + r * out_stride + c, in[r * in_stride + c]);
}

/// cast_rows_kernel for prefill-sized steps (KernelTuning::prefill_row_kernels, rows >= 64): grid (rows, ceil(cols /
/// 2048)), 256 threads, 8 consecutive columns per thread as two 16-byte loads and one 16- (bf16) or two 16-byte
/// (fp32) stores (the old form moved 4 bytes per thread); the same store() per element. cols, strides multiples of 8,
/// rows 16-byte aligned (cast_rows checks).
template <class TO>
__global__ void __launch_bounds__(256) cast_rows_vec_kernel(const float* __restrict__ in, int64_t in_stride,
                                                            int64_t cols, TO* __restrict__ out, int64_t out_stride) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t r = blockIdx.x, c = (static_cast<int64_t>(blockIdx.y) * 256 + threadIdx.x) * 8;
  if (c >= cols) return;
  const float4 a = *reinterpret_cast<const float4*>(in + r * in_stride + c);
  const float4 b = *reinterpret_cast<const float4*>(in + r * in_stride + c + 4);
  __align__(16) TO v[8];
  store(v + 0, a.x), store(v + 1, a.y), store(v + 2, a.z), store(v + 3, a.w);
  store(v + 4, b.x), store(v + 5, b.y), store(v + 6, b.z), store(v + 7, b.w);
  const uint4* src = reinterpret_cast<const uint4*>(v);
  uint4* dst = reinterpret_cast<uint4*>(out + r * out_stride + c);
  for (size_t i = 0; i < sizeof(v) / 16; ++i) dst[i] = src[i];
}

__global__ void gather_rows_kernel(const float* __restrict__ in, int64_t in_stride, const int32_t* __restrict__ idx,
                                   int64_t cols, float* __restrict__ out, int64_t out_stride) {
  const int64_t i = blockIdx.x;
  const float* src = in + static_cast<int64_t>(idx[i]) * in_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[i * out_stride + c] = src[c];
}

int threads_for(int64_t n) {
  int t = 32;
  while (t < 1024 && t < n) t *= 2;
  return t;
}

}  // namespace

cudaError_t cast_rows(const float* in, int64_t in_stride, int64_t rows, int64_t cols, void* out, DType out_dtype,
                      int64_t out_stride, cudaStream_t stream, bool pdl) {
  if (rows < 0 || cols < 0 || in_stride < cols || out_stride < cols || rows > 2147483647 || out_dtype == DType::F16)
    return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  const auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (kernel_tuning().prefill_row_kernels && rows >= 64 && cols % 8 == 0 && in_stride % 8 == 0 && out_stride % 8 == 0 &&
      al16(in) && al16(out) && ceil_div(cols, 2048) <= 65535u) {
    const dim3 vgrid(static_cast<unsigned>(rows), ceil_div(cols, 2048));
    if (out_dtype == DType::BF16)
      return launch_pdl(pdl, cast_rows_vec_kernel<__nv_bfloat16>, vgrid, dim3(256), 0, stream, in, in_stride, cols,
                        static_cast<__nv_bfloat16*>(out), out_stride);
    return launch_pdl(pdl, cast_rows_vec_kernel<float>, vgrid, dim3(256), 0, stream, in, in_stride, cols,
                      static_cast<float*>(out), out_stride);
  }
  const dim3 grid(static_cast<unsigned>(rows), std::min(ceil_div(cols, 256), 65535u));
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, cast_rows_kernel<__nv_bfloat16>, grid, dim3(256), 0, stream, in, in_stride, cols,
                      static_cast<__nv_bfloat16*>(out), out_stride);
  return launch_pdl(pdl, cast_rows_kernel<float>, grid, dim3(256), 0, stream, in, in_stride, cols,
                    static_cast<float*>(out), out_stride);
}

cudaError_t gather_rows(const float* in, int64_t in_stride, const int32_t* idx, int64_t n, int64_t cols, float* out,
                        int64_t out_stride, cudaStream_t stream) {
  if (n < 0 || cols < 0 || in_stride < cols || out_stride < cols || n > 2147483647) return cudaErrorInvalidValue;
  if (n == 0 || cols == 0) return cudaSuccess;
  gather_rows_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(in, in_stride, idx, cols, out, out_stride);
  return launch_status();
}

cudaError_t embedding(const int32_t* ids, int64_t T, const void* table, DType table_dtype, int64_t vocab, int64_t H,
                      float* out, int64_t out_stride, cudaStream_t stream, bool pdl) {
  if (T < 0 || H < 1 || vocab < 1 || out_stride < H || table_dtype == DType::F16 || T > 2147483647) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T), ceil_div(H, 256) > 65535u ? 65535u : ceil_div(H, 256));
  if (table_dtype == DType::BF16)
    return launch_pdl(pdl, embedding_kernel<__nv_bfloat16>, grid, dim3(256), 0, stream, ids,
                      static_cast<const __nv_bfloat16*>(table), vocab, H, out, out_stride);
  return launch_pdl(pdl, embedding_kernel<float>, grid, dim3(256), 0, stream, ids, static_cast<const float*>(table), vocab,
                    H, out, out_stride);
}

cudaError_t fused_add_rms_norm(const float* x, int64_t x_stride, float* residual, int64_t res_stride,
                               const float* weight, float eps, int64_t T, int64_t H, void* out, DType out_dtype,
                               int64_t out_stride, cudaStream_t stream, bool pdl) {
  if (T < 0 || H < 1 || res_stride < H || out_stride < H || (x && x_stride < H) || T > 2147483647 ||
      out_dtype == DType::F16)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const int threads = threads_for(H / 4);
  const dim3 grid(static_cast<unsigned>(T));
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, add_rms_norm_kernel<__nv_bfloat16>, grid, dim3(threads), 0, stream, x, x_stride, residual,
                      res_stride, weight, eps, H, static_cast<__nv_bfloat16*>(out), out_stride);
  return launch_pdl(pdl, add_rms_norm_kernel<float>, grid, dim3(threads), 0, stream, x, x_stride, residual, res_stride,
                    weight, eps, H, static_cast<float*>(out), out_stride);
}

cudaError_t gated_rms_norm(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                           float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, void* out,
                           DType out_dtype, int64_t out_stride, cudaStream_t stream) {
  if (T < 0 || D < 1 || group_size < 1 || D % group_size != 0 || y_stride < D || z_stride < D || out_stride < D ||
      T > 2147483647 || D / group_size > 65535 || out_dtype == DType::F16)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(D / group_size));
  if (const GatedNormVecPlan plan = gated_norm_vec_plan(y, y_stride, z, z_stride, weight, out, out_stride, out_dtype,
                                                        group_size);
      plan.vpt > 0)
    return dispatch_gated_norm_vec(plan, out_dtype, out, [&](auto kernel, auto* o) {
      const int G = gated_norm_vec_groups_per_block(plan, T, D / group_size);
      kernel<<<dim3(grid.x, grid.y / G), dim3(plan.threads, G), 0, stream>>>(y, y_stride, z, z_stride, weight, eps,
                                                                             group_size, norm_before_gate, o, out_stride);
      return launch_status();
    });
  const int threads = threads_for(group_size / 4);
  if (out_dtype == DType::BF16)
    gated_rms_norm_kernel<<<grid, threads, 0, stream>>>(y, y_stride, z, z_stride, weight, eps, group_size,
                                                         norm_before_gate, static_cast<__nv_bfloat16*>(out), out_stride);
  else
    gated_rms_norm_kernel<<<grid, threads, 0, stream>>>(y, y_stride, z, z_stride, weight, eps, group_size,
                                                         norm_before_gate, static_cast<float*>(out), out_stride);
  return launch_status();
}

}  // namespace ssmserve::cuda
