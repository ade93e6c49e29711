// Owns the bf16 fast path of the GPU lightning prefill (see lightning.h, lightning_prefill_bf16): bf16 q / k / v
// straight from the projection, tensor cores with fp32 accumulation (mma.sync m16n8k16), cp.async pipelines, fp32
// state: the steps, their mma.sync kernels and the dispatch; the head_dim-128 warpgroup kernels (range KV and the
// range walk on sm_90a wgmma) live in lightning_bf16_wg.cu.
#include <cstdlib>

#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/lightning_bf16.cuh"
#include "kernels/cuda/mma_bf16.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kKvThreads = 256;  // block KV: 8 warps, 4 (key dim) x 2 (value dim)
constexpr int kOutThreads = 128; // output: 4 warps x 16 query rows
constexpr int kRows = 64;        // query / key tile rows
constexpr int kMaxBlock = 1024;
constexpr int kKvStages = 3;     // block KV cp.async pipeline depth

constexpr int kMaxRangeTiles = LightningPlan::kMaxBlocksPerRange * (kMaxBlock / kRows);

/// 1. Grid (num_ranges, H). One CTA walks the range's blocks (64-token K / V tiles through a 3-stage cp.async
/// pipeline) carrying the range-local state in fp32 accumulators: at block i's first tile, L_i (the state entering
/// block i from a zero state at the range start) is stored as bf16 to lb[b, h] (i > 0), then acc <- e^{-s m_i} acc
/// and acc += sum_j bf16(e^{-s(m_i-1-j)} k_j)^T v_j over the block's keys (fp32 decay product rounded to bf16 in the
/// K^T fragments). The range's aggregate (acc at its end) goes to agg[r, h] ([D, D] fp32). Warp w owns rows
/// (w % 4) D / 4.. and columns (w / 4) D / 2.. of the state.
template <int D>
__global__ void __launch_bounds__(kKvThreads, 2) range_kv_kernel(const bf16* __restrict__ qkv, int64_t qs,
                                                                 LightningDevParams p, LightningPlanDev plan,
                                                                 float* __restrict__ agg, bf16* __restrict__ lb) {
  constexpr int LD = D + 8, WM = D / 4, WN = D / 2, MI = WM / 16, NI = WN / 8, CH = D / 8, ST = kKvStages;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* stages = reinterpret_cast<bf16*>(smem);  // [ST][K 64 rows, V 64 rows][LD]
  float* kd = reinterpret_cast<float*>(stages + ST * 2 * kRows * LD);  // [ST][64] e^{-s(m-1-j)}, 0 past m
  int* tiles = reinterpret_cast<int*>(kd + ST * kRows);                 // [kMaxRangeTiles] block (local) << 16 | row0
  __shared__ int ntile_s;
  const int r = blockIdx.x, h = blockIdx.y;
  const int b0 = plan.ranges[3 * r], nb = plan.ranges[3 * r + 1];
  const int seq = plan.blocks[3 * b0 + 2];
  if (plan.state_indices[seq] == 0) return;
  const float s = p.slopes[h];
  if (threadIdx.x == 0) {
    int n = 0;
    for (int i = 0; i < nb; ++i)
      for (int r0 = 0; r0 < plan.blocks[3 * (b0 + i) + 1] && n < kMaxRangeTiles; r0 += kRows) tiles[n++] = i << 16 | r0;
    ntile_s = n;
  }
  __syncthreads();
  const int ntile = ntile_s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = (warp & 3) * WM, wn = (warp >> 2) * WN;
  const int g = lane >> 2, t = lane & 3;
  const bf16* kbase = qkv + static_cast<int64_t>(h) * 3 * D + D;
  auto issue = [&](int it) {
    bf16* st = stages + (it % ST) * 2 * kRows * LD;
    const int bi = b0 + (tiles[it] >> 16), r0 = tiles[it] & 0xffff;
    const int tok0 = plan.blocks[3 * bi], m = plan.blocks[3 * bi + 1];
    for (int idx = threadIdx.x; idx < 2 * kRows * CH; idx += kKvThreads) {
      const int rr = idx / CH, c = (idx % CH) * 8, row = r0 + rr % kRows;  // rows 0..63 K, 64..127 V
      const bool ok = row < m;
      cp_async16(st + rr * LD + c, kbase + static_cast<int64_t>(tok0 + (ok ? row : 0)) * qs + (rr / kRows) * D + c,
                 ok ? 16 : 0);
    }
    if (threadIdx.x < kRows) {
      const int row = r0 + threadIdx.x;
      kd[(it % ST) * kRows + threadIdx.x] = row < m ? decay(s, static_cast<double>(m - 1 - row)) : 0.0f;
    }
  };
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    if (i < ntile) issue(i);
    cp_async_commit_group();
  }
  float acc[MI][NI][4] = {};
  for (int it = 0; it < ntile; ++it) {
    cp_async_wait_group<ST - 2>();
    __syncthreads();  // tile it landed (and its kd); every warp is done with the stage reloaded below
    if (it + ST - 1 < ntile) issue(it + ST - 1);
    cp_async_commit_group();
    if ((tiles[it] & 0xffff) == 0 && it > 0) {  // block i starts: store L_i (unless lb is null), decay the state
      const int bi = b0 + (tiles[it] >> 16);
      const float bd = decay(s, static_cast<double>(plan.blocks[3 * bi + 1]));
      if (lb != nullptr) {
        bf16* dst = lb + (static_cast<int64_t>(bi) * p.num_heads + h) * D * D;
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int n = 0; n < NI; ++n) {
            bf16* r0 = dst + (wm + 16 * i + g) * D + wn + 8 * n + 2 * t;
            *reinterpret_cast<uint32_t*>(r0) = pack_bf16(acc[i][n][0], acc[i][n][1]);
            *reinterpret_cast<uint32_t*>(r0 + 8 * D) = pack_bf16(acc[i][n][2], acc[i][n][3]);
          }
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int n = 0; n < NI; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[i][n][e] *= bd;
    }
    const bf16* ks = stages + (it % ST) * 2 * kRows * LD;
    const bf16* vs = ks + kRows * LD;
    const float* kdt = kd + (it % ST) * kRows;
#pragma unroll
    for (int kk = 0; kk < kRows; kk += 16) {
      const float d0 = kdt[kk + 2 * t], d1 = kdt[kk + 2 * t + 1], d8 = kdt[kk + 2 * t + 8], d9 = kdt[kk + 2 * t + 9];
      uint32_t a[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        load_a_t(a[i], ks, LD, wm + 16 * i, kk);  // A = K^T: [d][j]; a0 / a1 keys 2t.., a2 / a3 keys 2t + 8..
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[i][q]));
          a[i][q] = q < 2 ? pack_bf16(x.x * d0, x.y * d1) : pack_bf16(x.x * d8, x.y * d9);
        }
      }
#pragma unroll
      for (int n = 0; n < NI; n += 2) {
        uint32_t bb[4];
        load_b_kn(bb, vs, LD, kk, wn + 8 * n);
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          mma_bf16(acc[i][n], a[i], bb[0], bb[1]);
          mma_bf16(acc[i][n + 1], a[i], bb[2], bb[3]);
        }
      }
    }
  }
  float* dst = agg + (static_cast<int64_t>(r) * p.num_heads + h) * D * D;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int n = 0; n < NI; ++n) {
      float* r0 = dst + (wm + 16 * i + g) * D + wn + 8 * n + 2 * t;
      *reinterpret_cast<float2*>(r0) = make_float2(acc[i][n][0], acc[i][n][1]);
      *reinterpret_cast<float2*>(r0 + 8 * D) = make_float2(acc[i][n][2], acc[i][n][3]);
    }
}

/// 2. Grid (ceil(D*D / 4 / 256), H, num_seqs). Each thread carries 4 state elements through the sequence's ranges:
/// S_r (the state entering range r, from the initial state or zeros) overwrites agg[r] (read first: the range's
/// aggregate A_r); S <- e^{-s tokens_r} S + A_r. The final S goes to the state pool; "all" mode: the S after range r
/// also to pool block plan.range_store[r] when nonzero (rounded as the final S).
template <class TS>
__global__ void __launch_bounds__(kScanThreads) range_scan_kernel(LightningDevParams p, LightningPlanDev plan,
                                                                  float* __restrict__ agg) {
  constexpr int kAhead = 4;
  const int seq = blockIdx.z, h = blockIdx.y;
  const int64_t DD = static_cast<int64_t>(p.head_dim) * p.head_dim;
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * kScanThreads + threadIdx.x) * 4;
  if (e >= DD) return;
  const int32_t sb = plan.state_indices[seq];
  if (sb == 0) return;
  TS* st = static_cast<TS*>(p.states.data) + sb * p.states.block_stride + h * DD + e;
  float4 S{0.f, 0.f, 0.f, 0.f};
  if (plan.num_computed[seq] > 0) S = make_float4(load(st), load(st + 1), load(st + 2), load(st + 3));
  const float s = p.slopes[h];
  const int r0 = plan.seq_first_range[seq], r1 = plan.seq_first_range[seq + 1];
  auto at = [&](int r) { return agg + (static_cast<int64_t>(r) * p.num_heads + h) * DD + e; };
  float4 ahead[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) ahead[i] = r0 + i < r1 ? *reinterpret_cast<const float4*>(at(r0 + i)) : float4{};
  for (int r = r0; r < r1; r += kAhead) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      if (r + i >= r1) break;
      const float4 a = ahead[i];
      if (r + i + kAhead < r1) ahead[i] = *reinterpret_cast<const float4*>(at(r + i + kAhead));
      *reinterpret_cast<float4*>(at(r + i)) = S;
      const float bd = decay(s, static_cast<double>(plan.ranges[3 * (r + i) + 2]));
      S = make_float4(bd * S.x + a.x, bd * S.y + a.y, bd * S.z + a.z, bd * S.w + a.w);
      if (plan.range_store) store_state4<TS>(p, plan.range_store[r + i], h * DD + e, S.x, S.y, S.z, S.w);
    }
  }
  store(st, S.x), store(st + 1, S.y), store(st + 2, S.z), store(st + 3, S.w);
}

/// 2b. Grid (num_blocks, H). S_b = e^{-s off_b} S_r + L_b (S_r alone for the range's first block; S_r from step 2
/// in agg) overwrites lb[b] as bf16, the state step 3 reads: every block independent, all loads in flight at once.
/// Null rows and blocks that start their sequence from zeros (nothing carried in) are skipped.
template <int D>
__global__ void __launch_bounds__(kScanThreads, 2) block_state_kernel(LightningDevParams p, LightningPlanDev plan,
                                                                   const float* __restrict__ agg, bf16* __restrict__ lb) {
  constexpr int N = D * D / 4 / kScanThreads;  // 4 consecutive elements per thread and step
  const int b = blockIdx.x, h = blockIdx.y;
  const int seq = plan.blocks[3 * b + 2];
  if (plan.state_indices[seq] == 0 || (b == plan.seq_first_block[seq] && plan.num_computed[seq] == 0)) return;
  const int rg = plan.block_range[2 * b], off = plan.block_range[2 * b + 1];
  const float f = decay(p.slopes[h], static_cast<double>(off));
  const float* Sr = agg + (static_cast<int64_t>(rg) * p.num_heads + h) * D * D;
  bf16* Sb = lb + (static_cast<int64_t>(b) * p.num_heads + h) * D * D;
  float4 v[N];
  uint2 l[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = (i * kScanThreads + threadIdx.x) * 4;
    v[i] = *reinterpret_cast<const float4*>(Sr + e);
    l[i] = off > 0 ? *reinterpret_cast<const uint2*>(Sb + e) : make_uint2(0, 0);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int e = (i * kScanThreads + threadIdx.x) * 4;
    const float2 l0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&l[i].x));
    const float2 l1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&l[i].y));
    *reinterpret_cast<uint2*>(Sb + e) =
        make_uint2(pack_bf16(f * v[i].x + l0.x, f * v[i].y + l0.y), pack_bf16(f * v[i].z + l1.x, f * v[i].w + l1.y));
  }
}


template <int D>
constexpr size_t out_smem_bytes() {
  return 2 * 2 * kRows * (D + 8) * sizeof(bf16) + (kMaxBlock + kRows + 1) * sizeof(float);
}

/// 3. Grid (num_qtiles, H), 4 warps; warp w owns query rows 16 w.. of the tile. o_i = e^{-s(i+1)} q_i S_b +
/// sum_{j<=i} e^{-s(i-j)} (q_i . k_j) v_j with S_b from step 2 (sb, bf16). Q fragments stay in registers; S_b,
/// then each 64-key K / V tile, stream through two shared-memory buffers with cp.async (the next tile loads while
/// this one computes); the decayed scores go from the accumulators straight into bf16 A fragments for P V.
/// Q is staged in the first K / V buffer (the first K / V tile loads once
/// the Q fragments are in registers), so 74 KB of shared memory and <= 168 registers give 3 CTAs per SM.
template <int D, class TO>
__global__ void __launch_bounds__(kOutThreads, 3) out_kernel(const bf16* __restrict__ qkv, int64_t qs,
                                                             TO* __restrict__ out, int64_t os, LightningDevParams p,
                                                             LightningPlanDev plan, const bf16* __restrict__ sb) {
  constexpr int LD = D + 8, CH = D / 8, KD = D / 16, NO = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const buf0 = reinterpret_cast<bf16*>(smem);  // two buffers [128][LD]: K rows 0..63, V rows 64..127 (or S_b)
  auto buf = [&](int i) { return buf0 + i * 2 * kRows * LD; };
  bf16* const Qs = buf0;  // [64][LD] until the Q fragments are loaded
  float* dd = reinterpret_cast<float*>(buf0 + 4 * kRows * LD);  // [row0 + 65] e^{-s k}

  const int qt = blockIdx.x, h = blockIdx.y;
  const int b = plan.qtiles[2 * qt], row0 = plan.qtiles[2 * qt + 1];
  const int tok0 = plan.blocks[3 * b], m = plan.blocks[3 * b + 1], seq = plan.blocks[3 * b + 2];
  const int nq = min(kRows, m - row0);
  TO* outb = out + static_cast<int64_t>(tok0 + row0) * os + static_cast<int64_t>(h) * D;
  if (plan.state_indices[seq] == 0) {
    for (int idx = threadIdx.x; idx < nq * D; idx += kOutThreads) store(outb + static_cast<int64_t>(idx / D) * os + idx % D, 0.0f);
    return;
  }
  const bool has_state = b != plan.seq_first_block[seq] || plan.num_computed[seq] > 0;
  const bf16* qbase = qkv + static_cast<int64_t>(tok0) * qs + static_cast<int64_t>(h) * 3 * D;
  // Rows [r0, r0 + 64) of column block col (0 q, 1 k, 2 v) into dst; rows >= m zero-filled.
  auto load_rows = [&](bf16* dst, int r0, int col) {
    for (int idx = threadIdx.x; idx < kRows * CH; idx += kOutThreads) {
      const int r = idx / CH, c = (idx % CH) * 8;
      const bool ok = r0 + r < m;
      cp_async16(dst + r * LD + c, qbase + static_cast<int64_t>(ok ? r0 + r : 0) * qs + col * D + c, ok ? 16 : 0);
    }
  };
  load_rows(Qs, row0, 0);
  if (has_state) {
    const bf16* S = sb + (static_cast<int64_t>(b) * p.num_heads + h) * D * D;
    for (int idx = threadIdx.x; idx < D * CH; idx += kOutThreads) {
      const int r = idx / CH, c = (idx % CH) * 8;
      cp_async16(buf(1) + r * LD + c, S + r * D + c, 16);
    }
  }
  cp_async_commit_group();
  const float s = p.slopes[h];
  for (int k = threadIdx.x; k <= row0 + kRows; k += kOutThreads) dd[k] = decay(s, static_cast<double>(k));
  cp_async_wait_group<0>();
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, wr = warp * 16;
  uint32_t qf[KD][4];
#pragma unroll
  for (int k = 0; k < KD; ++k) load_a(qf[k], Qs, LD, wr, 16 * k);
  __syncthreads();  // Q (in buf(0)) is in registers: the first K / V tile may overwrite it
  load_rows(buf(0), 0, 1);
  load_rows(buf(0) + kRows * LD, 0, 2);
  cp_async_commit_group();
  float acc[NO][4] = {};
  if (has_state) {  // e^{-s(i+1)} q_i S_b
#pragma unroll
    for (int k = 0; k < KD; ++k)
#pragma unroll
      for (int n = 0; n < NO; n += 2) {
        uint32_t bb[4];
        load_b_kn(bb, buf(1), LD, 16 * k, 8 * n);
        mma_bf16(acc[n], qf[k], bb[0], bb[1]);
        mma_bf16(acc[n + 1], qf[k], bb[2], bb[3]);
      }
    const float f0 = dd[row0 + wr + g + 1], f1 = dd[row0 + wr + g + 9];
#pragma unroll
    for (int n = 0; n < NO; ++n) acc[n][0] *= f0, acc[n][1] *= f0, acc[n][2] *= f1, acc[n][3] *= f1;
  }
  const int ntiles = row0 / kRows + 1;
  const int i0 = row0 + wr + g, i1 = i0 + 8;  // this thread's block-local query rows
  for (int jt = 0; jt < ntiles; ++jt) {
    cp_async_wait_group<0>();
    __syncthreads();  // tile jt landed; every warp is done with the other buffer
    if (jt + 1 < ntiles) {
      bf16* nb = buf((jt + 1) & 1);
      load_rows(nb, (jt + 1) * kRows, 1);
      load_rows(nb + kRows * LD, (jt + 1) * kRows, 2);
      cp_async_commit_group();
    }
    const bf16* Kt = buf(jt & 1);
    const bf16* Vt = Kt + kRows * LD;
    const int j0 = jt * kRows;
    // Keys this warp needs in the tile: all, or up to its last row on the diagonal tile.
    const int kn = jt + 1 < ntiles ? kRows : wr + 16;
    float sc[kRows / 8][4] = {};
#pragma unroll
    for (int k = 0; k < KD; ++k)
#pragma unroll
      for (int n = 0; n < kRows / 8; n += 2) {
        if (8 * n >= kn) break;
        uint32_t bb[4];
        load_b_nk(bb, Kt, LD, 16 * k, 8 * n);
        mma_bf16(sc[n], qf[k], bb[0], bb[1]);
        mma_bf16(sc[n + 1], qf[k], bb[2], bb[3]);
      }
#pragma unroll
    for (int kk = 0; kk < kRows / 16; ++kk) {
      if (16 * kk >= kn) break;
      uint32_t pa[4];
      float v[2][4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kk + half, j = j0 + 8 * n + 2 * t;
        v[half][0] = j <= i0 ? sc[n][0] * dd[i0 - j] : 0.0f;
        v[half][1] = j + 1 <= i0 ? sc[n][1] * dd[i0 - j - 1] : 0.0f;
        v[half][2] = j <= i1 ? sc[n][2] * dd[i1 - j] : 0.0f;
        v[half][3] = j + 1 <= i1 ? sc[n][3] * dd[i1 - j - 1] : 0.0f;
      }
      pa[0] = pack_bf16(v[0][0], v[0][1]);
      pa[1] = pack_bf16(v[0][2], v[0][3]);
      pa[2] = pack_bf16(v[1][0], v[1][1]);
      pa[3] = pack_bf16(v[1][2], v[1][3]);
#pragma unroll
      for (int n = 0; n < NO; n += 2) {
        uint32_t bb[4];
        load_b_kn(bb, Vt, LD, 16 * kk, 8 * n);
        mma_bf16(acc[n], pa, bb[0], bb[1]);
        mma_bf16(acc[n + 1], pa, bb[2], bb[3]);
      }
    }
  }
  const int r0 = wr + g;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int c = 8 * n + 2 * t;
    if (r0 < nq) store2(outb + static_cast<int64_t>(r0) * os + c, acc[n][0], acc[n][1]);
    if (r0 + 8 < nq) store2(outb + static_cast<int64_t>(r0 + 8) * os + c, acc[n][2], acc[n][3]);
  }
}

constexpr int kWalkThreads = 256;  // range walk: 8 warps

#include "kernels/cuda/lightning_bf16_walk.cuh"  // the range walk (step 3, mma.sync) and launch_walk

/// With the warpgroup walk, step 1 on warpgroups too unless KernelTuning::lightning_kv_wg is off.
bool kv_wg_on() { return kernel_tuning().lightning_kv_wg; }

/// Step 3 (KernelTuning::lightning_walk): 0 block states + per-tile output kernel; 1 the range walk (mma.sync); 2 the
/// warpgroup walk (head_dim 128; else the range walk).
int walk_mode() { return kernel_tuning().lightning_walk; }

template <int D, class TO>
cudaError_t launch_out(const bf16* qkv, int64_t qs, TO* out, int64_t os, const LightningDevParams& p,
                       const LightningPlanDev& plan, const bf16* sb, cudaStream_t stream) {
  constexpr size_t smem = out_smem_bytes<D>();
  const cudaError_t e = cudaFuncSetAttribute(out_kernel<D, TO>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  out_kernel<D, TO><<<dim3(plan.num_qtiles, p.num_heads), kOutThreads, smem, stream>>>(qkv, qs, out, os, p, plan, sb);
  return launch_status();
}

template <int D, class TO>
cudaError_t prefill_bf16_d(const bf16* qkv, int64_t qs, TO* out, int64_t os, const LightningDevParams& p,
                           const LightningPlanDev& plan, float* ws, cudaStream_t stream) {
  const int H = p.num_heads;
  cudaError_t e = cudaSuccess;
  LaunchProfile prof(stream);
  float* agg = ws;  // [num_ranges, H, D, D] fp32: A_r, then S_r
  bf16* lb = reinterpret_cast<bf16*>(ws + static_cast<int64_t>(plan.num_ranges) * H * D * D);  // [num_blocks, H, D, D]
  const int mode = walk_mode();
  const bool walk = mode != 0;
  if (plan.num_ranges > 0) {
    const size_t smem_kv = kKvStages * 2 * kRows * (D + 8) * sizeof(bf16) + kKvStages * kRows * sizeof(float) +
                           kMaxRangeTiles * sizeof(int);
    e = cudaFuncSetAttribute(range_kv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_kv));
    if (e != cudaSuccess) return e;

    bool kv_wg = false;
    if constexpr (D == 128) kv_wg = mode == 2 && kv_wg_on();
    if (kv_wg) {
      if ((e = launch_range_kv_wg(qkv, qs, p, plan, agg, stream)) != cudaSuccess) return e;
    } else {
      range_kv_kernel<D><<<dim3(plan.num_ranges, H), kKvThreads, smem_kv, stream>>>(qkv, qs, p, plan, agg,
                                                                                     walk ? nullptr : lb);
    }
    if ((e = launch_status()) != cudaSuccess) return e;
    prof.mark("lightning16 range_kv");
  }
  const dim3 scan_grid(ceil_div(static_cast<int64_t>(D) * D / 4, kScanThreads), H, plan.num_seqs);
  e = visit_dtype(p.states.dtype, [&](auto tag) {
    range_scan_kernel<decltype(tag)><<<scan_grid, kScanThreads, 0, stream>>>(p, plan, agg);
    return launch_status();
  });
  if (e != cudaSuccess || plan.num_blocks == 0) return e;
  prof.mark("lightning16 range_scan");
  if (walk) {
    if constexpr (D == 128) {
      if (mode == 2) {
        e = launch_walk_wg(qkv, qs, out, os, p, plan, agg, stream);
        prof.mark("lightning16 walk_wg");
        return e;
      }
    }
    e = launch_walk<D, TO>(qkv, qs, out, os, p, plan, agg, stream);
    prof.mark("lightning16 walk");
    return e;
  }
  block_state_kernel<D><<<dim3(plan.num_blocks, H), kScanThreads, 0, stream>>>(p, plan, agg, lb);
  if ((e = launch_status()) != cudaSuccess) return e;
  prof.mark("lightning16 block_state");
  e = launch_out<D, TO>(qkv, qs, out, os, p, plan, lb, stream);
  prof.mark("lightning16 output");
  return e;
}

template <class TO>
cudaError_t prefill_bf16(const bf16* qkv, int64_t qkv_stride, TO* out, int64_t out_stride, const LightningDevParams& p,
                         const LightningPlanDev& plan, float* workspace, cudaStream_t stream) {
  if (p.num_heads <= 0 || (p.head_dim != 64 && p.head_dim != 128) || p.block_size <= 0 || p.block_size > kMaxBlock ||
      p.slopes == nullptr || p.states.data == nullptr || qkv_stride % 8 != 0 || out_stride % 8 != 0 ||
      qkv_stride < 3LL * p.num_heads * p.head_dim || out_stride < static_cast<int64_t>(p.num_heads) * p.head_dim ||
      plan.num_seqs < 0 || plan.num_blocks < 0)
    return cudaErrorInvalidValue;
  if (plan.num_seqs == 0) return cudaSuccess;
  if (plan.num_blocks > 0 && (qkv == nullptr || out == nullptr || workspace == nullptr || plan.ranges == nullptr ||
                              plan.seq_first_range == nullptr || plan.block_range == nullptr || plan.num_ranges <= 0))
    return cudaErrorInvalidValue;
  return p.head_dim == 64 ? prefill_bf16_d<64>(qkv, qkv_stride, out, out_stride, p, plan, workspace, stream)
                          : prefill_bf16_d<128>(qkv, qkv_stride, out, out_stride, p, plan, workspace, stream);
}

}  // namespace

cudaError_t lightning_prefill_bf16(const __nv_bfloat16* qkv, int64_t qkv_stride, __nv_bfloat16* out,
                                   int64_t out_stride, const LightningDevParams& p, const LightningPlanDev& plan,
                                   float* workspace, cudaStream_t stream) {
  return prefill_bf16(qkv, qkv_stride, out, out_stride, p, plan, workspace, stream);
}
cudaError_t lightning_prefill_bf16(const __nv_bfloat16* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                                   const LightningDevParams& p, const LightningPlanDev& plan, float* workspace,
                                   cudaStream_t stream) {
  return prefill_bf16(qkv, qkv_stride, out, out_stride, p, plan, workspace, stream);
}

}  // namespace ssmserve::cuda
