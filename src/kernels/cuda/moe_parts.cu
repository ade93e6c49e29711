// Owns sparse_moe's sort of (token, slot) pairs by expert and its weighted combine (see moe_parts.h): the one-block
// sort and the column-slice combine (decode-sized steps), and their prefill forms (KernelTuning::prefill_row_kernels:
// the multi-block sort, the per-token combine), each pair of forms with the same results.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_parts.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kMaxE = 1024, kMaxTopK = kMoeMaxTopK;

/// One block: counts per expert, offsets [E + 1], sorted[row] = pair index (t * top_k + slot), pair_row[pair].
__global__ void __launch_bounds__(1024) sort_kernel(const int32_t* __restrict__ ids, int64_t P, int E,
                                                    int32_t* __restrict__ offsets, int32_t* __restrict__ sorted,
                                                    int32_t* __restrict__ pair_row) {
  __shared__ int cnt[kMaxE], off[kMaxE + 1];
  pdl_wait();
  pdl_launch_dependents();
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    off[0] = 0;
    for (int e = 0; e < E; ++e) off[e + 1] = off[e] + cnt[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = off[e];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    const int e = ids[p];
    const int r = off[e] + atomicAdd(&cnt[e], 1);
    sorted[r] = static_cast<int32_t>(p);
    pair_row[p] = r;
  }
}

/// The shared expert's rows combine_kernel adds (MoeSharedAdd with x resolved), or y == nullptr for none.
struct CombineAdd {
  const float* y;
  int64_t ys;
  const float* gate;
  const float* x;
  int64_t xs;
};

/// Grid (T, ceil(hidden / 256)), 256 threads: thread c of column slice blockIdx.y writes out[t, c] = sum over
/// slots in ascending expert id of w * y[pair_row] (one column per thread: a decode step's one token used to loop
/// one block over the whole row, 8-12 us on the H200 at hidden 1536-2688; the sum per column is unchanged), then
/// adds the shared expert's row (MoeSharedAdd): + sy[t, c] (one rounding, as scaled_residual) or, gated, one FMA
/// with s = block_sigmoid_dot(x[t], gate) (each slice's block computes the same s; as sigmoid_gated_add).
__global__ void __launch_bounds__(256) combine_kernel(const float* __restrict__ y, int64_t hidden,
                                                     const int32_t* __restrict__ ids, const float* __restrict__ wts,
                                                     const int32_t* __restrict__ pair_row, int top_k,
                                                     float* __restrict__ out, int64_t os, CombineAdd add) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  int order[kMaxTopK];
  for (int k = 0; k < top_k; ++k) order[k] = k;
  for (int a = 1; a < top_k; ++a)  // insertion sort by expert id (top_k <= 16)
    for (int b = a; b > 0 && ids[t * top_k + order[b]] < ids[t * top_k + order[b - 1]]; --b) {
      const int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  const float s = add.y && add.gate ? block_sigmoid_dot(add.x + t * add.xs, add.gate, hidden, scratch) : 1.0f;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  float o = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    const int64_t p = t * top_k + order[k];
    o += y[static_cast<int64_t>(pair_row[p]) * hidden + c] * wts[p];
  }
  if (add.y) {
    const float sy = add.y[t * add.ys + c];
    o = add.gate ? __fmaf_rn(s, sy, o) : __fadd_rn(o, sy);
  }
  out[t * os + c] = o;
}

/// combine_kernel's grid for T tokens of `hidden` columns.
dim3 combine_grid(int64_t T, int64_t hidden) { return dim3(static_cast<unsigned>(T), ceil_div(hidden, 256)); }

// ---- Multi-block sort (KernelTuning::prefill_row_kernels; moe_sort_pairs) --------------------------------------
// The one-block sort_kernel above walks all P pairs twice with 1024 threads on one SM (0.33 ms at P = 262144 on the
// H200, a 32k-token Qwen3.5-35B-A3B prefill). Here blocks of 1024 threads each own a chunk of kSortChunk pairs: the
// first kernel writes each chunk's per-expert counts [blocks, E]; the second gives each block its experts' bases
// (offsets[e] + the counts of the chunks before it; block 0 also writes offsets) and scatters its chunk. The order
// within an expert stays unspecified, as before; offsets are the same.

/// Smallest P taking the multi-block sort, and pairs per block there (2 per thread).
constexpr int64_t kMoeSortMultiMinPairs = 8192;
constexpr int64_t kSortChunk = 2048;

int sort_blocks(int64_t P) { return static_cast<int>((P + kSortChunk - 1) / kSortChunk); }

/// Grid (sort_blocks(P)), 1024 threads: counts[b, e] = pairs p in [b * kSortChunk, +kSortChunk) with ids[p] == e.
__global__ void __launch_bounds__(1024) sort_count_kernel(const int32_t* __restrict__ ids, int64_t P, int E,
                                                          int32_t* __restrict__ counts) {
  __shared__ int cnt[kMaxE];
  pdl_wait();
  pdl_launch_dependents();
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kSortChunk, p1 = min(P, p0 + kSortChunk);
  for (int64_t p = p0 + threadIdx.x; p < p1; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[static_cast<int64_t>(blockIdx.x) * E + e] = cnt[e];
}

/// Grid (sort_blocks(P)), 1024 threads (E <= 1024: thread e owns expert e): the exclusive scan of the experts'
/// totals (offsets; block 0 writes them), this block's base per expert, then its chunk's scatter.
__global__ void __launch_bounds__(1024) sort_scatter_kernel(const int32_t* __restrict__ ids, int64_t P, int E,
                                                            const int32_t* __restrict__ counts,
                                                            int32_t* __restrict__ offsets, int32_t* __restrict__ sorted,
                                                            int32_t* __restrict__ pair_row) {
  __shared__ int base[kMaxE];
  __shared__ int warp_tot[32];
  pdl_wait();
  pdl_launch_dependents();
  const int e = threadIdx.x, lane = e & 31, warp = e >> 5, nb = gridDim.x;
  int before = 0, total = 0;
  if (e < E)
    for (int b = 0; b < nb; ++b) {
      const int c = counts[static_cast<int64_t>(b) * E + e];
      total += c;
      before += b < static_cast<int>(blockIdx.x) ? c : 0;
    }
  // Inclusive scan of total over e: within the warp, then over the warps' sums.
  int inc = total;
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  if (lane == 31) warp_tot[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = lane < static_cast<int>(blockDim.x >> 5) ? warp_tot[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    warp_tot[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int excl = inc - total + (warp > 0 ? warp_tot[warp - 1] : 0);  // offsets[e]
  if (e < E) {
    base[e] = excl + before;
    if (blockIdx.x == 0) {
      offsets[e] = excl;
      if (e == E - 1) offsets[E] = excl + total;
    }
  }
  __syncthreads();
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kSortChunk, p1 = min(P, p0 + kSortChunk);
  for (int64_t p = p0 + threadIdx.x; p < p1; p += blockDim.x) {
    const int r = atomicAdd(&base[ids[p]], 1);
    sorted[r] = static_cast<int32_t>(p);
    pair_row[p] = r;
  }
}

// ---- Per-token combine (KernelTuning::prefill_row_kernels; moe_combine) ------------------------------------------
// combine_kernel gives each thread one column: every thread re-runs the insertion sort of the token's expert ids
// (through local memory), then walks the top_k rows with one dependent 4-byte load each, and each column slice's
// block recomputes the shared gate's dot; at a 32k-token prefill it moved about 1 TB/s. Here one block per token
// ranks the slots once (thread k < top_k: its slot's position in ascending expert id, ties by slot: the insertion
// sort's stable order) into shared memory, computes the gate's s once (block_sigmoid_dot with the same 256 threads:
// the same bits), and each thread sums 8 consecutive columns with all rows' 16-byte loads of a group of 8 slots in
// flight. Per column the arithmetic is combine_kernel's: o += y * w in ascending expert order, then the add.

/// Smallest T taking the per-token combine (below it the column slices spread a step over more SMs).
constexpr int64_t kCombinePerTokenMinT = 64;

/// Grid (T), 256 threads; hidden a multiple of 8; out (os), add.y (ys) 16-byte aligned rows (moe_combine checks).
__global__ void __launch_bounds__(256) combine_token_kernel(const float* __restrict__ y, int64_t hidden,
                                                           const int32_t* __restrict__ ids,
                                                           const float* __restrict__ wts,
                                                           const int32_t* __restrict__ pair_row, int top_k,
                                                           float* __restrict__ out, int64_t os, CombineAdd add) {
  __shared__ float scratch[32];
  __shared__ int64_t row_s[kMaxTopK];
  __shared__ float w_s[kMaxTopK];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  if (static_cast<int>(threadIdx.x) < top_k) {
    const int k = threadIdx.x;
    const int ek = ids[t * top_k + k];
    int rank = 0;
    for (int j = 0; j < top_k; ++j) {
      const int ej = ids[t * top_k + j];
      rank += ej < ek || (ej == ek && j < k);
    }
    row_s[rank] = static_cast<int64_t>(pair_row[t * top_k + k]) * hidden;
    w_s[rank] = wts[t * top_k + k];
  }
  const float s = add.y && add.gate ? block_sigmoid_dot(add.x + t * add.xs, add.gate, hidden, scratch) : 1.0f;
  __syncthreads();  // row_s / w_s
  for (int64_t c = threadIdx.x * 8; c < hidden; c += 256 * 8) {
    float o[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < top_k; k0 += 8) {
      float4 va[8], vb[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k0 + j < top_k) {
          const float* yr = y + row_s[k0 + j] + c;
          va[j] = __ldcs(reinterpret_cast<const float4*>(yr));
          vb[j] = __ldcs(reinterpret_cast<const float4*>(yr + 4));
        }
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k0 + j < top_k) {
          const float w = w_s[k0 + j];  // combine_kernel's expression per column: o += y * w
          o[0] += va[j].x * w, o[1] += va[j].y * w, o[2] += va[j].z * w, o[3] += va[j].w * w;
          o[4] += vb[j].x * w, o[5] += vb[j].y * w, o[6] += vb[j].z * w, o[7] += vb[j].w * w;
        }
    }
    if (add.y) {
      const float4 a = *reinterpret_cast<const float4*>(add.y + t * add.ys + c);
      const float4 b = *reinterpret_cast<const float4*>(add.y + t * add.ys + c + 4);
      const float sy[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = add.gate ? __fmaf_rn(s, sy[i], o[i]) : __fadd_rn(o[i], sy[i]);
    }
    float4* dst = reinterpret_cast<float4*>(out + t * os + c);
    dst[0] = make_float4(o[0], o[1], o[2], o[3]);
    dst[1] = make_float4(o[4], o[5], o[6], o[7]);
  }
}

}  // namespace

bool moe_combine_per_token(int64_t T) { return kernel_tuning().prefill_row_kernels && T >= kCombinePerTokenMinT; }

namespace detail {

size_t moe_sort_counts_bytes(int64_t P, int E) {
  return P >= kMoeSortMultiMinPairs ? static_cast<size_t>(sort_blocks(P)) * E * 4 : 0;
}

cudaError_t moe_sort_pairs(const int32_t* ids, int64_t P, int E, int32_t* offsets, int32_t* sorted, int32_t* pair_row,
                           int32_t* counts, cudaStream_t stream, bool pdl) {
  if (P < 0 || P > 2147483647 || E < 1 || E > kMaxE) return cudaErrorInvalidValue;
  if (!kernel_tuning().prefill_row_kernels || P < kMoeSortMultiMinPairs)
    return launch_pdl(pdl, sort_kernel, dim3(1), dim3(1024), 0, stream, ids, P, E, offsets, sorted, pair_row);
  if (!counts) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(sort_blocks(P)));
  if (const cudaError_t e = launch_pdl(pdl, sort_count_kernel, grid, dim3(1024), 0, stream, ids, P, E, counts);
      e != cudaSuccess)
    return e;
  return launch_pdl(pdl, sort_scatter_kernel, grid, dim3(1024), 0, stream, ids, P, E,
                    static_cast<const int32_t*>(counts), offsets, sorted, pair_row);
}

cudaError_t moe_combine(const float* y, int64_t hidden, const int32_t* ids, const float* wts, const int32_t* pair_row,
                        int64_t T, int top_k, float* out, int64_t os, const MoeSharedAdd* shared, cudaStream_t stream,
                        bool pdl) {
  if (T < 0 || T > 2147483647 || hidden <= 0 || hidden % 8 != 0 || top_k < 1 || top_k > kMaxTopK || os < hidden ||
      (shared && shared->gate && !shared->x))
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const CombineAdd add = shared ? CombineAdd{shared->y, shared->y_stride, shared->gate, shared->x, shared->x_stride}
                                : CombineAdd{nullptr, 0, nullptr, nullptr, 0};
  const auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = os % 4 == 0 && al16(out) && al16(y) && (!add.y || (add.ys % 4 == 0 && al16(add.y)));
  if (moe_combine_per_token(T) && vec)
    return launch_pdl(pdl, combine_token_kernel, dim3(static_cast<unsigned>(T)), dim3(256), 0, stream, y, hidden, ids,
                      wts, pair_row, top_k, out, os, add);
  return launch_pdl(pdl, combine_kernel, combine_grid(T, hidden), dim3(256), 0, stream, y, hidden, ids, wts, pair_row,
                    top_k, out, os, add);
}

}  // namespace detail

}  // namespace ssmserve::cuda
