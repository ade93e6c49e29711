// Owns the fused decode kernels (see decode_ops.h).
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gated_norm_vec.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kNormThreads = 256;

/// l2_prefetch's kernel: the lines (mode 0 / 1) or 64 KB pieces (mode 2) of [base, base + bytes), grid-strided.
__global__ void l2_prefetch_kernel(const char* base, size_t bytes, int mode) {
  const size_t nthreads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (mode == 2) {
    constexpr size_t kPiece = size_t{64} << 10;
    const uintptr_t a = reinterpret_cast<uintptr_t>(base), lo = (a + 15) & ~uintptr_t{15};
    if (bytes <= lo - a + 16) return;
    const size_t n = (bytes - (lo - a)) & ~size_t{15};
    const char* q = reinterpret_cast<const char*>(lo);
    for (size_t off = tid * kPiece; off < n; off += nthreads * kPiece) {
      const unsigned piece = static_cast<unsigned>(n - off < kPiece ? n - off : kPiece);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(q + off), "r"(piece) : "memory");
    }
    return;
  }
  const size_t lines = (bytes + 127) / 128;
  if (mode == 1) {
    for (size_t l = tid; l < lines; l += nthreads)
      asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(base + l * 128));
  } else {
    for (size_t l = tid; l < lines; l += nthreads) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + l * 128));
  }
}

/// x with a NormAddend row value y: x + y rounded once (residual_step(x, 1, y, 1): scaled_residual(x, x, 1, y, 1)'s),
/// or with the row's gate g (gated): fma(g, y, x), the MoE combine's gated add.
__device__ __forceinline__ float addend_step(float x, float y, bool gated, float g) {
  return gated ? __fmaf_rn(g, y, x) : residual_step(x, 1.0f, y, 1.0f);
}

template <class TO>
__global__ void __launch_bounds__(kNormThreads) norm_rows_kernel(const float* __restrict__ x, int64_t x_stride,
                                                                 float* residual, int64_t res_stride,
                                                                 const float* __restrict__ weight, float eps,
                                                                 const int32_t* __restrict__ rows, int64_t H,
                                                                 bool write_residual, TO* out, int64_t out_stride,
                                                                 float ra, float xb, __nv_bfloat16* out2,
                                                                 int64_t out2_stride, NormAddend add) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x, r = rows ? rows[i] : i;
  float* res = residual + r * res_stride;
  const float* xr = x ? x + r * x_stride : nullptr;
  const float* x2r = add.rows && xr ? add.rows + r * add.stride : nullptr;
  const bool gated = x2r && add.gate;
  const float g = gated ? add.gate[r] : 0.0f;
  // x with the addend (NormAddend: x + rows rounded once, or one FMA with the row's gate), then the residual step.
  auto xv = [&](int64_t h) { return x2r ? addend_step(xr[h], x2r[h], gated, g) : xr[h]; };
  float ss = 0.0f;
  for (int64_t h = threadIdx.x; h < H; h += kNormThreads) {
    float v = res[h];
    if (xr) {
      v = residual_step(v, ra, xv(h), xb);
      if (write_residual) res[h] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);  // also orders the residual writes before the re-reads below
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
  TO* o = out + i * out_stride;
  __nv_bfloat16* o2 = out2 ? out2 + i * out2_stride : nullptr;
  for (int64_t h = threadIdx.x; h < H; h += kNormThreads) {
    const float v = (xr && !write_residual) ? residual_step(res[h], ra, xv(h), xb) : res[h];
    const float y = v * inv * weight[h];
    store(o + h, y);
    if (o2) store(o2 + h, y);  // the bf16 copy: cast_rows of the stored fp32 value
  }
}

/// float4 slots per thread of the vectorized form: 4 up to H = 256 * 4 * 4 = 4096, 8 up to 8192 (Nemotron-Nano-9B-v2's
/// 4480, Qwen3.6-27B's 5120: the serial loop of norm_rows_kernel took 10.4 us per decode row at 4480 on the H200).
constexpr int kNormVec = 4, kNormVecWide = 8;

/// norm_rows_kernel for H % 4 == 0, H <= 4 NV 256 and 16-byte aligned rows: every load of the row is issued at once
/// (NV float4 slots in registers) and the output is written from those registers, so a row costs one round trip to
/// memory instead of a serialized loop (decode: one block per row is latency-bound). Thread i sums the squares of
/// its slots i, i + 256, ... (x, y, z, w in order), then block_sum: a fixed order for a given H (NV is a function
/// of H, so a row's bits do not depend on the number of rows).
template <class TO, int NV>
__global__ void __launch_bounds__(kNormThreads) norm_rows_vec_kernel(const float* __restrict__ x, int64_t x_stride,
                                                                     float* residual, int64_t res_stride,
                                                                     const float* __restrict__ weight, float eps,
                                                                     const int32_t* __restrict__ rows, int64_t H,
                                                                     bool write_residual, TO* out, int64_t out_stride,
                                                                     float ra, float xb, __nv_bfloat16* out2,
                                                                     int64_t out2_stride, NormAddend add) {
  __shared__ float scratch[32];
  const int tid = threadIdx.x;
  const int64_t H4 = H / 4;
  float4 wv[NV], v[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t q = tid + j * kNormThreads;
    if (q < H4) wv[j] = reinterpret_cast<const float4*>(weight)[q];
  }
  pdl_wait();
  pdl_launch_dependents();
  const int64_t i = blockIdx.x, r = rows ? rows[i] : i;
  float4* res = reinterpret_cast<float4*>(residual + r * res_stride);
  const float4* xr = x ? reinterpret_cast<const float4*>(x + r * x_stride) : nullptr;
  // The addend's rows read with scalar loads: their alignment must not pick the kernel form (the forms sum the squares
  // in other orders).
  const float* x2r = add.rows && xr ? add.rows + r * add.stride : nullptr;
  const bool gated = x2r && add.gate;
  const float g = gated ? add.gate[r] : 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t q = tid + j * kNormThreads;
    if (q < H4) {
      v[j] = res[q];
      if (xr) {
        float4 a = xr[q];
        if (x2r) {  // the addend (NormAddend)
          a.x = addend_step(a.x, x2r[4 * q], gated, g), a.y = addend_step(a.y, x2r[4 * q + 1], gated, g);
          a.z = addend_step(a.z, x2r[4 * q + 2], gated, g), a.w = addend_step(a.w, x2r[4 * q + 3], gated, g);
        }
        v[j].x = residual_step(v[j].x, ra, a.x, xb), v[j].y = residual_step(v[j].y, ra, a.y, xb);
        v[j].z = residual_step(v[j].z, ra, a.z, xb), v[j].w = residual_step(v[j].w, ra, a.w, xb);
      }
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t q = tid + j * kNormThreads;
    if (q < H4) {
      ss += v[j].x * v[j].x;
      ss += v[j].y * v[j].y;
      ss += v[j].z * v[j].z;
      ss += v[j].w * v[j].w;
      if (xr && write_residual) res[q] = v[j];
    }
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
  TO* o = out + i * out_stride;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t q = tid + j * kNormThreads;
    if (q < H4) {
      const float y0 = v[j].x * inv * wv[j].x, y1 = v[j].y * inv * wv[j].y, y2 = v[j].z * inv * wv[j].z,
                  y3 = v[j].w * inv * wv[j].w;
      store(o + 4 * q + 0, y0);
      store(o + 4 * q + 1, y1);
      store(o + 4 * q + 2, y2);
      store(o + 4 * q + 3, y3);
      if (out2) {  // the bf16 copy: cast_rows of the stored fp32 values
        __nv_bfloat16* o2 = out2 + i * out2_stride + 4 * q;
        store(o2 + 0, y0), store(o2 + 1, y1), store(o2 + 2, y2), store(o2 + 3, y3);
      }
    }
  }
}

constexpr int kConvThreads = 128, kMaxWidth = kConvMaxWidth;

/// Pre-wait L2 prefetch of the decode state update kernels' operands that no predecessor writes (weights, A, and
/// the rows' states, whose indices were uploaded before the step's first kernel): a hint only, never a result.
/// KernelTuning::decode_prewait off (benchmarks) turns it off.
bool prewait_prefetch() { return kernel_tuning().decode_prewait; }

__device__ __forceinline__ void l2_line(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <class TS>
__global__ void conv_update_dual_kernel(const float* __restrict__ x, int64_t x_stride, float* __restrict__ out,
                                        int64_t out_stride, __nv_bfloat16* __restrict__ out2, int64_t out2_stride,
                                        ConvParams p, DeviceDecodeRows rows, bool prewait) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kConvThreads + threadIdx.x;
  const int b = blockIdx.x;
  if (prewait && c < p.dim) {
    l2_line(p.weight + c * p.width);
    const int32_t blk = rows.src_block(b, 0);
    if (blk != 0 && (threadIdx.x & 7) == 0)
      for (int k = 0; k < p.width - 1; ++k)
        l2_line(static_cast<const TS*>(p.conv_states.data) + blk * p.conv_states.block_stride + k * p.dim + c);
  }
  pdl_wait();
  pdl_launch_dependents();
  if (c >= p.dim || rows.is_null(b)) return;
  TS* base = static_cast<TS*>(p.conv_states.data) + c;
  const int n = rows.num_tokens(b);
  const int64_t t0 = rows.first_token(b);
  // Token j reads the window of column j - 1 and writes column j (one token: column 0 in place); the same thread
  // owns channel c in every column, so it reads back what it wrote.
  for (int j = 0; j < n; ++j) {
    const int64_t t = t0 + j;
    const float v = conv_update_channel(base + rows.src_block(b, j) * p.conv_states.block_stride,
                                        base + rows.dst_block(b, j) * p.conv_states.block_stride, p.dim, p.width,
                                        p.weight + c * p.width, p.bias ? p.bias[c] : 0.0f, x[t * x_stride + c],
                                        p.apply_silu);
    out[t * out_stride + c] = v;
    if (out2) out2[t * out2_stride + c] = __float2bfloat16_rn(v);
  }
}

constexpr int kScanThreads = 128, kMaxPerLane = kScanMaxPerLane;

/// selective_scan.cu's scan_kernel for one token at a time (same operation order); a verify row's tokens one after
/// another, token j reading column j - 1's state and writing column j's.
template <class TS, class TY>
__global__ void __launch_bounds__(kScanThreads) scan_update_kernel(ScanInputs in, ScanParams p, TY* __restrict__ y,
                                                                   int64_t y_stride, DeviceDecodeRows rows,
                                                                   int lanes, bool prewait) {
  if (prewait && threadIdx.x % lanes == 0) {  // this lane group's channel: A, D, dt_bias, the row's state
    const int64_t c = static_cast<int64_t>(blockIdx.x) * (kScanThreads / lanes) + threadIdx.x / lanes;
    const int32_t blk = rows.src_block(blockIdx.y, 0);
    if (c < p.dim && blk != 0) {
      const int N = p.d_state;
      l2_line(p.A + c * N);
      l2_line(static_cast<const TS*>(p.ssm_states.data) + blk * p.ssm_states.block_stride + c * N);
      if (p.delta_bias) l2_line(p.delta_bias + c);
      if (p.D) l2_line(p.D + c);
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  const int s = blockIdx.y;
  if (rows.is_null(s)) return;
  const int N = p.d_state;
  const int group = threadIdx.x / lanes, lane = threadIdx.x % lanes;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * (kScanThreads / lanes) + group;
  const bool valid = c < p.dim;
  const int64_t cc = valid ? c : 0;
  TS* base = static_cast<TS*>(p.ssm_states.data) + cc * N;
  const int n = rows.num_tokens(s);
  const int64_t t0 = rows.first_token(s);
  for (int j = 0; j < n; ++j) {
    const int64_t t = t0 + j;
    float dt = in.delta.data[t * in.delta.stride + cc] + (p.delta_bias ? p.delta_bias[cc] : 0.0f);
    if (p.delta_softplus) dt = softplus(dt);
    const float u = in.u.data[t * in.u.stride + cc];
    const float* Bt = in.B.data + t * in.B.stride;
    const float* Ct = in.C.data + t * in.C.stride;
    const float acc = scan_update_channel(base + rows.src_block(s, j) * p.ssm_states.block_stride,
                                          base + rows.dst_block(s, j) * p.ssm_states.block_stride, p.A + cc * N, Bt,
                                          Ct, N, dt, u, lane, lanes, valid);
    if (valid && lane == 0) {
      float outv = acc + (p.D ? p.D[cc] : 0.0f) * u;
      if (in.z.data) outv *= silu(in.z.data[t * in.z.stride + cc]);
      store(y + t * y_stride + cc, outv);
    }
  }
}

/// rms_norm.cu's gated_rms_norm_kernel with the PDL wait: one block per (row, group).
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
                              cudaStream_t stream, float residual_scale, float x_scale, void* out_bf16,
                              int64_t out_bf16_stride, const NormAddend& add) {
  if (n < 0 || H < 1 || res_stride < H || out_stride < H || (x && x_stride < H) || n > 2147483647 ||
      (out_dtype != DType::F32 && out_dtype != DType::BF16) || (rows && write_residual) || !residual || !weight ||
      (out_bf16 && (out_dtype != DType::F32 || out_bf16_stride < H)) ||
      (add.rows && (!x || add.stride < H)))
    return cudaErrorInvalidValue;
  auto* o2 = static_cast<__nv_bfloat16*>(out_bf16);
  if (n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n));
  const auto al16 = [](const void* q, int64_t stride) {
    return reinterpret_cast<uintptr_t>(q) % 16 == 0 && stride % 4 == 0;
  };
  if (H % 4 == 0 && H <= 4LL * kNormVecWide * kNormThreads && al16(residual, res_stride) && al16(weight, 0) &&
      (!x || al16(x, x_stride))) {
    const bool wide = H > 4LL * kNormVec * kNormThreads;
    if (out_dtype == DType::BF16) {
      auto* o = static_cast<__nv_bfloat16*>(out);
      return wide ? launch_pdl(pdl, norm_rows_vec_kernel<__nv_bfloat16, kNormVecWide>, grid, dim3(kNormThreads), 0, stream,
                               x, x_stride, residual, res_stride, weight, eps, rows, H, write_residual, o, out_stride,
                               residual_scale, x_scale, o2, out_bf16_stride, add)
                  : launch_pdl(pdl, norm_rows_vec_kernel<__nv_bfloat16, kNormVec>, grid, dim3(kNormThreads), 0, stream, x,
                               x_stride, residual, res_stride, weight, eps, rows, H, write_residual, o, out_stride,
                               residual_scale, x_scale, o2, out_bf16_stride, add);
    }
    auto* o = static_cast<float*>(out);
    return wide ? launch_pdl(pdl, norm_rows_vec_kernel<float, kNormVecWide>, grid, dim3(kNormThreads), 0, stream, x,
                             x_stride, residual, res_stride, weight, eps, rows, H, write_residual, o, out_stride,
                             residual_scale, x_scale, o2, out_bf16_stride, add)
                : launch_pdl(pdl, norm_rows_vec_kernel<float, kNormVec>, grid, dim3(kNormThreads), 0, stream, x, x_stride,
                             residual, res_stride, weight, eps, rows, H, write_residual, o, out_stride, residual_scale,
                             x_scale, o2, out_bf16_stride, add);
  }
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, norm_rows_kernel<__nv_bfloat16>, grid, dim3(kNormThreads), 0, stream, x, x_stride,
                      residual, res_stride, weight, eps, rows, H, write_residual, static_cast<__nv_bfloat16*>(out),
                      out_stride, residual_scale, x_scale, o2, out_bf16_stride, add);
  return launch_pdl(pdl, norm_rows_kernel<float>, grid, dim3(kNormThreads), 0, stream, x, x_stride, residual,
                    res_stride, weight, eps, rows, H, write_residual, static_cast<float*>(out), out_stride, residual_scale,
                    x_scale, o2, out_bf16_stride, add);
}

cudaError_t conv1d_update_dual(const float* x, int64_t x_stride, float* out, int64_t out_stride, void* out_bf16,
                               int64_t out_bf16_stride, const ConvParams& p, DeviceDecodeRows rows, int batch,
                               bool pdl, cudaStream_t stream) {
  if (p.dim < 1 || p.width < 1 || p.width > kMaxWidth || !p.weight || (p.width > 1 && !p.conv_states.data) ||
      p.dim > 65535LL * kConvThreads || x_stride < p.dim || out_stride < p.dim || batch < 0 ||
      (out_bf16 && out_bf16_stride < p.dim) || batch > 2147483647)
    return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(batch), ceil_div(p.dim, kConvThreads));
  return visit_dtype(p.conv_states.dtype, [&](auto tag) {
    return launch_pdl(pdl, conv_update_dual_kernel<decltype(tag)>, grid, dim3(kConvThreads), 0, stream, x, x_stride,
                      out, out_stride, static_cast<__nv_bfloat16*>(out_bf16), out_bf16_stride, p, rows,
                      prewait_prefetch());
  });
}

cudaError_t selective_state_update_out(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                       int64_t y_stride, DeviceDecodeRows rows, int batch, bool pdl,
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
                        static_cast<__nv_bfloat16*>(y), y_stride, rows, lanes, prewait_prefetch());
    return launch_pdl(pdl, scan_update_kernel<TS, float>, grid, dim3(kScanThreads), 0, stream, in, p,
                      static_cast<float*>(y), y_stride, rows, lanes, prewait_prefetch());
  });
}

cudaError_t l2_prefetch(const void* p, size_t bytes, int mode, int blocks, cudaStream_t stream) {
  if (mode < 0 || mode > 2 || blocks < 1 || blocks > 65535 || (bytes > 0 && !p)) return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  l2_prefetch_kernel<<<blocks, 256, 0, stream>>>(static_cast<const char*>(p), bytes, mode);
  return cudaGetLastError();
}

cudaError_t gated_rms_norm_pdl(const float* y, int64_t y_stride, const float* z, int64_t z_stride, const float* weight,
                               float eps, int64_t T, int64_t D, int64_t group_size, bool norm_before_gate, void* out,
                               DType out_dtype, int64_t out_stride, bool pdl, cudaStream_t stream) {
  if (T < 0 || D < 1 || group_size < 1 || D % group_size != 0 || y_stride < D || z_stride < D || out_stride < D ||
      T > 2147483647 || D / group_size > 65535 || (out_dtype != DType::F32 && out_dtype != DType::BF16))
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(D / group_size));
  // rms_norm.cu's gated_rms_norm picks the same kernel under the same conditions: bit-identical results.
  if (const GatedNormVecPlan plan = gated_norm_vec_plan(y, y_stride, z, z_stride, weight, out, out_stride, out_dtype,
                                                        group_size);
      plan.vpt > 0)
    return dispatch_gated_norm_vec(plan, out_dtype, out, [&](auto kernel, auto* o) {
      const int G = gated_norm_vec_groups_per_block(plan, T, D / group_size);
      return launch_pdl(pdl, kernel, dim3(grid.x, grid.y / G), dim3(plan.threads, G), 0, stream, y, y_stride, z,
                        z_stride, weight, eps, group_size, norm_before_gate, o, out_stride);
    });
  int threads = 32;  // rms_norm.cu's threads_for(group_size / 4): the same block shape, so the same sums
  while (threads < 1024 && threads < group_size / 4) threads *= 2;
  if (out_dtype == DType::BF16)
    return launch_pdl(pdl, gated_norm_kernel<__nv_bfloat16>, grid, dim3(threads), 0, stream, y, y_stride, z, z_stride,
                      weight, eps, group_size, norm_before_gate, static_cast<__nv_bfloat16*>(out), out_stride);
  return launch_pdl(pdl, gated_norm_kernel<float>, grid, dim3(threads), 0, stream, y, y_stride, z, z_stride, weight,
                    eps, group_size, norm_before_gate, static_cast<float*>(out), out_stride);
}

}  // namespace ssmserve::cuda
