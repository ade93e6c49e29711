// Owns the head_dim-128 warpgroup kernels of the bf16 lightning prefill (sm_90a wgmma, wgmma_bf16.cuh): step 1's
// range KV and step 3's range walk, launched by lightning_bf16.cu through lightning_bf16.cuh.
#include "kernels/cuda/lightning_bf16.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/wgmma_bf16.cuh"

namespace ssmserve::cuda::detail {
namespace {

constexpr int kWgThreads = 256;  // warpgroup walk: warpgroup 0 outputs, warpgroup 1 carries the state
constexpr int kWgStages = 3;     // Q / K / V chunk stages
constexpr int kWgTile = kChunk * 128 * 2;  // one [64][128] bf16 tile, bytes

/// Byte offset of the 16-byte chunk (row r, columns 8 c8..) in a [64][128] bf16 tile stored as two 128-byte-swizzled
/// halves of 64 columns (8 KB each): row r of a half at (r / 8) 1024 + (r % 8) 128, chunk c at c ^ (r % 8).
/// Rows per tile `rows` (64: Q / K / V chunk tiles; 128: the walk's S tiles, halves of 16 KB).
template <int rows = kChunk>
__device__ __forceinline__ int sw128_off(int r, int c8) {
  return (c8 >> 3) * (rows * 128) + (r >> 3) * 1024 + (r & 7) * 128 + (((c8 & 7) ^ (r & 7)) << 4);
}

constexpr size_t walk_wg_smem_bytes() { return (kWgStages * 3 + 4) * static_cast<size_t>(kWgTile) + (kChunk + 4) * sizeof(float); }

/// 3 (warpgroup walk, head_dim 128, sm_90a wgmma): the range walk of lightning_bf16.cu (walk_kernel) with warpgroup tiles. Warpgroup 0 per chunk:
/// O = Q S (m64n128, S a bf16 copy in shared memory) and the scores Q K^T (m64n64) from shared memory, decay / mask
/// in registers, O += P V with P as the register A operand; warpgroup 1 concurrently: S <- e^{-s n} S + K~^T V
/// (two m64n128 halves of the [128, 128] fp32 state in registers, decayed K^T fragments through ldmatrix as the A
/// operand) and writes bf16(S) to the other S buffer for the next chunk. Q / K / V chunks stream through 3 cp.async
/// stages, every tile (Q / K / V chunks and both S buffers) 128-byte swizzled: whole 128-byte row-half load requests
/// and conflict-free wgmma operand reads (the core-matrix layout ran the walk at 0.45 vs 0.38 ms at 64k, L2 83% busy);
/// loads issued by warpgroup 1 alone, unrolled (24 copies per thread at constant offsets: walk 0.38 -> 0.27 ms at 64k
/// against the generic indexed loop); one CTA barrier per chunk.
template <class TO>
__global__ void __launch_bounds__(kWgThreads, 1) walk_wg_kernel(const bf16* __restrict__ qkv, int64_t qs,
                                                                TO* __restrict__ out, int64_t os, LightningDevParams p,
                                                                LightningPlanDev plan, const float* __restrict__ agg) {
  constexpr int D = 128, ST = kWgStages, T = kWgTile;
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const stages = smem;            // [ST][Q, K, V] tiles [64][128]
  unsigned char* const sbuf = smem + ST * 3 * T;  // [2] S tiles [128 (key dim)][128 (value dim)]
  float* const dd = reinterpret_cast<float*>(sbuf + 4 * T);  // [65] e^{-s k}

  const int r = blockIdx.x, h = blockIdx.y;
  const int b0 = plan.ranges[3 * r], ntok = plan.ranges[3 * r + 2];
  const int tok0 = plan.blocks[3 * b0], seq = plan.blocks[3 * b0 + 2];
  TO* const outr = out + static_cast<int64_t>(tok0) * os + static_cast<int64_t>(h) * D;
  if (plan.state_indices[seq] == 0) {
    for (int idx = threadIdx.x; idx < ntok * D; idx += kWgThreads)
      store(outr + static_cast<int64_t>(idx / D) * os + idx % D, 0.0f);
    return;
  }
  const bool has_state = b0 != plan.seq_first_block[seq] || plan.num_computed[seq] > 0;
  const bf16* const qbase = qkv + static_cast<int64_t>(tok0) * qs + static_cast<int64_t>(h) * 3 * D;
  const int nchunk = (ntok + kChunk - 1) / kChunk;
  // Chunk c's Q, K, V into stage c % ST (rows past the range zero-filled), by the state warpgroup alone (the output
  // warpgroup's chain is the longer one), unrolled: its thread l loads rows l / 8 + 16 j (j < 4), 16-byte chunks
  // l % 8 and 8 + l % 8 (whole 128-byte row halves per 8 threads) of Q, K and V; 24 copies at constant offsets.
  auto issue = [&](int c) {
    if (threadIdx.x < 128) return;
    const int tl = threadIdx.x - 128, r0 = tl >> 3, c0 = tl & 7;
    unsigned char* const sb = stages + (c % ST) * 3 * T + sw128_off(r0, c0);
    const bf16* const gb = qbase + static_cast<int64_t>(kChunk * c + r0) * qs + c0 * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = kChunk * c + r0 + 16 * j < ntok;
      const bf16* const g = ok ? gb + 16 * j * qs : qbase;
#pragma unroll
      for (int m = 0; m < 3; ++m)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) cp_async16(sb + m * T + hf * 8192 + j * 2048, g + m * D + hf * 64, ok ? 16 : 0);
    }
  };
  issue(0);
  cp_async_commit_group();
  if (nchunk > 1) issue(1);
  cp_async_commit_group();
  const float s = p.slopes[h];
  for (int k = threadIdx.x; k <= kChunk; k += kWgThreads) dd[k] = decay(s, static_cast<double>(k));
  // Warp-uniform by construction (shuffled from lane 0), so ptxas sees the wgmma paths as convergent.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0);
  const int wl = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int i0 = 16 * wl + g, i1 = i0 + 8;  // this thread's chunk-local query rows (warpgroup 0) / state rows (1)
  // 128-byte-swizzled wgmma descriptors of the 16-wide k step k: K-major Q / K tiles (k within a 64-column half:
  // 32-byte start offsets), MN-major V tile (16 keys) and S tile (16 rows; halves of 64 value columns 16 KB apart).
  auto kmaj = [](const unsigned char* tile, int k) {
    return wg_desc(tile + (k >> 2) * 8192 + (k & 3) * 32, 16, 1024, true);
  };
  auto vdesc = [](const unsigned char* tile, int k) { return wg_desc(tile + 2048 * k, 8192, 1024, true); };
  auto sdesc = [](const unsigned char* tile, int k) { return wg_desc(tile + 2048 * k, 16384, 1024, true); };
  // Each warpgroup runs its own loop (so neither holds the other's registers), both through the same per-chunk
  // step: this thread's copies of chunk c landed, CTA barrier (named barrier 1: the loops are divergent code), then
  // chunk c + 2 issued into the stage chunk c - 1 used.
  auto next_chunk = [&](int c) {
    cp_async_wait_group<ST - 2>();
    fence_proxy_async();
    asm volatile("bar.sync 1, %0;\n" ::"n"(kWgThreads) : "memory");
    if (c + 2 < nchunk) issue(c + 2);
    cp_async_commit_group();
  };
  if (wg == 0) {
    // Chunk-invariant decay weights of this thread's score elements (i, key chunk-local): e^{-s(i-key)}, 0 above
    // the diagonal; and the q S row factors e^{-s(i+1)}. Filled once the table is visible (after the first barrier).
    float w[32], f0 = 0.0f, f1 = 0.0f;
    for (int c = 0; c < nchunk; ++c) {
      next_chunk(c);
      if (c == 0) {
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          const int key = 8 * (e >> 2) + 2 * t + (e & 1), i = e & 2 ? i1 : i0;
          w[e] = key <= i ? dd[i - key] : 0.0f;
        }
        f0 = dd[i0 + 1], f1 = dd[i1 + 1];
      }
      const int n = min(kChunk, ntok - kChunk * c);
      const unsigned char* Qs = stages + (c % ST) * 3 * T;
      const unsigned char* Ks = Qs + T;
      const unsigned char* Vs = Ks + T;
      const bool with_state = __shfl_sync(0xffffffffu, c > 0 || has_state, 0);
      const unsigned char* Sc = sbuf + (c & 1) * 2 * T;
      float o[64], sc[32];
      if (!with_state) {
#pragma unroll
        for (int e = 0; e < 64; ++e) o[e] = 0.0f;
      }
      // Scores first (their own commit group), then q S: the decay / mask work overlaps the q S wgmmas.
      wg_fence();
#pragma unroll
      for (int k = 0; k < D / 16; ++k)
        wgmma_ss_n64_k(sc, kmaj(Qs, k), kmaj(Ks, k), k > 0);
      wg_commit();
      if (with_state) {
#pragma unroll
        for (int k = 0; k < D / 16; ++k)
          wgmma_ss_n128_t(o, kmaj(Qs, k), sdesc(Sc, k), k > 0);
        wg_commit();
        wg_wait<1>();
      } else {
        wg_wait<0>();
      }
      wg_pin(sc);
      uint32_t pa[4][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        pa[j >> 1][(j & 1) * 2] = pack_bf16(sc[4 * j] * w[4 * j], sc[4 * j + 1] * w[4 * j + 1]);
        pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(sc[4 * j + 2] * w[4 * j + 2], sc[4 * j + 3] * w[4 * j + 3]);
      }
      wg_wait<0>();
      wg_pin(o);
      if (with_state) {
#pragma unroll
        for (int j = 0; j < 16; ++j) o[4 * j] *= f0, o[4 * j + 1] *= f0, o[4 * j + 2] *= f1, o[4 * j + 3] *= f1;
      }
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk) wgmma_rs_n128_t(o, pa[kk], vdesc(Vs, kk), 1);
      wg_commit();
      wg_wait<0>();
      wg_pin(o);
      // O through shared memory (the Q tile, free once its wgmmas completed) so the global stores are whole 16-byte
      // vectors of full rows: 256-byte row slices per pass (all 128 bf16 columns, or 64 fp32), 16-byte chunks
      // XOR-swizzled by row against bank conflicts.
      unsigned char* const stg = stages + (c % ST) * 3 * T;
      unsigned char* const outc = reinterpret_cast<unsigned char*>(outr + static_cast<int64_t>(kChunk) * c * os);
      constexpr int kPassCols = 256 / static_cast<int>(sizeof(TO));
#pragma unroll
      for (int pass = 0; pass < D / kPassCols; ++pass) {
#pragma unroll
        for (int jj = 0; jj < kPassCols / 8; ++jj) {
          const int j = pass * (kPassCols / 8) + jj;
          const int byte = (8 * j + 2 * t - pass * kPassCols) * static_cast<int>(sizeof(TO));
          const int off0 = i0 * 256 + ((((byte >> 4) ^ (i0 & 7))) << 4) + (byte & 15);
          const int off1 = i1 * 256 + ((((byte >> 4) ^ (i1 & 7))) << 4) + (byte & 15);
          store2(reinterpret_cast<TO*>(stg + off0), o[4 * j], o[4 * j + 1]);
          store2(reinterpret_cast<TO*>(stg + off1), o[4 * j + 2], o[4 * j + 3]);
        }
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
#pragma unroll
        for (int idx = threadIdx.x; idx < kChunk * 16; idx += 128) {
          const int row = idx >> 4, ch = idx & 15;
          if (row < n)
            *reinterpret_cast<uint4*>(outc + static_cast<int64_t>(row) * os * sizeof(TO) + pass * 256 + ch * 16) =
                *reinterpret_cast<const uint4*>(stg + row * 256 + ((ch ^ (row & 7)) << 4));
        }
        asm volatile("bar.sync 2, 128;\n" ::: "memory");
      }
    }
    return;
  }
  float S0[64], S1[64];  // state rows 16 wl + g (+ 8) and 64 + those; columns 8 j + 2 t (+ 1)
  {
    const float* Sr = agg + (static_cast<int64_t>(r) * p.num_heads + h) * D * D;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * j + 2 * t;
      float2 a = make_float2(0.f, 0.f), b = a, c2 = a, d2 = a;
      if (has_state) {
        a = *reinterpret_cast<const float2*>(Sr + i0 * D + col);
        b = *reinterpret_cast<const float2*>(Sr + i1 * D + col);
        c2 = *reinterpret_cast<const float2*>(Sr + (64 + i0) * D + col);
        d2 = *reinterpret_cast<const float2*>(Sr + (64 + i1) * D + col);
      }
      S0[4 * j] = a.x, S0[4 * j + 1] = a.y, S0[4 * j + 2] = b.x, S0[4 * j + 3] = b.y;
      S1[4 * j] = c2.x, S1[4 * j + 1] = c2.y, S1[4 * j + 2] = d2.x, S1[4 * j + 3] = d2.y;
    }
  }
  // S tile: [128 (key dim)][128 (value dim)] as two 128-byte-swizzled halves of 64 value columns.
  auto soff = [](int row, int c8) { return sw128_off<2 * kChunk>(row, c8); };
  auto put_state = [&](unsigned char* dst) {  // bf16(S) into an S tile, visible to wgmma after the next barrier
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<uint32_t*>(dst + soff(i0, j) + 4 * t) = pack_bf16(S0[4 * j], S0[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(dst + soff(i1, j) + 4 * t) = pack_bf16(S0[4 * j + 2], S0[4 * j + 3]);
      *reinterpret_cast<uint32_t*>(dst + soff(64 + i0, j) + 4 * t) = pack_bf16(S1[4 * j], S1[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(dst + soff(64 + i1, j) + 4 * t) = pack_bf16(S1[4 * j + 2], S1[4 * j + 3]);
    }
    fence_proxy_async();
  };
  put_state(sbuf);
  float kd64[16], bd64 = 0.0f;  // the key decays e^{-s(63-j)} of a full chunk (this thread's keys), e^{-64 s}
  for (int c = 0; c < nchunk; ++c) {
    next_chunk(c);
    if (c + 1 == nchunk) break;  // the range's final state is step 2's business
    if (c == 0) {
#pragma unroll
      for (int q = 0; q < 16; ++q) kd64[q] = dd[kChunk - 1 - (16 * (q >> 2) + 2 * t + (q & 1) + 8 * ((q >> 1) & 1))];
      bd64 = dd[kChunk];
    }
    const int n = min(kChunk, ntok - kChunk * c);
    const unsigned char* Ks = stages + (c % ST) * 3 * T + T;
    const unsigned char* Vs = Ks + T;
    const bool full = n == kChunk;
    const float bd = full ? bd64 : dd[n];
#pragma unroll
    for (int e = 0; e < 64; ++e) S0[e] *= bd, S1[e] *= bd;
    uint32_t a[4][2][4];  // decayed K^T fragments: [16-key step][state half]
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      float kd[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = 16 * kk + 2 * t + (q & 1) + 8 * (q >> 1);
        kd[q] = full ? kd64[4 * kk + q] : j < n ? dd[n - 1 - j] : 0.0f;
      }
      const int key = 16 * kk + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int c8 = 8 * half + 2 * wl + ((lane >> 3) & 1);
        ldsm_x4_t(a[kk][half], Ks + sw128_off(key, c8));
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[kk][half][q]));
          a[kk][half][q] = q < 2 ? pack_bf16(x.x * kd[0], x.y * kd[1]) : pack_bf16(x.x * kd[2], x.y * kd[3]);
        }
      }
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      const uint64_t vd = vdesc(Vs, kk);
      wgmma_rs_n128_t(S0, a[kk][0], vd, 1);
      wgmma_rs_n128_t(S1, a[kk][1], vd, 1);
    }
    wg_commit();
    wg_wait<0>();
    wg_pin(S0);
    wg_pin(S1);
    put_state(sbuf + ((c + 1) & 1) * 2 * T);
  }
}

constexpr int kKvWgStages = 3;  // K / V chunk stages of the warpgroup range KV (96 KB: 2 CTAs per SM)

/// 1 (warpgroup variant, head_dim 128, sm_90a wgmma). Grid (num_ranges, H), one warpgroup. The range aggregate
/// A_r = sum over the range's tokens of e^{-s (tokens after it in the range)} k^T v, walked in 64-token chunks like
/// the walk's state warpgroup (S <- e^{-s n} S + K~^T V: two m64n128 halves, decayed K^T fragments as the register
/// A operand, V from shared memory); A_r -> agg[r, h] ([D, D] fp32). No block states. K / V tiles are 128-byte
/// swizzled (whole 128-byte row halves per load request, conflict-free shared-memory writes), loads unrolled as in
/// the walk (range KV 0.164 -> 0.141 ms at 64k).
__global__ void __launch_bounds__(128, 2) range_kv_wg_kernel(const bf16* __restrict__ qkv, int64_t qs,
                                                             LightningDevParams p, LightningPlanDev plan,
                                                             float* __restrict__ agg) {
  constexpr int D = 128, ST = kKvWgStages, T = kWgTile;
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned char* const stages = smem;                                // [ST][K, V] tiles [64][128]
  float* const dd = reinterpret_cast<float*>(smem + ST * 2 * T);     // [65] e^{-s k}
  const int r = blockIdx.x, h = blockIdx.y;
  const int b0 = plan.ranges[3 * r], ntok = plan.ranges[3 * r + 2];
  const int tok0 = plan.blocks[3 * b0], seq = plan.blocks[3 * b0 + 2];
  if (plan.state_indices[seq] == 0) return;
  const bf16* const kbase = qkv + static_cast<int64_t>(tok0) * qs + static_cast<int64_t>(h) * 3 * D + D;
  const int nchunk = (ntok + kChunk - 1) / kChunk;
  auto issue = [&](int c) {
    unsigned char* st = stages + (c % ST) * 2 * T;
    // Thread l loads rows l / 8 + 16 j (j < 4), 16-byte chunks l % 8 and 8 + l % 8 of K and V (the walk's loads).
    const int r0 = threadIdx.x >> 3, c0 = threadIdx.x & 7;
    unsigned char* const sb = st + sw128_off(r0, c0);
    const bf16* const gb = kbase + static_cast<int64_t>(kChunk * c + r0) * qs + c0 * 8;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = kChunk * c + r0 + 16 * j < ntok;
      const bf16* const g = ok ? gb + 16 * j * qs : kbase;
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) cp_async16(sb + m * T + hf * 8192 + j * 2048, g + m * D + hf * 64, ok ? 16 : 0);
    }
  };
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    if (i < nchunk) issue(i);
    cp_async_commit_group();
  }
  const float s = p.slopes[h];
  for (int k = threadIdx.x; k <= kChunk; k += 128) dd[k] = decay(s, static_cast<double>(k));
  const int wl = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int i0 = 16 * wl + g, i1 = i0 + 8;
  float S0[64], S1[64];
#pragma unroll
  for (int e = 0; e < 64; ++e) S0[e] = 0.0f, S1[e] = 0.0f;
  for (int c = 0; c < nchunk; ++c) {
    cp_async_wait_group<ST - 2>();
    fence_proxy_async();
    __syncthreads();  // chunk c landed; every warp is done with the stage reloaded below
    if (c + ST - 1 < nchunk) issue(c + ST - 1);
    cp_async_commit_group();
    const int n = min(kChunk, ntok - kChunk * c);
    const unsigned char* Ks = stages + (c % ST) * 2 * T;
    const unsigned char* Vs = Ks + T;
    const float bd = dd[n];
#pragma unroll
    for (int e = 0; e < 64; ++e) S0[e] *= bd, S1[e] *= bd;
    uint32_t a[4][2][4];
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      float kd[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = 16 * kk + 2 * t + (q & 1) + 8 * (q >> 1);
        kd[q] = j < n ? dd[n - 1 - j] : 0.0f;
      }
      const int key = 16 * kk + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        ldsm_x4_t(a[kk][half], Ks + sw128_off(key, 8 * half + 2 * wl + ((lane >> 3) & 1)));
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[kk][half][q]));
          a[kk][half][q] = q < 2 ? pack_bf16(x.x * kd[0], x.y * kd[1]) : pack_bf16(x.x * kd[2], x.y * kd[3]);
        }
      }
    }
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      const uint64_t vd = wg_desc(Vs + 2048 * kk, 8192, 1024, true);
      wgmma_rs_n128_t(S0, a[kk][0], vd, 1);
      wgmma_rs_n128_t(S1, a[kk][1], vd, 1);
    }
    wg_commit();
    wg_wait<0>();
    wg_pin(S0);
    wg_pin(S1);
  }
  float* const dst = agg + (static_cast<int64_t>(r) * p.num_heads + h) * D * D;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = 8 * j + 2 * t;
    *reinterpret_cast<float2*>(dst + i0 * D + col) = make_float2(S0[4 * j], S0[4 * j + 1]);
    *reinterpret_cast<float2*>(dst + i1 * D + col) = make_float2(S0[4 * j + 2], S0[4 * j + 3]);
    *reinterpret_cast<float2*>(dst + (64 + i0) * D + col) = make_float2(S1[4 * j], S1[4 * j + 1]);
    *reinterpret_cast<float2*>(dst + (64 + i1) * D + col) = make_float2(S1[4 * j + 2], S1[4 * j + 3]);
  }
}

template <class TO>
cudaError_t launch_walk_wg_t(const bf16* qkv, int64_t qs, TO* out, int64_t os, const LightningDevParams& p,
                           const LightningPlanDev& plan, const float* agg, cudaStream_t stream) {
  constexpr size_t smem = walk_wg_smem_bytes();
  auto* kernel = walk_wg_kernel<TO>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  kernel<<<dim3(plan.num_ranges, p.num_heads), kWgThreads, smem, stream>>>(qkv, qs, out, os, p, plan, agg);
  return launch_status();
}

}  // namespace

cudaError_t launch_range_kv_wg(const bf16* qkv, int64_t qs, const LightningDevParams& p, const LightningPlanDev& plan,
                               float* agg, cudaStream_t stream) {
  constexpr size_t smem = kKvWgStages * 2 * static_cast<size_t>(kWgTile) + (kChunk + 4) * sizeof(float);
  const cudaError_t e =
      cudaFuncSetAttribute(range_kv_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  range_kv_wg_kernel<<<dim3(plan.num_ranges, p.num_heads), 128, smem, stream>>>(qkv, qs, p, plan, agg);
  return launch_status();
}

cudaError_t launch_walk_wg(const bf16* qkv, int64_t qs, bf16* out, int64_t os, const LightningDevParams& p,
                           const LightningPlanDev& plan, const float* agg, cudaStream_t stream) {
  return launch_walk_wg_t(qkv, qs, out, os, p, plan, agg, stream);
}
cudaError_t launch_walk_wg(const bf16* qkv, int64_t qs, float* out, int64_t os, const LightningDevParams& p,
                           const LightningPlanDev& plan, const float* agg, cudaStream_t stream) {
  return launch_walk_wg_t(qkv, qs, out, os, p, plan, agg, stream);
}

}  // namespace ssmserve::cuda::detail
