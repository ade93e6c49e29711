// Owns the GPU paged softmax attention (see paged_attention.h); RoPE and the KV-cache writes: rope_cache.cu.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/kv_page.cuh"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kQ = 16;        // queries (tokens x heads of one KV head) per task
constexpr int kChunk = 32;    // keys per shared-memory chunk (one per lane)
constexpr int kThreads = 128; // 4 warps; warp w owns queries w, w + 4, ...

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// One item's partial softmax: queries of the task's tile x keys [split * key_split, ...) of its row, written to
/// ws[item, g, qi] = (acc[D], running max m, running sum l). Grid (num_items, num_kv_heads).
/// Shared memory (dynamic: 82 KB at head_dim 256, over the 48 KB static limit): Qs [kQ][D], Ks [kChunk][D + 1]
/// (padded: lane j reads key row j), Vs [kChunk][D].
template <int D>
constexpr size_t partial_smem_bytes() {
  return sizeof(float) * (static_cast<size_t>(kQ) * D + static_cast<size_t>(kChunk) * (D + 1) + static_cast<size_t>(kChunk) * D);
}

/// NU: query slots per warp the launch needs (queries qi = warp + 4 u, u < NU; ceil(tokens_per_task x group / 4)):
/// decode rows of 4 query heads per KV head run one slot instead of four. skip_single: items of tasks with at most one
/// token are left to decode_partial_kernel (nothing written here).
template <int D, int NU>
__global__ void __launch_bounds__(kThreads) partial_kernel(const float* __restrict__ q, int64_t qs, KvCacheView cache,
                                                           PagedAttentionArgs a, float* __restrict__ ws, bool skip_single) {
  constexpr int C = D / 32;
  extern __shared__ __align__(16) float smem[];
  auto Qs = reinterpret_cast<float (*)[D]>(smem);
  auto Ks = reinterpret_cast<float (*)[D + 1]>(smem + kQ * D);
  auto Vs = reinterpret_cast<float (*)[D]>(smem + kQ * D + kChunk * (D + 1));
  pdl_wait();  // q, this step's K / V and the plan's arrays come from earlier kernels / copies
  pdl_launch_dependents();
  const int item = blockIdx.x, g = blockIdx.y, KVH = cache.num_kv_heads, group = a.num_heads / KVH;
  const int task = a.items[2 * item], split = a.items[2 * item + 1];
  const int row = a.tasks[4 * task], off = a.tasks[4 * task + 1];
  const int n = a.query_start_loc[row + 1] - a.query_start_loc[row], sl = a.seq_lens[row];
  const int nt = min(a.tasks[4 * task + 2], n - off);
  if (skip_single && nt <= 1) return;
  const int pos0 = sl - n + off, len = pos0 + nt;
  const int k0 = split * a.key_split, k1 = min(len, k0 + a.key_split);
  float* wsi = ws + (static_cast<int64_t>(item) * KVH + g) * kQ * (D + 2);
  if (sl == 0 || nt <= 0 || k0 >= k1) {
    if (threadIdx.x < kQ) {
      wsi[threadIdx.x * (D + 2) + D] = -INFINITY;
      wsi[threadIdx.x * (D + 2) + D + 1] = 0.0f;
    }
    return;
  }
  const int nq = nt * group;
  const int64_t t0 = a.query_start_loc[row] + off;
  for (int idx = threadIdx.x; idx < kQ * D; idx += kThreads) {  // rows past nq are zero (masked later)
    const int qi = idx / D, d = idx % D;
    Qs[qi][d] = qi < nq ? q[(t0 + qi / group) * qs + static_cast<int64_t>(g * group + qi % group) * D + d] : 0.0f;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m[NU], l[NU], acc[NU][C];
#pragma unroll
  for (int u = 0; u < NU; ++u) {
    m[u] = -INFINITY, l[u] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[u][c] = 0.0f;
  }
  const int64_t W = static_cast<int64_t>(KVH) * D;
  const int32_t* table = a.block_tables + static_cast<int64_t>(row) * a.max_blocks;
  for (int kb = k0; kb < k1; kb += kChunk) {
    const int nk = min(kChunk, k1 - kb);
    __syncthreads();  // the previous chunk is consumed (and Q is loaded)
    {  // kThreads / kChunk threads per key, each a quarter of its K and V rows in 16-byte loads (one page lookup per
       // key and thread, every load of the chunk in flight at once)
      constexpr int kPer = kThreads / kChunk, kSpan = D / kPer, kVec = kSpan / 4, kBatch = kVec < 8 ? kVec : 8;
      const int j = threadIdx.x / kPer, c0 = (threadIdx.x % kPer) * kSpan;
      const float* kp = nullptr;
      if (j < nk) {
        const int pos = kb + j;
        const int64_t blk = table[pos / cache.block_size];
        kp = reinterpret_cast<const float*>(cache.base + blk * cache.page_bytes + cache.layer_offset_bytes) +
             static_cast<int64_t>(pos % cache.block_size) * W + static_cast<int64_t>(g) * D + c0;
      }
#pragma unroll
      for (int h = 0; h < kVec; h += kBatch) {  // at most 8 + 8 float4 in registers (head_dim 256: two rounds)
        float4 kv[kBatch], vv[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          kv[i] = kp ? __ldg(reinterpret_cast<const float4*>(kp) + h + i) : make_float4(0.f, 0.f, 0.f, 0.f);
          vv[i] = kp ? __ldg(reinterpret_cast<const float4*>(kp + kv_elems(cache)) + h + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          float* kd = &Ks[j][c0 + 4 * (h + i)];
          kd[0] = kv[i].x, kd[1] = kv[i].y, kd[2] = kv[i].z, kd[3] = kv[i].w;
          *reinterpret_cast<float4*>(&Vs[j][c0 + 4 * (h + i)]) = vv[i];
        }
      }
    }
    __syncthreads();
    // Scores of the warp's 4 queries against key kb + lane: one pass over D, each key element loaded once.
    float sc[NU];
#pragma unroll
    for (int u = 0; u < NU; ++u) sc[u] = 0.0f;
    if (lane < nk) {
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float kd = Ks[lane][d];
#pragma unroll
        for (int u = 0; u < NU; ++u) sc[u] += Qs[warp + 4 * u][d] * kd;
      }
    }
    // Online softmax per query (rows past nq and keys past a query's position are masked).
    float p[NU];
#pragma unroll
    for (int u = 0; u < NU; ++u) {
      const int qi = warp + 4 * u;
      const bool valid = qi < nq && lane < nk && kb + lane <= pos0 + qi / group;
      const float s = valid ? sc[u] * a.scale : -INFINITY;
      const float cm = warp_max(s);
      p[u] = 0.0f;
      if (cm == -INFINITY) continue;  // uniform over the warp
      const float nm = fmaxf(m[u], cm);
      p[u] = valid ? expf(s - nm) : 0.0f;
      const float alpha = expf(m[u] - nm);
      l[u] = l[u] * alpha + warp_sum(p[u]);
#pragma unroll
      for (int c = 0; c < C; ++c) acc[u][c] *= alpha;
      m[u] = nm;
    }
    // Weighted values: each value element loaded once for the 4 queries.
    for (int j = 0; j < nk; ++j) {
      float pj[NU];
#pragma unroll
      for (int u = 0; u < NU; ++u) pj[u] = __shfl_sync(0xffffffffu, p[u], j);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float v = Vs[j][lane + 32 * c];
#pragma unroll
        for (int u = 0; u < NU; ++u) acc[u][c] += pj[u] * v;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < NU; ++u) {
    const int qi = warp + 4 * u;
    if (qi >= kQ) continue;
    float* w = wsi + qi * (D + 2);
#pragma unroll
    for (int c = 0; c < C; ++c) w[lane + 32 * c] = acc[u][c];
    if (lane == 0) w[D] = m[u], w[D + 1] = l[u];
  }
}

/// Decode-specialized partial softmax (issue 31: long-context decode was bound by partial_kernel's shared-memory
/// staging, ~1.4 TB/s): the items of tasks with one query token (decode rows; also the one-token tasks of a prefill
/// plan, so a decode row's bits do not depend on which plan a step uses), or with tz > 1 (fixed splits,
/// batch-invariant mode: tz = tokens_per_task) every task's, one block per token (blockIdx.x = item * tz + token: a
/// task's token blocks run side by side and share its K / V through the L2). One block of kDecThreads threads per
/// (item, token, KV head) covers all `group` query heads of the KV head (NG >= group, the rest computed on zero
/// queries and dropped).
/// K and V are read straight from the paged cache into registers, 16-byte loads, U keys per thread in flight at once
/// (K and V together; a masked slot's p is an exact zero), no shared-memory staging: the block is split into "key
/// streams" of L = D / 8 lanes (every lane owns 8 floats of a key row: float4 columns sub and sub + L), stream v taking
/// keys k0 + v, k0 + v + NV, ... of the split (NV = kDecThreads / L streams; one iteration covers U * NV consecutive
/// keys, so a warp's loads touch adjacent rows). Each stream keeps its own online softmax (q x K dot products summed
/// over its L lanes with a butterfly, which leaves identical bits in every lane), then the streams of a warp are merged
/// with shuffles and the warps through shared memory, in a fixed order, into ws[item, g, j * group + h] = (acc[D], max,
/// sum) for query head h < group of token j: the layout combine_kernel reads (a token with no key in the split writes
/// zeros, max -inf). The arithmetic depends only on the split's key range [k0, k1) and the query's own q / K / V
/// (batch-invariant with fixed splits, whatever the task's other tokens).
constexpr int kDecThreads = 128;
constexpr int kDecWarps = kDecThreads / 32;

/// Keys per thread in flight per iteration: 4, or 2 where the group's q / acc registers are many.
template <int NG>
constexpr int dec_unroll() {
  return NG <= 4 ? 4 : 2;
}

template <int D, int NG>
__global__ void __launch_bounds__(kDecThreads) decode_partial_kernel(const float* __restrict__ q, int64_t qs,
                                                                     KvCacheView cache, PagedAttentionArgs a,
                                                                     float* __restrict__ ws, int tz) {
  constexpr int L = D / 8, NV = kDecThreads / L, U = dec_unroll<NG>(), STEP = U * NV;
  static_assert(L >= 1 && L <= 32 && (L & (L - 1)) == 0, "head_dim 8 .. 256, a power of two");
  __shared__ float red[kDecWarps][NG][D + 2];
  pdl_wait();
  pdl_launch_dependents();
  const int item = blockIdx.x / tz, j = blockIdx.x % tz, g = blockIdx.y;
  const int KVH = cache.num_kv_heads, group = a.num_heads / KVH;
  const int task = a.items[2 * item], split = a.items[2 * item + 1];
  const int row = a.tasks[4 * task], off = a.tasks[4 * task + 1];
  const int n = a.query_start_loc[row + 1] - a.query_start_loc[row], sl = a.seq_lens[row];
  const int nt = min(a.tasks[4 * task + 2], n - off);
  if ((nt > 1 && tz == 1) || j >= max(nt, 1)) return;  // partial_kernel's task, or no such token
  const int len = sl - n + off + j + 1;  // the query (position len - 1) attends keys [0, len)
  const int k0 = split * a.key_split, k1 = min(len, k0 + a.key_split);
  float* wsi = ws + ((static_cast<int64_t>(item) * KVH + g) * kQ + static_cast<int64_t>(j) * group) * (D + 2);
  if (sl == 0 || nt <= 0 || k0 >= k1) {  // rows of this token: no key in the split
    for (int idx = threadIdx.x; idx < group * (D + 2); idx += kDecThreads) {
      const int d = idx % (D + 2);
      wsi[idx] = d == D ? -INFINITY : 0.0f;
    }
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane % L, stream = threadIdx.x / L;
  // q of the group's heads: this lane's 8 columns (4 sub .. + 3, D / 2 + 4 sub .. + 3); heads past the group zero.
  float qr[NG][8];
  {
    const float* qrow = q + static_cast<int64_t>(a.query_start_loc[row] + off + j) * qs + static_cast<int64_t>(g) * group * D;
#pragma unroll
    for (int h = 0; h < NG; ++h)
#pragma unroll
      for (int c = 0; c < 8; ++c)
        qr[h][c] = h < group ? qrow[static_cast<int64_t>(h) * D + (c < 4 ? 4 * sub + c : D / 2 + 4 * sub + c - 4)] : 0.0f;
  }
  float m[NG], l[NG], acc[NG][8];
#pragma unroll
  for (int h = 0; h < NG; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[h][c] = 0.0f;
  }
  const int64_t W = static_cast<int64_t>(KVH) * D, vel = kv_elems(cache);
  const int bs = cache.block_size;
  const std::byte* base = cache.base + cache.layer_offset_bytes;
  const int32_t* table = a.block_tables + static_cast<int64_t>(row) * a.max_blocks;
  for (int kb = k0; kb < k1; kb += STEP) {  // uniform over the block
    // Every load of the iteration in flight at once: the U page-table entries, then the U K and V rows (a slot past
    // the split re-reads key k1 - 1, masked below: straight-line code, no branch between the loads).
    bool ok[U];
    const float* kp[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int pos = kb + u * NV + stream, pc = min(pos, k1 - 1);
      ok[u] = pos < k1;
      const int64_t blk = table[pc / bs];
      kp[u] = reinterpret_cast<const float*>(base + blk * cache.page_bytes) + static_cast<int64_t>(pc % bs) * W +
              static_cast<int64_t>(g) * D + 4 * sub;
    }
    float4 kv[U][2], vv[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      kv[u][0] = __ldg(reinterpret_cast<const float4*>(kp[u]));
      kv[u][1] = __ldg(reinterpret_cast<const float4*>(kp[u] + D / 2));
      vv[u][0] = __ldg(reinterpret_cast<const float4*>(kp[u] + vel));
      vv[u][1] = __ldg(reinterpret_cast<const float4*>(kp[u] + vel + D / 2));
    }
    // Scores: the lane's 8 products per (key, head), summed over the stream's L lanes (xor butterfly: every lane of
    // the stream ends with the same bits).
    float s[U][NG];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int h = 0; h < NG; ++h) {
        float d = qr[h][0] * kv[u][0].x;
        d = fmaf(qr[h][1], kv[u][0].y, d);
        d = fmaf(qr[h][2], kv[u][0].z, d);
        d = fmaf(qr[h][3], kv[u][0].w, d);
        d = fmaf(qr[h][4], kv[u][1].x, d);
        d = fmaf(qr[h][5], kv[u][1].y, d);
        d = fmaf(qr[h][6], kv[u][1].z, d);
        d = fmaf(qr[h][7], kv[u][1].w, d);
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        s[u][h] = ok[u] ? d * a.scale : -INFINITY;
      }
    }
    // The stream's online softmax over its U keys of this iteration (no shuffles: streams are independent).
#pragma unroll
    for (int h = 0; h < NG; ++h) {
      float cm = s[0][h];
#pragma unroll
      for (int u = 1; u < U; ++u) cm = fmaxf(cm, s[u][h]);
      const float nm = fmaxf(m[h], cm);
      const float alpha = nm == -INFINITY ? 1.0f : expf(m[h] - nm);
      float p[U], ps = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) p[u] = ok[u] ? expf(s[u][h] - nm) : 0.0f, ps += p[u];
      l[h] = fmaf(l[h], alpha, ps);
      float x[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) x[c] = acc[h][c] * alpha;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        x[0] = fmaf(p[u], vv[u][0].x, x[0]);
        x[1] = fmaf(p[u], vv[u][0].y, x[1]);
        x[2] = fmaf(p[u], vv[u][0].z, x[2]);
        x[3] = fmaf(p[u], vv[u][0].w, x[3]);
        x[4] = fmaf(p[u], vv[u][1].x, x[4]);
        x[5] = fmaf(p[u], vv[u][1].y, x[5]);
        x[6] = fmaf(p[u], vv[u][1].z, x[6]);
        x[7] = fmaf(p[u], vv[u][1].w, x[7]);
      }
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[h][c] = x[c];
      m[h] = nm;
    }
  }
  // The warp's streams merged pairwise (xor L, 2L, ...); the first stream's lanes hold the warp's result.
#pragma unroll
  for (int o = L; o < 32; o <<= 1) {
#pragma unroll
    for (int h = 0; h < NG; ++h) {
      const float om = __shfl_xor_sync(0xffffffffu, m[h], o), ol = __shfl_xor_sync(0xffffffffu, l[h], o);
      const float M = fmaxf(m[h], om);
      const float wa = m[h] == -INFINITY ? 0.0f : expf(m[h] - M), wb = om == -INFINITY ? 0.0f : expf(om - M);
      l[h] = fmaf(l[h], wa, ol * wb);
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[h][c] = fmaf(acc[h][c], wa, __shfl_xor_sync(0xffffffffu, acc[h][c], o) * wb);
      m[h] = M;
    }
  }
  if (lane < L) {
#pragma unroll
    for (int h = 0; h < NG; ++h) {
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][h][4 * sub + c] = acc[h][c], red[warp][h][D / 2 + 4 * sub + c] = acc[h][4 + c];
      if (lane == 0) red[warp][h][D] = m[h], red[warp][h][D + 1] = l[h];
    }
  }
  __syncthreads();
  // The warps merged in order: acc = sum_w e^{m_w - M} acc_w, l = sum_w e^{m_w - M} l_w, M = max_w m_w.
  for (int idx = threadIdx.x; idx < group * D; idx += kDecThreads) {
    const int h = idx / D, d = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, red[w][h][D]);
    float o = 0.0f, ls = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float mw = red[w][h][D];
      const float e = mw == -INFINITY ? 0.0f : expf(mw - M);
      o = fmaf(red[w][h][d], e, o);
      ls = fmaf(red[w][h][D + 1], e, ls);
    }
    float* wr = wsi + h * (D + 2);
    wr[d] = o;
    if (d == 0) wr[D] = M, wr[D + 1] = ls;
  }
}

/// Merges a task's splits in split order: out = sum_s e^{m_s - M} acc_s / sum_s e^{m_s - M} l_s. One block per (task,
/// KV head, 32 output columns), one warp per query: the split weights e^{m_s - M} are computed once per 32 splits
/// (lane s) and broadcast, each column (lane) adds its splits in order, 32 loads in flight; the sum of l_s weights
/// is a per-lane sum, then the warp's butterfly. The arithmetic depends only on the task's number of splits.
/// Grid (num_tasks, num_kv_heads, head_dim / 32); rows with seq_len 0 get zeros.
constexpr int kCombineThreads = 256;  // one warp per query of a KV head (group <= 8 in one pass)

template <int D>
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(float* __restrict__ out, int64_t os, int num_kv_heads,
                                                                  PagedAttentionArgs a, const float* __restrict__ ws) {
  pdl_wait();
  pdl_launch_dependents();
  const int task = blockIdx.x, g = blockIdx.y, group = a.num_heads / num_kv_heads;
  const int row = a.tasks[4 * task], off = a.tasks[4 * task + 1], item0 = a.tasks[4 * task + 3];
  const int n = a.query_start_loc[row + 1] - a.query_start_loc[row], sl = a.seq_lens[row];
  const int nt = min(a.tasks[4 * task + 2], n - off);
  if (nt <= 0) return;
  const int nq = nt * group;
  const int64_t t0 = a.query_start_loc[row] + off;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d = blockIdx.z * 32 + lane;
  const int nsplit = sl == 0 ? 0 : (sl - n + off + nt - 1) / a.key_split + 1;
  for (int qi = warp; qi < nq; qi += kCombineThreads / 32) {
    const int64_t col = static_cast<int64_t>(g * group + qi % group) * D;
    float* o = out + (t0 + qi / group) * os + col;
    __nv_bfloat16* o2 = a.out_bf16 ? static_cast<__nv_bfloat16*>(a.out_bf16) + (t0 + qi / group) * a.out_bf16_stride + col
                                   : nullptr;
    if (nsplit == 0) {
      o[d] = 0.0f;
      if (o2) store(o2 + d, 0.0f);
      continue;
    }
    auto part = [&](int s) { return ws + ((static_cast<int64_t>(item0 + s) * num_kv_heads + g) * kQ + qi) * (D + 2); };
    float M = -INFINITY;
    for (int s = lane; s < nsplit; s += 32) M = fmaxf(M, part(s)[D]);
    M = warp_max(M);
    float lsum = 0.0f, acc = 0.0f;
    for (int s0 = 0; s0 < nsplit; s0 += 32) {
      const int s = s0 + lane;
      const float w = s < nsplit ? expf(part(s)[D] - M) : 0.0f;
      if (s < nsplit) lsum += part(s)[D + 1] * w;
      if (nsplit - s0 >= 32) {
        float v[32];
#pragma unroll
        for (int j = 0; j < 32; ++j) v[j] = part(s0 + j)[d];
#pragma unroll
        for (int j = 0; j < 32; ++j) acc += v[j] * __shfl_sync(0xffffffffu, w, j);
      } else {
        for (int j = 0; j < nsplit - s0; ++j) acc += part(s0 + j)[d] * __shfl_sync(0xffffffffu, w, j);
      }
    }
    const float v = acc * (1.0f / warp_sum(lsum));
    o[d] = v;
    if (o2) store(o2 + d, v);  // the bf16 copy: cast_rows of the stored fp32 value
  }
}

template <int D, int NU>
cudaError_t launch_partial(dim3 grid, size_t sm, cudaStream_t stream, bool pdl, const float* q, int64_t qs,
                           const KvCacheView& cache, const PagedAttentionArgs& a, float* ws, bool skip_single) {
  return launch_pdl(pdl, partial_kernel<D, NU>, grid, dim3(kThreads), sm, stream, q, qs, cache, a, ws, skip_single);
}

/// The largest query group decode_partial_kernel serves (larger groups: partial_kernel for every task).
constexpr int kDecMaxGroup = 8;

template <int D>
cudaError_t launch_decode_partial(dim3 grid, cudaStream_t stream, bool pdl, int group, const float* q, int64_t qs,
                                  const KvCacheView& cache, const PagedAttentionArgs& a, float* ws, int tz) {
  const auto go = [&](auto kernel) { return launch_pdl(pdl, kernel, grid, dim3(kDecThreads), 0, stream, q, qs, cache, a, ws, tz); };
  if (group <= 2) return go(decode_partial_kernel<D, 2>);
  if (group <= 4) return go(decode_partial_kernel<D, 4>);
  if (group <= 6) return go(decode_partial_kernel<D, 6>);
  return go(decode_partial_kernel<D, 8>);
}

/// The split-KV pass: the partial kernels over the items, then combine_kernel over the tasks. With
/// KernelTuning::attn_decode_kernel and group <= kDecMaxGroup, decode_partial_kernel takes the tasks of one token
/// (every task, one block per token, when the plan has fixed splits) and partial_kernel the rest; a kernel is not
/// launched when the plan says it has no task for it. Otherwise partial_kernel takes every task. pdl: every launch with
/// Programmatic Dependent Launch.
template <int D>
cudaError_t launch_split_kv(const float* q, int64_t qs, float* out, int64_t os, const KvCacheView& cache,
                            const PagedAttentionArgs& a, float* ws, cudaStream_t stream, bool pdl) {
  constexpr size_t sm = partial_smem_bytes<D>();
  const int KVH = cache.num_kv_heads, group = a.num_heads / KVH;
  const bool dec = kernel_tuning().attn_decode_kernel && group <= kDecMaxGroup, all = dec && a.fixed_split;
  // tokens_per_task 1: every task has one token (or none); num_single_tasks -1: unknown, both kernels run.
  const bool multi = !dec || (!all && a.tokens_per_task > 1 && a.num_single_tasks != a.num_tasks);
  const bool single = dec && (all || a.num_single_tasks != 0);
  const dim3 grid(a.num_items, KVH);
  if (multi) {
    if constexpr (sm > 48 * 1024) {  // not a stream operation: allowed while a graph is being captured
      for (auto* k : {partial_kernel<D, 1>, partial_kernel<D, 2>, partial_kernel<D, 4>}) {
        const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm));
        if (e != cudaSuccess) return e;
      }
    }
    const int slots = (a.tokens_per_task * group + 3) / 4;  // query slots per warp
    const cudaError_t e = slots <= 1   ? launch_partial<D, 1>(grid, sm, stream, pdl, q, qs, cache, a, ws, dec)
                          : slots == 2 ? launch_partial<D, 2>(grid, sm, stream, pdl, q, qs, cache, a, ws, dec)
                                       : launch_partial<D, 4>(grid, sm, stream, pdl, q, qs, cache, a, ws, dec);
    if (e != cudaSuccess) return e;
  }
  if (single) {
    const int tz = all && a.tokens_per_task > 1 ? a.tokens_per_task : 1;  // blocks per item: one per token
    const cudaError_t e = launch_decode_partial<D>(dim3(a.num_items * tz, KVH), stream, pdl, group, q, qs, cache, a, ws, tz);
    if (e != cudaSuccess) return e;
  }
  return launch_pdl(pdl, combine_kernel<D>, dim3(a.num_tasks, KVH, D / 32), dim3(kCombineThreads), 0, stream, out, os,
                    KVH, a, ws);
}

}  // namespace

cudaError_t paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const KvCacheView& cache,
                            const PagedAttentionArgs& a, float* workspace, cudaStream_t stream, bool pdl) {
  const int D = cache.head_dim, KVH = cache.num_kv_heads;
  if (!paged_attention_head_dim_ok(D) || KVH <= 0 || a.num_heads % KVH != 0 || a.num_heads / KVH > kQ ||
      a.tokens_per_task * (a.num_heads / KVH) > kQ || a.key_split < 32 || a.key_split % 32 != 0 || cache.block_size <= 0 ||
      a.num_tasks < 0 || a.num_items < 0 ||
      (a.out_bf16 && (a.num_tc_tiles > 0 || a.out_bf16_stride < static_cast<int64_t>(a.num_heads) * D)))
    return cudaErrorInvalidValue;
  if (a.num_tc_tiles > 0) {
    float* tc_ws = workspace == nullptr ? nullptr : workspace + paged_attention_workspace_floats(a.num_items, KVH, D);
    const cudaError_t e = paged_attention_tc(q, q_stride, out, out_stride, cache, a, stream, tc_ws);
    if (e != cudaSuccess) return e;
  }
  if (a.num_tasks == 0) return cudaSuccess;
  if (D == 64) return launch_split_kv<64>(q, q_stride, out, out_stride, cache, a, workspace, stream, pdl);
  if (D == 128) return launch_split_kv<128>(q, q_stride, out, out_stride, cache, a, workspace, stream, pdl);
  return launch_split_kv<256>(q, q_stride, out, out_stride, cache, a, workspace, stream, pdl);
}

}  // namespace ssmserve::cuda
