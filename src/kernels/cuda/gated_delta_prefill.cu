// Owns the gated delta rule's varlen chunked prefill on the GPU (math and block layout in kernels/cuda/gated_delta.h).
//
// Napkin math per chunk of 64 tokens, per value head and 64-column tile (Dk = 128): the tile products K S, Q S,
// K K^T, Q K^T (64 x 64 x 128 each), P V~ (64 x 64 x 64) and K^T V~ (128 x 64 x 64): 2.9 M MACs (x3 for 3xTF32);
// K K^T and Q K^T are recomputed by each of the Dv / 64 column tiles. Inputs are read once per tile (about
// 64 x (2 Dk + 64 + 2) floats per chunk), so the kernel is bound by the tensor cores and by the sequential walk
// over a sequence's chunks (a 32k-token sequence is 512 chunks in one block per (head, tile)).
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/gated_delta_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace ssmserve::cuda {
namespace {

using detail::block_gemm;
using detail::kTileSmemFloats;
using detail::kTileThreads;
using detail::TileAcc;

constexpr int kChunk = detail::kGdChunk;
constexpr int kCols = 64;    // value columns per block
constexpr int kLd = kCols + 8;  // row stride of the 64-column shared arrays (the TF32 tile's B stride)
constexpr int kMaxDk = 128;     // the largest key head dim (shared memory: ~173 KiB at 128)

/// Shared-memory layout (floats, then the decay sums in double), for Dk key dims.
struct Smem {
  int dk;
  __host__ __device__ int k_off() const { return 0; }                      // sK [64][dk]
  __host__ __device__ int q_off() const { return kChunk * dk; }            // sQ [64][dk]
  __host__ __device__ int s_off() const { return 2 * kChunk * dk; }        // sS [dk][kLd] the state tile
  __host__ __device__ int a_off() const { return s_off() + dk * kLd; }     // sA [64][kLd]
  __host__ __device__ int p_off() const { return a_off() + kChunk * kLd; } // sP [64][kLd]
  __host__ __device__ int x_off() const { return p_off() + kChunk * kLd; } // sX [64][kLd]: X, then V~
  __host__ __device__ int t_off() const { return x_off() + kChunk * kLd; } // the tile product's staging
  __host__ __device__ int v_off() const { return t_off() + kTileSmemFloats; }  // ec, beta, e^{c_m - c} [3][64]
  __host__ __device__ int floats() const { return v_off() + 3 * kChunk; }
  __host__ __device__ size_t bytes() const { return static_cast<size_t>(floats()) * 4 + kChunk * sizeof(double); }
};

template <class TS, bool kExact>
__global__ void __launch_bounds__(kTileThreads, 1)
    prefill_kernel(GatedDeltaInputs in, GatedDeltaParams p, float* __restrict__ out, int64_t out_stride,
                   const int32_t* __restrict__ query_start_loc, const int32_t* __restrict__ num_computed,
                   const int32_t* __restrict__ state_indices) {
  extern __shared__ __align__(16) float smem[];
  const int s = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kCols, tid = threadIdx.x;
  const int Dk = p.head_k_dim, Dv = p.head_v_dim, C = p.chunk_size;
  const int kh = h / (p.num_v_heads / p.num_k_heads), ncols = min(kCols, Dv - col0);
  const Smem L{Dk};
  float *sK = smem + L.k_off(), *sQ = smem + L.q_off(), *sS = smem + L.s_off(), *sA = smem + L.a_off();
  float *sP = smem + L.p_off(), *sX = smem + L.x_off(), *sT = smem + L.t_off();
  float *sEc = smem + L.v_off(), *sBeta = sEc + kChunk, *sDm = sBeta + kChunk;
  double* sC = reinterpret_cast<double*>(smem + L.floats());
  const int64_t tok0 = query_start_loc[s];
  const int len = query_start_loc[s + 1] - static_cast<int>(tok0);
  const int32_t idx = state_indices[s];
  const int64_t head_out = static_cast<int64_t>(h) * Dv + col0;
  if (idx == 0) {  // null row: zero outputs, no state I/O
    for (int64_t e = tid; e < static_cast<int64_t>(len) * ncols; e += kTileThreads)
      out[(tok0 + e / ncols) * out_stride + head_out + e % ncols] = 0.0f;
    return;
  }
  const int nc = num_computed[s];
  TS* S = static_cast<TS*>(p.states.data) + idx * p.states.block_stride + static_cast<int64_t>(h) * Dk * Dv + col0;
  // 1. The state tile [Dk, ncols] (zeros when nothing is computed yet: the block is not read).
  for (int e = tid; e < Dk * kCols; e += kTileThreads) {
    const int d = e / kCols, c = e % kCols;
    sS[d * kLd + c] = nc > 0 && c < ncols ? detail::load(S + static_cast<int64_t>(d) * Dv + c) : 0.0f;
  }
  const float* qh = in.q + static_cast<int64_t>(kh) * Dk;
  const float* kh_ptr = in.k + static_cast<int64_t>(kh) * Dk;
  for (int t0 = 0; t0 < len;) {
    const int m = detail::gd_chunk_len(nc, t0, len, C);  // ends on a multiple of C in sequence positions
    const int64_t row0 = tok0 + t0;
    __syncthreads();  // the previous chunk's readers of sK, sQ, sX, the decays and its writes of sS are done
    // 2. The chunk's keys, queries, decays and learning rates.
    for (int e = tid; e < m * Dk; e += kTileThreads) {
      const int i = e / Dk, d = e % Dk;
      sK[i * Dk + d] = kh_ptr[(row0 + i) * in.k_stride + d];
      sQ[i * Dk + d] = qh[(row0 + i) * in.q_stride + d];
    }
    if (tid < 32) detail::gd_chunk_decays(in, row0, h, m, sC, sEc, sBeta, sDm);
    __syncthreads();
    const auto dec = [&](int i, int j) { return static_cast<float>(exp(sC[i] - sC[j])); };
    // 3. O = diag(e^c) Q S (kept in registers until P V~ is added); X = diag(beta) V - diag(beta e^c) K S.
    TileAcc acc_o, acc;
    acc_o.zero();
    block_gemm<kExact, false, true>(
        acc_o, Dk, [&](int i, int d) { return i < m ? sEc[i] * sQ[i * Dk + d] : 0.0f; },
        [&](int d, int c) { return sS[d * kLd + c]; }, sT);
    acc.zero();
    block_gemm<kExact, false, true>(
        acc, Dk, [&](int i, int d) { return i < m ? sBeta[i] * sEc[i] * sK[i * Dk + d] : 0.0f; },
        [&](int d, int c) { return sS[d * kLd + c]; }, sT);
    const float* vh = in.v + static_cast<int64_t>(h) * Dv + col0;
    acc.for_each([&](int i, int c, float x) {
      sX[i * kLd + c] = i < m && c < ncols ? sBeta[i] * vh[(row0 + i) * in.v_stride + c] - x : 0.0f;
    });
    // 4. A (strictly lower) and P (lower with the diagonal) from K K^T and Q K^T.
    acc.zero();
    block_gemm<kExact, false, false>(
        acc, Dk, [&](int i, int d) { return sK[i * Dk + d]; }, [&](int d, int j) { return sK[j * Dk + d]; }, sT);
    acc.for_each([&](int i, int j, float x) {
      sA[i * kLd + j] = j < i && i < m ? sBeta[i] * dec(i, j) * x : 0.0f;
    });
    acc.zero();
    block_gemm<kExact, false, false>(
        acc, Dk, [&](int i, int d) { return sQ[i * Dk + d]; }, [&](int d, int j) { return sK[j * Dk + d]; }, sT);
    acc.for_each([&](int i, int j, float x) { sP[i * kLd + j] = j <= i && i < m ? dec(i, j) * x : 0.0f; });
    __syncthreads();
    // 5. (I + A) V~ = X by forward substitution: warp w owns columns 8w .. 8w+7, four lanes per column.
    detail::gd_forward_substitute(sA, sX, kLd, m);
    __syncthreads();
    // 6. O += P V~, stored.
    block_gemm<kExact, false, true>(
        acc_o, m, [&](int i, int j) { return sP[i * kLd + j]; }, [&](int j, int c) { return sX[j * kLd + c]; }, sT);
    acc_o.for_each([&](int i, int c, float x) {
      if (i < m && c < ncols) out[(row0 + i) * out_stride + head_out + c] = x;
    });
    // 7. S <- e^{c_m} S + K^T diag(e^{c_m - c}) V~, in 64-row parts of Dk (only sK, sX, sDm are read meanwhile).
    const float ecm = sEc[m - 1];
    for (int d0 = 0; d0 < Dk; d0 += kChunk) {
      acc.zero();
      block_gemm<kExact, true, true>(
          acc, m, [&](int d, int j) { return d0 + d < Dk ? sDm[j] * sK[j * Dk + d0 + d] : 0.0f; },
          [&](int j, int c) { return sX[j * kLd + c]; }, sT);
      acc.for_each([&](int d, int c, float x) {
        if (d0 + d < Dk) sS[(d0 + d) * kLd + c] = fmaf(ecm, sS[(d0 + d) * kLd + c], x);
      });
    }
    t0 += m;
  }
  __syncthreads();
  // 8. The final state tile back to the pool.
  for (int e = tid; e < Dk * ncols; e += kTileThreads) {
    const int d = e / ncols, c = e % ncols;
    detail::store(S + static_cast<int64_t>(d) * Dv + c, sS[d * kLd + c]);
  }
}

template <class TS, bool kExact>
cudaError_t launch(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                   const int32_t* qsl, const int32_t* nc, const int32_t* idx, int num_seqs, cudaStream_t stream) {
  const Smem L{p.head_k_dim};
  // The opt-in is per device and kernel, once: raise it to the largest layout (Dk = 128) so every Dk fits.
  static std::atomic<uint64_t> opted_in{0};
  auto* kernel = prefill_kernel<TS, kExact>;
  if (const cudaError_t e = detail::opt_in_dynamic_smem(kernel, Smem{kMaxDk}.bytes(), opted_in); e != cudaSuccess)
    return e;
  const dim3 grid(num_seqs, p.num_v_heads, detail::ceil_div(p.head_v_dim, kCols));
  kernel<<<grid, kTileThreads, L.bytes(), stream>>>(in, p, out, out_stride, qsl, nc, idx);
  return detail::launch_status();
}

}  // namespace

cudaError_t gated_delta_prefill(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                                const int32_t* query_start_loc, const int32_t* num_computed,
                                const int32_t* state_indices, int num_seqs, cudaStream_t stream,
                                GatedDeltaPrecision precision) {
  const int64_t qk = static_cast<int64_t>(p.num_k_heads) * p.head_k_dim;
  const int64_t vw = static_cast<int64_t>(p.num_v_heads) * p.head_v_dim;
  if (!gated_delta_prefill_supported(p) || num_seqs < 0 || in.q_stride < qk || in.k_stride < qk ||
      in.v_stride < vw || in.g_stride < p.num_v_heads || in.beta_stride < p.num_v_heads || out_stride < vw ||
      p.num_v_heads > 65535)
    return cudaErrorInvalidValue;
  if (num_seqs == 0) return cudaSuccess;
  return detail::visit_dtype(p.states.dtype, [&](auto tag) -> cudaError_t {
    using TS = decltype(tag);
    return precision == GatedDeltaPrecision::kTf32
               ? launch<TS, false>(in, p, out, out_stride, query_start_loc, num_computed, state_indices, num_seqs,
                                   stream)
               : launch<TS, true>(in, p, out, out_stride, query_start_loc, num_computed, state_indices, num_seqs,
                                  stream);
  });
}

}  // namespace ssmserve::cuda
