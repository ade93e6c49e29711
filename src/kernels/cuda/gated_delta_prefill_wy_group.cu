// Owns pass 1 of the two-pass gated delta rule prefill per (chunk, key head) (wy::launch_wy_grouped, chosen by
// KernelTuning::gdn_wy_grouped; the per-value-head pass and the walks: gated_delta_prefill_wy.cu). The value heads
// that share a key head (r = Hv / Hk: 2 on Qwen3.5 / 3.6) share its Gram products: K K^T and Q K^T (0.5 M MACs each
// at Dk = 128) are computed once per key head and kept in registers; per value head only its decays, A, P, the solve
// T = (I + A)^{-1} and the two T products W = T diag(beta e^c) K, U = T diag(beta) V run. The warps take their
// mma.sync fragments straight from shared memory (wy::sm_gemm: no per-slice staging through registers and two
// barriers per 32-deep slice, as detail::block_gemm does), the keys and queries copied in once with cp.async.
//
// The arithmetic is the per-value-head pass's operand for operand (the same fp32 operands, TF32 roundings, fragment
// layout and k order; decays in double as there), so the slots hold the same values (T products summed over k < m
// rounded up to 8 instead of 32: the extra products there are exact zeros). Test:
// CudaGatedDelta.TwoPassGroupedWyEqualsPerHead.
//
// Napkin math (H200, Dk = Dv = 128, r = 2, 32k tokens x 16 key heads = 8192 blocks): per block 2 x 0.5 M MACs of Gram
// products + r x 1 M of T products = 3 M MACs (the per-value-head pass: 2 x 2 M), ~3 k mma.sync m16n8k8 in TF32; the
// per-value-head pass ran 1.95 G instructions for 16 k blocks (4.2 ms per 8k-token step, ncu, session 31), mostly
// the staging loaders' index arithmetic, not the 2 k mma per block.
#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gated_delta_wy.cuh"

namespace ssmserve::cuda::wy {
namespace {

constexpr int kLdT = kGdChunk + 4;  // sA, sT row stride: A-operand fragment loads hit banks 4g + t

/// Shared-memory layout (floats) of wy_group_kernel for Dk = dk, Dv = dv: sK [64][dk + 4]; sQ [64][dk + 4], reused
/// as sB [64][max(dk, dv) + 8] (the B operands diag(beta e^c) K, then diag(beta) V: banks 8t + g); sA, sT [64][68];
/// e^c, beta, e^{c_m - c} [64] each; the decay sums [64] doubles.
struct GroupLayout {
  int dk, dv;
  __host__ __device__ int ldk() const { return dk + 4; }
  __host__ __device__ int ldb() const { return (dk > dv ? dk : dv) + 8; }
  __host__ __device__ int q() const { return kGdChunk * ldk(); }
  __host__ __device__ int a() const { return q() + kGdChunk * ldb(); }
  __host__ __device__ int t() const { return a() + kGdChunk * kLdT; }
  __host__ __device__ int f() const { return t() + kGdChunk * kLdT; }
  __host__ __device__ int c() const { return f() + 3 * kGdChunk; }  // a multiple of 4 floats: 16-byte aligned
  __host__ __device__ size_t bytes() const { return static_cast<size_t>(c()) * 4 + kGdChunk * sizeof(double); }
};

/// dst [64][n] = sT [64][64] sB [64][n] over k < kend (a multiple of 8), stored. Warps: 2 x 4 of 32 x 16 columns,
/// stepping 64 columns (n a multiple of 16). Contains no barrier.
template <bool kExact>
__device__ __forceinline__ void t_product(float* dst, int n, const float* sT, const float* sB, int ldb, int kend) {
  const int warp = threadIdx.x >> 5, wm = (warp & 1) * 32;
  for (int n0 = (warp >> 1) * 16; n0 < n; n0 += 64) {
    float acc[2][2][4] = {};
    sm_gemm<kExact, false, 2>(acc, sT, kLdT, wm, sB, ldb, n0, kend);
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = wm + 16 * i + g + 8 * h, col = n0 + 8 * j + 2 * t;
          *reinterpret_cast<float2*>(dst + row * n + col) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
  }
}

/// T = (I + A)^{-1} into sT [64][ldt] for the strictly lower sA [64][lda] (rows >= m zero; T's rows >= m identity
/// rows): detail::gd_forward_substitute's arithmetic in the same order (column c = warp 8 + lane / 4, its rows
/// j = part + 4 k summed ascending by the quarter-warp lane part = lane % 4, then the xor-1 and xor-2 shuffles), so the
/// same bits, but with each lane's 16 rows of its column in registers instead of shared memory (one shared load per
/// product instead of two, no per-row store and warp barrier; the loops unrolled). Contains no block barrier.
__device__ __forceinline__ void forward_substitute_regs(const float* sA, int lda, float* sT, int ldt, int m) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = warp * 8 + (lane >> 2), part = lane & 3;
  static_assert(kGdChunk == 64, "16 rows per lane");
  float x[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) x[k] = part + 4 * k == c ? 1.0f : 0.0f;
#pragma unroll
  for (int i = 1; i < kGdChunk; ++i) {
    if (i >= m) break;  // uniform over the block
    const float* a = sA + i * lda + part;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < (i + 3) / 4; ++k)
      if (part + 4 * k < i) sum = fmaf(a[4 * k], x[k], sum);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (part == (i & 3)) x[i >> 2] -= sum;
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) sT[(part + 4 * k) * ldt + c] = x[k];
}

/// This thread's part of a row-wise fill of [64][n] (n a multiple of 4) by 4-column pieces: column col, rows row,
/// row + rows, ... (threads past rows x n / 4 idle), so the loops carry no division.
struct RowSlots {
  int col, row, rows;
  bool on;
  __device__ explicit RowSlots(int n) {
    const int n4 = n >> 2;
    rows = kTileThreads / n4;
    on = static_cast<int>(threadIdx.x) < rows * n4;
    row = threadIdx.x / n4, col = 4 * (threadIdx.x % n4);
  }
};

/// Per (chunk q, key head): grid (chunks, num_k_heads), kTileThreads threads, GroupLayout{Dk, Dv}.bytes() of dynamic
/// shared memory. Writes the slots of value heads kh r .. kh r + r - 1 (W, U, P, E as the per-value-head pass).
template <bool kExact>
__global__ void __launch_bounds__(kTileThreads, 2)
    wy_group_kernel(GatedDeltaInputs in, GatedDeltaParams p, const int32_t* __restrict__ qsl,
                    const int32_t* __restrict__ num_computed, int num_seqs, float* __restrict__ ws, bool qk_vec,
                    bool v_vec) {
  extern __shared__ __align__(16) float smem[];
  const int q = blockIdx.x, kh = blockIdx.y, tid = threadIdx.x;
  const int32_t* off = reinterpret_cast<const int32_t*>(ws);
  if (q >= off[num_seqs]) return;
  // 1. Which sequence and chunk.
  const WyChunk ch(off, num_seqs, q, qsl, num_computed, p.chunk_size);
  const int m = ch.m, m8 = (m + 7) & ~7, Dk = p.head_k_dim, Dv = p.head_v_dim;
  const int64_t row0 = ch.row0;
  const int r = p.num_v_heads / p.num_k_heads;
  const GroupLayout lay{Dk, Dv};
  const int ldk = lay.ldk(), ldb = lay.ldb();
  float *sK = smem, *sQ = smem + lay.q(), *sB = sQ, *sA = smem + lay.a(), *sT = smem + lay.t();
  float *sEc = smem + lay.f(), *sBeta = sEc + kGdChunk, *sDm = sBeta + kGdChunk;
  double* sC = reinterpret_cast<double*>(smem + lay.c());
  // 2. Keys and queries (rows >= m zero) by cp.async; the value rows of the key head's value heads into the L2.
  for (int i = tid; i < r * m; i += kTileThreads)
    detail::gd_prefetch_l2(in.v + (row0 + i % m) * in.v_stride + static_cast<int64_t>(kh * r + i / m) * Dv, Dv, 0, 1);
  sm_copy_rows(sK, ldk, in.k + static_cast<int64_t>(kh) * Dk + row0 * in.k_stride, in.k_stride, Dk, m, qk_vec);
  sm_copy_rows(sQ, ldk, in.q + static_cast<int64_t>(kh) * Dk + row0 * in.q_stride, in.q_stride, Dk, m, qk_vec);
  detail::cp_async_commit();
  detail::cp_async_wait<0>();
  __syncthreads();
  const RowSlots kj(Dk), vj(Dv);
  // 3. G = K K^T and H = Q K^T (64 x 64), kept in registers: warp tiles 32 x 16 (rows (w & 1) 32, columns (w >> 1)
  // 16, detail::TileAcc's), K^T's fragments shared by both.
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 16;
  float accG[2][2][4] = {}, accH[2][2][4] = {};
#pragma unroll 2
  for (int kk = 0; kk < Dk; kk += 8) {
    uint32_t gh[2][4], gl[2][4], qh[2][4], ql[2][4], bh[2][2], bl[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      sm_frag_a<kExact, false>(sK, ldk, wm + 16 * i, kk, gh[i], gl[i]);
      sm_frag_a<kExact, false>(sQ, ldk, wm + 16 * i, kk, qh[i], ql[i]);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) sm_frag_bt<kExact>(sK, ldk, wn + 8 * j, kk, bh[j], bl[j]);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        sm_mma<kExact>(accG[i][j], gh[i], gl[i], bh[j], bl[j]);
        sm_mma<kExact>(accH[i][j], qh[i], ql[i], bh[j], bl[j]);
      }
  }
  // 4. Per value head of this key head.
  for (int hv = 0; hv < r; ++hv) {
    const int h = kh * r + hv;
    float* W = ws + offsets_floats(num_seqs) + (static_cast<int64_t>(q) * p.num_v_heads + h) * slot_floats(Dk, Dv);
    float *U = W + kGdChunk * Dk, *P = U + kGdChunk * Dv, *E = P + kGdChunk * kGdChunk;
    __syncthreads();  // the Gram products' reads of sQ, the previous head's of sB, sT and the factors are done
    if (tid < 32) detail::gd_chunk_decays(in, row0, h, m, sC, sEc, sBeta, sDm, /*serial=*/false);
    __syncthreads();
    if (tid < kGdChunk) E[tid] = sEc[tid], E[kGdChunk + tid] = sDm[tid];
    // A = strictly lower (beta_i e^{c_i - c_j} G_ij) and P = lower (e^{c_i - c_j} H_ij), rows < m.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int row = wm + 16 * i + g + 8 * hh, col = wn + 8 * j + 2 * t;
          float pv[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int cj = col + c;
            const bool on = row < m && cj <= row;
            const float d = on ? static_cast<float>(exp(sC[row] - sC[cj])) : 0.0f;
            sA[row * kLdT + cj] = on && cj < row ? sBeta[row] * d * accG[i][j][2 * hh + c] : 0.0f;
            pv[c] = on ? d * accH[i][j][2 * hh + c] : 0.0f;
          }
          *reinterpret_cast<float2*>(P + row * kGdChunk + col) = make_float2(pv[0], pv[1]);
        }
    __syncthreads();
    // T = (I + A)^{-1} (rows >= m identity rows) and, meanwhile, sB = diag(beta e^c) K (rows >= m zero).
    forward_substitute_regs(sA, kLdT, sT, kLdT, m);
    if (kj.on) {
      for (int j = kj.row; j < kGdChunk; j += kj.rows) {
        const float f = sBeta[j] * sEc[j];
        const float4 x = *reinterpret_cast<const float4*>(sK + j * ldk + kj.col);
        *reinterpret_cast<float4*>(sB + j * ldb + kj.col) = make_float4(f * x.x, f * x.y, f * x.z, f * x.w);
      }
    }
    __syncthreads();
    t_product<kExact>(W, Dk, sT, sB, ldb, m8);  // W = T diag(beta e^c) K
    __syncthreads();
    const float* vp = in.v + static_cast<int64_t>(h) * Dv + row0 * in.v_stride;
    if (vj.on) {
      for (int j = vj.row; j < kGdChunk; j += vj.rows) {
        const float b = sBeta[j];
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (j < m) {
          if (v_vec) {
            x = __ldg(reinterpret_cast<const float4*>(vp + j * in.v_stride + vj.col));
          } else {
            const float* v = vp + j * in.v_stride + vj.col;
            x = make_float4(v[0], v[1], v[2], v[3]);
          }
        }
        *reinterpret_cast<float4*>(sB + j * ldb + vj.col) =
            j < m ? make_float4(b * x.x, b * x.y, b * x.z, b * x.w) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    __syncthreads();
    t_product<kExact>(U, Dv, sT, sB, ldb, m8);  // U = T diag(beta) V
  }
}

}  // namespace

cudaError_t launch_wy_grouped(bool exact, const GatedDeltaInputs& in, const GatedDeltaParams& p, const int32_t* qsl,
                              const int32_t* num_computed, int num_seqs, int64_t chunks, float* ws, bool qk_vec,
                              cudaStream_t stream) {
  if (!wy_grouped_supported(p) || chunks <= 0 || chunks >= (int64_t{1} << 31) || p.num_k_heads > 65535)
    return cudaErrorInvalidValue;
  static std::atomic<uint64_t> opted[2];
  // v rows 16-byte aligned: float4 loads of them (else 4-byte ones).
  const bool v_vec = reinterpret_cast<uintptr_t>(in.v) % 16 == 0 && in.v_stride % 4 == 0;
  auto* kernel = exact ? wy_group_kernel<true> : wy_group_kernel<false>;
  if (cudaError_t e = detail::opt_in_dynamic_smem(kernel, GroupLayout{128, 128}.bytes(), opted[exact ? 1 : 0]);
      e != cudaSuccess)
    return e;
  kernel<<<dim3(static_cast<unsigned>(chunks), p.num_k_heads), kTileThreads,
           GroupLayout{p.head_k_dim, p.head_v_dim}.bytes(), stream>>>(in, p, qsl, num_computed, num_seqs, ws, qk_vec, v_vec);
  return detail::launch_status();
}

}  // namespace ssmserve::cuda::wy
