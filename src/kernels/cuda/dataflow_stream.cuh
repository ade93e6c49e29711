// Owns the dataflow decode kernel's weight stream (dataflow_decode.h): the producer, which copies a block's weight
// rows layer after layer into the shared-memory ring, and the consumers' GEMV over those slots (mma.sync with x in
// the act_pos operand order). Included by dataflow_decode.cu only.
#pragma once
#include "kernels/cuda/dataflow_common.cuh"

namespace ssmserve::cuda::dataflow {

/// One streamed weight matrix of a layer: `rows` rows of `rb` bytes from `base`, `rps` rows per ring slot.
struct Seg {
  const char* base;
  int rows, rb, rps;
};

/// A block's weight stream: every layer's segments (in_proj x rows, x_projᵀ, in_proj z rows, dt_proj rows,
/// out_proj rows) in the consumers' order, cut into pieces of whole rows that fill one ring slot each.
struct WeightStream {
  const KP* p;
  Part pt;
  int l = -1, k = 5, r = 0;
  Seg segs[5];
  /// The next piece (`bytes` from `src`); false at the end of the last layer.
  __device__ bool next(const char*& src, unsigned& bytes) {
    while (k == 5 || r >= segs[k].rows) {
      if (k < 5) ++k, r = 0;
      if (k == 5) {
        if (++l == p->L) return false;
        load_layer();
        k = 0;
      }
    }
    const Seg& sg = segs[k];
    const int nr = min(sg.rps, sg.rows - r);
    src = sg.base + static_cast<size_t>(r) * sg.rb;
    bytes = static_cast<unsigned>(nr) * sg.rb;  // whole rows, contiguous: one copy
    r += nr;
    return true;
  }
  __device__ void load_layer() {
    const Mamba1DataflowLayer& Ly = p->layers[l];
    const int CB = pt.c1 - pt.c0, HB = pt.h1 - pt.h0, H = p->H, I = p->I, XD = p->XD, R = p->R;
    const char* inp = static_cast<const char*>(Ly.w.in_proj);
    segs[0] = {inp + static_cast<size_t>(pt.c0) * H * 2, CB, H * 2, p->slot / (H * 2)};
    segs[1] = {static_cast<const char*>(Ly.x_proj_t) + static_cast<size_t>(pt.c0) * XD * 2, CB, XD * 2,
               xproj_rows_per_slot(p->slot, XD)};
    segs[2] = {inp + (static_cast<size_t>(I) + pt.c0) * H * 2, CB, H * 2, p->slot / (H * 2)};
    segs[3] = {static_cast<const char*>(Ly.w.dt_proj) + static_cast<size_t>(pt.c0) * R * 2, CB, R * 2,
               p->slot / (R * 2)};
    segs[4] = {static_cast<const char*>(Ly.w.out_proj) + static_cast<size_t>(pt.h0) * I * 2, HB, I * 2,
               p->slot / (I * 2)};
  }
};

/// The producer (one thread): the block's weight stream into the ring slots, one bulk copy per slot.
__device__ void produce(const KP& p, const Part& pt, uint64_t* full, uint64_t* empty, unsigned char* ring) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  WeightStream ws{&p, pt};
  int it = 0, landed = 0;  // slots issued; slots seen landed (copies in flight = it - landed)
  const char* src;
  unsigned bytes;
  while (ws.next(src, bytes)) {
    const int s = it % p.ns;
    if (it >= p.ns) mbar_wait(saddr(empty + s), static_cast<uint32_t>(((it / p.ns) - 1) & 1));
    // At most p.inflight copies outstanding: deeper queues only delay the step's latency-bound loads.
    for (; it - landed >= p.inflight; ++landed)
      mbar_wait(saddr(full + landed % p.ns), static_cast<uint32_t>((landed / p.ns) & 1));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_expect_tx(saddr(full + s), bytes);
    bulk_copy(saddr(ring + static_cast<size_t>(s) * p.slot), src, bytes, saddr(full + s), policy);
    ++it;
  }
}

/// Position of element e of an activation row in the GEMVs' operand layout: in every 8-element block the bf16
/// pairs (32-bit words) 1 and 2 swap places, so one 16-byte load gives a lane the A fragment {X0, X2, X1, X3} that
/// gemv's two mma per chunk share (element e's bits 1 and 2 exchanged).
__host__ __device__ __forceinline__ int act_pos(int e) { return (e & ~6) | ((e & 2) << 1) | ((e & 4) >> 1); }

/// d += a b, mma.sync m16n8k16 (bf16 in, fp32 accumulate); not volatile, so the loads around it can be scheduled.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

/// One slot of at most 4 rows (out_proj of mamba-2.8b), two chunks per mma: tile column n = 4 j + r is row r
/// (clamped to the slot) of chunk c + j, A rows g = 4 j + m and g + 8 are batch row m0 + m's chunk c + j, so the
/// mma's valid products are D[m][r] (chunk c) and D[4 + m][4 + r] (chunk c + 1): no tile column is wasted, half
/// the loads and mma of gemv's 8-row tiles. Chunk pairs alternate between two accumulator sets; a lane's sum is
/// ((a0 + a1) + (b0 + b1)) (rows g, then rows g + 8), and lane (m, t < 2) adds its partner (m + 4, t + 2)'s
/// (the odd chunks) after its own: one order for every batch (passes of up to 4 batch rows).
__device__ __forceinline__ void gemv_slot_paired(const uint4* sl, const __nv_bfloat16* xs, int nr, int K, int c0,
                                                 int c1, int cf, int M, int lane, float* rp, int maxrows, int r0,
                                                 int warp) {
  const int g = lane >> 2, t = lane & 3, j = g >> 2, q = g & 3, K16 = K / 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const uint4* wg = sl + static_cast<size_t>(min(q, nr - 1)) * K16 + t;
  for (int m0 = 0; m0 < M; m0 += 4) {
    const bool xon = m0 + q < M;
    const uint4* xg = reinterpret_cast<const uint4*>(xs + static_cast<size_t>(xon ? m0 + q : 0) * K) + t;
    float a0[4] = {}, b0[4] = {}, a1[4] = {}, b1[4] = {};
    int c = c0;
#pragma unroll 1
    for (; c + 3 < cf; c += 4) {  // two whole chunk pairs
      const int k0 = 4 * (c + j), k1 = 4 * (c + 2 + j);
      const uint4 w0 = wg[k0], w1 = wg[k1];
      uint4 x0 = zero, x1 = zero;
      if (xon) x0 = xg[k0], x1 = xg[k1];
      mma16816(a0, x0, w0.x, w0.y);
      mma16816(b0, x0, w0.z, w0.w);
      mma16816(a1, x1, w1.x, w1.y);
      mma16816(b1, x1, w1.z, w1.w);
    }
#pragma unroll 1
    for (; c < c1; c += 2) {  // the last pairs: a chunk past the range or cut at K contributes zeros
      const int cc = c + j;
      const bool on = cc < c1 && (cc < cf || 32 * cc + 8 * t < K);
      const uint4 w0 = on ? wg[4 * cc] : zero, x0 = on && xon ? xg[4 * cc] : zero;
      mma16816(a0, x0, w0.x, w0.y);
      mma16816(b0, x0, w0.z, w0.w);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float v = (a0[e] + a1[e]) + (b0[2 + e] + b1[2 + e]);
      const float odd = __shfl_down_sync(0xffffffffu, v, 18);  // lane (g + 4, t + 2): the same row's chunks c + 1
      const int r = 2 * t + e;
      if (g < 4 && t < 2 && xon && r < nr) rp[((m0 + g) * maxrows + r0 + r) * kConsumerWarps + warp] = v + odd;
    }
  }
}

/// res[m * ldr + r] = Σ_k W[r, k] xs[m * K + k] for the `rows` rows of W streamed next (K bf16 each, `slot / 2K`
/// rows per slot; xs rows in act_pos order), on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate).
/// Consumer warp w owns the 32-wide k chunks [w cpw, (w + 1) cpw) of every row and runs them over 8-row tiles
/// with W as the B operand (lane (g, t) loads W row g's 16 bytes 8t..8t+7 of the chunk: B fragments {w0, w1}
/// and {w2, w3} as they lie in registers) and x as the A operand (lane (g, t) loads batch row g's words in act_pos
/// order {X0, X2, X1, X3}; A rows g + 8 are don't-care): the first mma's rows g give X0 W0 + X1 W1, the second's
/// rows g + 8 give X2 W2 + X3 W3, so no register moves or zero fills. Even / odd chunks go to two accumulator
/// pairs; the sum is ((a0 + b0) + (a1 + b1)) per (row, batch row), then the consumer warps' partials in warp order.
/// Tile columns past the slot's rows and A rows past M read clamped rows and are ignored. Fixed order for a given
/// K, independent of M and of the other rows' values: batch-invariant.
template <int MT>
__device__ void gemv(Ring& rg, const KP& p, int rows, int K, const __nv_bfloat16* xs, float* rp, float* res, int ldr,
                     int ng, int tid) {
  const int lane = tid & 31, M = p.M, g = lane >> 2, t = lane & 3;
  // ng groups of consumer warps (ng divides kConsumerWarps: mamba1_dataflow_decode) take the slots in turn (group
  // j % ng does slot j; the others only wait for it to land and give it back), so each warp's per-slot latency
  // chain overlaps the other groups'.
  const int gw = kConsumerWarps / ng, grp = (tid >> 5) / gw, warp = (tid >> 5) % gw;
  const int chunks = (K + 31) / 32, cpw = (chunks + gw - 1) / gw;
  const int rps = p.slot / (K * 2);
  const int c0 = min(chunks, warp * cpw), c1 = min(chunks, c0 + cpw), cf = min(c1, K / 32);  // [c0, cf) whole
  const uint4* xg = reinterpret_cast<const uint4*>(xs + static_cast<size_t>(g < M ? g : 0) * K) + t;  // 16 B units
  const bool xon = g < M;  // A rows >= M stay zero: their outputs are never read
  const int K16 = K / 8;  // 16-byte units per row
  for (int r0 = 0, j = 0; r0 < rows; r0 += rps, ++j) {
    const int nr = min(rps, rows - r0);
    const auto* sl = reinterpret_cast<const uint4*>(rg.take());
    const bool mine = j % ng == grp;
    if (rps <= 4 && mine && !(p.debug & 1)) {  // a shape property: the same path for every batch
      for (int rep = 0; rep < (p.debug & 2 ? 2 : 1); ++rep)
        gemv_slot_paired(sl, xs, nr, K, c0, c1, cf, M, lane, rp, p.maxrows, r0, warp);
      rg.give(lane);
      continue;
    }
    for (int rep = 0; rep < (p.debug & 2 ? 2 : 1); ++rep)
    for (int rt = 0; rt < (p.debug & 1 || !mine ? 0 : nr); rt += 8) {
      const uint4* wg = sl + static_cast<size_t>(min(rt + g, nr - 1)) * K16 + t;
      float e0[4] = {}, e1[4] = {}, o0[4] = {}, o1[4] = {};  // even / odd chunks; rows g of *0, rows g + 8 of *1
      int c = c0;
#pragma unroll 1
      for (; c + 1 < cf; c += 2) {
        const uint4 w0 = wg[4 * c], w1 = wg[4 * c + 4];
        uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
        if (xon) x0 = xg[4 * c], x1 = xg[4 * c + 4];  // lanes of batch rows >= M skip (their quarter-warps too)
        mma16816(e0, x0, w0.x, w0.y);
        mma16816(e1, x0, w0.z, w0.w);
        mma16816(o0, x1, w1.x, w1.y);
        mma16816(o1, x1, w1.z, w1.w);
      }
#pragma unroll 1
      for (; c < c1; ++c) {  // the last chunks: at most one whole and one cut at K
        const bool on = c < cf || 32 * c + 8 * t < K;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const uint4 w0 = on ? wg[4 * c] : zero, x0 = on && xon ? xg[4 * c] : zero;
        mma16816(e0, x0, w0.x, w0.y);
        mma16816(e1, x0, w0.z, w0.w);
      }
      // Lane (g, t): batch row g, tile rows 2t and 2t + 1.
      if (g < M) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = rt + 2 * t + e;
          if (r < nr) rp[(g * p.maxrows + r0 + r) * kConsumerWarps + warp] = (e0[e] + o0[e]) + (e1[2 + e] + o1[2 + e]);
        }
      }
    }
    rg.give(lane);
  }
  cbar();
  for (int e = tid; e < M * rows; e += kConsumers) {
    const int m = e / rows, r = e % rows;
    const float* q = rp + (m * p.maxrows + r) * kConsumerWarps;
    float s = 0.0f;
    for (int w = 0; w < gw; ++w)
      if (w * cpw < chunks) s += q[w];
    res[m * ldr + r] = s;
  }
  cbar();
}

}  // namespace ssmserve::cuda::dataflow
