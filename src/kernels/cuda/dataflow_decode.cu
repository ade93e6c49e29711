// Owns the dataflow Mamba-1 decode kernel (see dataflow_decode.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cooperative_launch.cuh"
#include "kernels/cuda/dataflow_common.cuh"
#include "kernels/cuda/dataflow_decode.h"
#include "kernels/cuda/dataflow_stream.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/tma_ring.cuh"

#include <algorithm>

namespace ssmserve::cuda {
namespace {
using namespace detail;
using namespace dataflow;


/// This lane's share of Σ_b v[b * stride] over the grid's blocks (b = lane, lane + 32, ...; at most
/// kMaxGrid / 32 loads, all issued before the adds, which run in b order); a warp_sum completes it.
__device__ __forceinline__ float sum_over_blocks(const float* v, int stride, int lane) {
  float x[kMaxGrid / 32];
#pragma unroll
  for (int k = 0; k < kMaxGrid / 32; ++k) {
    const int bb = lane + 32 * k;
    x[k] = bb < static_cast<int>(gridDim.x) ? __ldcg(v + static_cast<size_t>(bb) * stride) : 0.0f;
  }
  float s = x[0];
#pragma unroll
  for (int k = 1; k < kMaxGrid / 32; ++k) s += x[k];
  return s;
}

/// Sum of squares of the block's own residual rows res_s [M, hbmax] (rows [0, HB)) -> ssp[b, m]; warp m sums lane
/// strides in order, then a warp sum.
__device__ __forceinline__ void publish_ss(const KP& p, const float* res_s, int HB, int tid) {
  const int lane = tid & 31, warp = tid >> 5;
  if (warp < p.M) {
    float s = 0.0f;
    for (int r = lane; r < HB; r += 32) s = fmaf(res_s[warp * p.hbmax + r], res_s[warp * p.hbmax + r], s);
    s = warp_sum(s);
    if (lane == 0) __stcg(p.ssp + blockIdx.x * p.M + warp, s);
  }
}

template <class TS, int MT>
__global__ void __launch_bounds__(kThreads, 1) dataflow_kernel(const __grid_constant__ KP p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = gridDim.x, b = blockIdx.x;
  const int H = p.H, I = p.I, N = p.N, R = p.R, Wd = p.W, XD = p.XD, M = p.M;
  const Part pt = part_of(b, G, H, I);
  const int c0 = pt.c0, CB = pt.c1 - pt.c0, h0 = pt.h0, HB = pt.h1 - pt.h0;
  auto* full = reinterpret_cast<uint64_t*>(smem + p.o_bar);
  uint64_t* empty = full + kMaxSlots;
  unsigned char* ring = smem + p.o_ring;
  if (tid == 0) {
    for (int s = 0; s < p.ns; ++s) mbar_init(saddr(full + s), 1), mbar_init(saddr(empty + s), kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == kConsumerWarps) {
    if (lane == 0) produce(p, pt, full, empty, ring);
    return;
  }
  Ring rg{full, empty, ring, p.ns, p.slot};
  auto* act = reinterpret_cast<__nv_bfloat16*>(smem + p.o_act);  // xn [M, H] or y [M, I]
  auto* xo = reinterpret_cast<float*>(smem + p.o_xo);              // [M, cbmax] in_proj x rows
  auto* zo = reinterpret_cast<float*>(smem + p.o_zo);              // [M, cbmax] in_proj z rows
  auto* us = reinterpret_cast<float*>(smem + p.o_u);               // [M, cbmax] conv outputs (SiLU)
  auto* rp = reinterpret_cast<float*>(smem + p.o_rp);              // [M, maxrows, nseg] GEMV partials
  auto* xp = reinterpret_cast<float*>(smem + p.o_xp);              // [M, XD] x_proj partial (own channels)
  auto* xd = reinterpret_cast<float*>(smem + p.o_xd);              // [M, XD] xdbl
  auto* db = reinterpret_cast<__nv_bfloat16*>(smem + p.o_db);      // [M, R] bf16 dt_low
  auto* dts = reinterpret_cast<float*>(smem + p.o_dt);             // [M, cbmax] softplus(dt)
  auto* res_s = reinterpret_cast<float*>(smem + p.o_res);          // [M, hbmax] own residual rows
  auto* os = reinterpret_cast<float*>(smem + p.o_os);              // [M, hbmax] own out_proj rows
  auto* inv = reinterpret_cast<float*>(smem + p.o_inv);            // [M] 1 / rms
  auto* As = reinterpret_cast<float*>(smem + p.o_A);               // [cbmax, N]
  auto* cws = reinterpret_cast<float*>(smem + p.o_cw);             // [cbmax, W]
  auto* cbs = reinterpret_cast<float*>(smem + p.o_cb);             // [cbmax]
  auto* dtbs = reinterpret_cast<float*>(smem + p.o_dtb);           // [cbmax]
  auto* Ds = reinterpret_cast<float*>(smem + p.o_D);               // [cbmax]
  auto* cst = reinterpret_cast<TS*>(smem + p.o_cst);               // [M, W - 1, cbmax]
  auto* sst = reinterpret_cast<TS*>(smem + p.o_sst);               // [M, cbmax, N]
  const bool timed = p.timing && b == 0 && tid == 0;
  const int S = Wd - 1;

  // Layer 0's residual is the input: the block's rows and their sum of squares, then S0.
  for (int e = tid; e < M * HB; e += kConsumers) {
    const int m = e / HB, r = e % HB;
    res_s[m * p.hbmax + r] = __ldcg(p.hidden + static_cast<size_t>(m) * H + h0 + r);
  }
  cbar();
  publish_ss(p, res_s, HB, tid);
  arrive(p.sync, tid);

  for (int l = 0; l < p.L; ++l) {
    unsigned long long* tm = timed ? p.timing + static_cast<size_t>(l) * kTimePoints : nullptr;
    if (tm) tm[0] = now_ns(), tm[15] = clock64();
    const Mamba1DecodeLayer& Lw = p.layers[l].w;
    unsigned* sy = p.sync + 1 + 4 * l;
    // A. The layer's per-channel parameters and the rows' states of the own channels into shared memory.
    if (CB > 0) {
      cp_bytes(As, Lw.A + static_cast<size_t>(c0) * N, CB * N * 4, tid);
      cp_bytes(cws, Lw.conv_weight + static_cast<size_t>(c0) * Wd, CB * Wd * 4, tid);
      cp_bytes(dtbs, Lw.dt_bias + c0, CB * 4, tid);
      if (Lw.conv_bias) cp_bytes(cbs, Lw.conv_bias + c0, CB * 4, tid);
      if (Lw.D) cp_bytes(Ds, Lw.D + c0, CB * 4, tid);
      const TS* cg = static_cast<const TS*>(Lw.conv_states.data);
      const TS* sg = static_cast<const TS*>(Lw.ssm_states.data);
      for (int m = 0; m < M; ++m) {
        const int64_t blk = p.si[m];
        for (int k = 0; k < S; ++k)
          cp_bytes(cst + (m * S + k) * p.cbmax, cg + blk * Lw.conv_states.block_stride + static_cast<int64_t>(k) * I + c0,
                   CB * static_cast<int>(sizeof(TS)), tid);
        cp_bytes(sst + static_cast<size_t>(m) * p.cbmax * N,
                 sg + blk * Lw.ssm_states.block_stride + static_cast<int64_t>(c0) * N, CB * N * static_cast<int>(sizeof(TS)),
                 tid);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (!Lw.conv_bias)
      for (int c = tid; c < CB; c += kConsumers) cbs[c] = 0.0f;
    if (!Lw.D)
      for (int c = tid; c < CB; c += kConsumers) Ds[c] = 0.0f;

    // B. After the previous layer (S0 / S3): 1 / rms of every row from the blocks' partials, xn = bf16(rms norm).
    wait_all(l == 0 ? p.sync : sy - 1, tid);
    {
      constexpr int kV = 4;  // float4 loads in flight per thread per pass
      const int n4 = M * H / 4;
      const float4* h4 = reinterpret_cast<const float4*>(p.hidden);
      for (int base = 0; base < n4; base += kV * kConsumers) {
        float4 v[kV];
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const int q = base + j * kConsumers + tid;
          if (q < n4) v[j] = __ldcg(h4 + q);
        }
        if (base == 0) {  // the partials' loads after the first rows' (one round trip for both)
          if (warp < M) {
            const float ss = warp_sum(sum_over_blocks(p.ssp + warp, M, lane));
            if (lane == 0) inv[warp] = 1.0f / sqrtf(ss / static_cast<float>(H) + p.eps);
          }
          cbar();
        }
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const int q = base + j * kConsumers + tid;
          if (q < n4) {
            const int m = (q * 4) / H, h = (q * 4) % H;
            const float iv = inv[m];
            const float4 w = *reinterpret_cast<const float4*>(Lw.norm + h);
            __nv_bfloat162 lo = __floats2bfloat162_rn(v[j].x * iv * w.x, v[j].y * iv * w.y);
            __nv_bfloat162 hi = __floats2bfloat162_rn(v[j].z * iv * w.z, v[j].w * iv * w.w);
            __nv_bfloat16* row = act + static_cast<size_t>(m) * H;  // act_pos order (h % 4 == 0)
            *reinterpret_cast<__nv_bfloat162*>(row + act_pos(h)) = lo;
            *reinterpret_cast<__nv_bfloat162*>(row + act_pos(h + 2)) = hi;
            if (h + 3 >= h0 && h < h0 + HB) {
              const float vv[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
              for (int i = 0; i < 4; ++i)
                if (h + i >= h0 && h + i < h0 + HB) res_s[m * p.hbmax + h + i - h0] = vv[i];
            }
          }
        }
      }
      cbar();
    }
    if (tm) tm[1] = now_ns();

    // C. x rows of in_proj (own channels).
    if (tm) tm[11] = tm[12] = tm[13] = 0, rg.wait = tm + 11;
    if (tm && l == 1) rg.trace = p.timing + static_cast<size_t>(p.L) * kTimePoints, rg.trace_left = kTraceSlots;
    gemv<MT>(rg, p, CB, H, act, rp, xo, p.cbmax, tid);
    if (tm) tm[2] = now_ns();

    // D. Causal conv update of the own channels (state shifted in shared memory, written back), u = SiLU(conv).
    asm volatile("cp.async.wait_all;" ::: "memory");
    cbar();
    for (int e = tid; e < M * CB; e += kConsumers) {
      const int m = e / CB, c = e % CB;
      float u = 0.0f;
      if (p.si[m] != 0)
        u = conv_update_channel(cst + m * S * p.cbmax + c, p.cbmax, Wd, cws + c * Wd, cbs[c], xo[m * p.cbmax + c], true);
      us[m * p.cbmax + c] = u;
    }
    cbar();
    if (tm) tm[17] = now_ns();

    // E. x_proj partial sums over the own channels (bf16 u, as the op chain's x_proj input) -> part[b]; S1.
    {
      // Channel c into accumulator c % 4 (four independent chains kept in xq [4, M, XD] across slots, whose
      // first channels are multiples of 4), then (a0 + a1) + (a2 + a3): the same order for any slot size.
      float* xq = xp;
      const int E = M * XD;
      for (int e = tid; e < E; e += kConsumers)  // by the thread that owns element e below (no barrier needed)
        xq[e] = xq[E + e] = xq[2 * E + e] = xq[3 * E + e] = 0.0f;
      const int rps = xproj_rows_per_slot(p.slot, XD);
      for (int r0 = 0; r0 < CB; r0 += rps) {
        const int nr = min(rps, CB - r0);
        const auto* wt = reinterpret_cast<const __nv_bfloat16*>(rg.take());
        for (int e = tid; e < E; e += kConsumers) {
          const int m = e / XD, j = e % XD;
          const float* ur = us + m * p.cbmax + r0;
          auto term = [&](int rr, float acc) { return fmaf(round_bf16(ur[rr]), __bfloat162float(wt[rr * XD + j]), acc); };
          float a0 = xq[e], a1 = xq[E + e], a2 = xq[2 * E + e], a3 = xq[3 * E + e];
          int rr = 0;
          for (; rr + 4 <= nr; rr += 4) a0 = term(rr, a0), a1 = term(rr + 1, a1), a2 = term(rr + 2, a2), a3 = term(rr + 3, a3);
          if (rr < nr) a0 = term(rr, a0);
          if (rr + 1 < nr) a1 = term(rr + 1, a1);
          if (rr + 2 < nr) a2 = term(rr + 2, a2);
          xq[e] = a0, xq[E + e] = a1, xq[2 * E + e] = a2, xq[3 * E + e] = a3;
        }
        rg.give(lane);
      }
      for (int e = tid; e < E; e += kConsumers)
        __stcg(p.part + static_cast<size_t>(b) * E + e, (xq[e] + xq[E + e]) + (xq[2 * E + e] + xq[3 * E + e]));
      if (tm) tm[18] = now_ns();
      arrive(sy + 0, tid);
      if (tm) tm[3] = now_ns();
    }
    // The shifted conv windows back to the state pool (after the arrival: the sync's fence does not wait for them).
    if (CB > 0) {
      TS* cg = static_cast<TS*>(Lw.conv_states.data);
      for (int m = 0; m < M; ++m) {
        const int64_t blk = p.si[m];
        if (blk == 0) continue;
        for (int k = 0; k < S; ++k)
          st_bytes(cg + blk * Lw.conv_states.block_stride + static_cast<int64_t>(k) * I + c0, cst + (m * S + k) * p.cbmax,
                   CB * static_cast<int>(sizeof(TS)), tid);
      }
    }

    // F. z rows of in_proj (own channels), while S1 completes.
    if (tm) rg.wait = tm + 12;
    gemv<MT>(rg, p, CB, H, act, rp, zo, p.cbmax, tid);
    rg.wait = nullptr;
    if (tm) tm[4] = now_ns();

    // G. Reduce-scatter of the x_proj partials (element e summed over the blocks in order), S1b, xdbl.
    wait_all(sy + 0, tid);
    if (tm) tm[5] = now_ns();
    {
      const int E = M * XD, e0 = static_cast<int>(static_cast<long long>(b) * E / G),
                e1 = static_cast<int>(static_cast<long long>(b + 1) * E / G);
      for (int e = e0 + warp; e < e1; e += kConsumerWarps) {
        const float s = warp_sum(sum_over_blocks(p.part + e, E, lane));
        if (lane == 0) __stcg(p.fin + e, s);
      }
      arrive(sy + 1, tid);
      wait_all(sy + 1, tid);
      for (int e = tid; e < E; e += kConsumers) {
        const float v = __ldcg(p.fin + e);
        xd[e] = v;
        const int m = e / XD, j = e % XD;
        if (j < R) db[m * R + j] = __float2bfloat16_rn(v);
      }
      cbar();
    }
    if (tm) tm[6] = now_ns();

    // H. dt = softplus(dt_proj bf16(dt_low) + dt_bias) for the own channels: 4 lanes per channel (units
    //    gl, gl + 4, ... in order, then a 2-level xor sum), 8 channels per warp at once.
    {
      constexpr int kG = 4;
      const int rps = p.slot / (R * 2), units = R / 8, gl = lane % kG;
      for (int r0 = 0; r0 < CB; r0 += rps) {
        const int nr = min(rps, CB - r0);
        const auto* wt = reinterpret_cast<const uint4*>(rg.take());
        for (int cb0 = warp * (32 / kG); cb0 < nr; cb0 += kConsumerWarps * (32 / kG)) {  // warp-uniform
          const int rr = cb0 + lane / kG;
          const bool on = rr < nr;
          for (int m = 0; m < M; ++m) {
            const uint4* xm = reinterpret_cast<const uint4*>(db + m * R);
            float a = 0.0f;
            if (on)
              for (int u = gl; u < units; u += kG) a = dot8(wt[rr * units + u], xm[u], a);
            a += __shfl_xor_sync(0xffffffffu, a, 2);
            a += __shfl_xor_sync(0xffffffffu, a, 1);
            if (on && gl == 0) dts[m * p.cbmax + r0 + rr] = softplus(a + dtbs[r0 + rr]);
          }
        }
        rg.give(lane);
      }
      cbar();
    }
    if (tm) tm[7] = now_ns();

    // I. Selective state update of the own channels, y = (Σ state C + D u) SiLU(z) -> bf16 y; states back; S2.
    {
      const int lanes = p.lanes, per = 32 / lanes, gl = lane % lanes, grp = lane / lanes;
      for (int pr0 = warp * per; pr0 < M * CB; pr0 += kConsumerWarps * per) {  // warp-uniform trip count
        const int pr = pr0 + grp;
        const bool in = pr < M * CB;
        const int m = in ? pr / CB : 0, c = in ? pr % CB : 0;
        const bool on = in && p.si[m] != 0;
        const float u = us[m * p.cbmax + c];
        const float a = scan_update_channel(sst + (static_cast<size_t>(m) * p.cbmax + c) * N, As + c * N,
                                            xd + m * XD + R, xd + m * XD + R + N, N, dts[m * p.cbmax + c], u, gl,
                                            lanes, on);
        if (in && gl == 0) {
          float yv = 0.0f;
          if (on) yv = (a + Ds[c] * u) * silu(zo[m * p.cbmax + c]);
          p.y[static_cast<size_t>(m) * I + act_pos(c0 + c)] = __float2bfloat16_rn(yv);  // out_proj's operand order
        }
      }
      arrive(sy + 2, tid);
      if (tm) tm[8] = now_ns();
      if (CB > 0) {  // the updated states back to the pool (after the arrival, as the conv windows)
        TS* sg = static_cast<TS*>(Lw.ssm_states.data);
        for (int m = 0; m < M; ++m) {
          const int64_t blk = p.si[m];
          if (blk != 0)
            st_bytes(sg + blk * Lw.ssm_states.block_stride + static_cast<int64_t>(c0) * N,
                     sst + static_cast<size_t>(m) * p.cbmax * N, CB * N * static_cast<int>(sizeof(TS)), tid);
        }
      }
    }

    // J. All of y into shared memory.
    wait_all(sy + 2, tid);
    if (tm) tm[9] = now_ns();
    {
      const int n16 = M * I / 8;
      const uint4* y4 = reinterpret_cast<const uint4*>(p.y);
      for (int q = tid; q < n16; q += kConsumers) reinterpret_cast<uint4*>(act)[q] = __ldcg(y4 + q);
      cbar();
    }

    // K. out_proj rows h0..h1: the next layer's residual rows and their sum of squares (S3), or `out`.
    if (tm) tm[14] = now_ns(), rg.wait = tm + 13;
    gemv<MT>(rg, p, HB, I, act, rp, os, p.hbmax, tid);
    rg.wait = nullptr, rg.trace = nullptr;
    const bool last = l + 1 == p.L;
    for (int e = tid; e < M * HB; e += kConsumers) {
      const int m = e / HB, r = e % HB;
      const size_t gi = static_cast<size_t>(m) * H + h0 + r;
      if (last) {
        __stcg(p.out + gi, os[m * p.hbmax + r]);
      } else {
        const float v = res_s[m * p.hbmax + r] + os[m * p.hbmax + r];
        res_s[m * p.hbmax + r] = v;
        __stcg(p.hidden + gi, v);
      }
    }
    if (tm) tm[10] = now_ns(), tm[16] = clock64();
    if (!last) {
      cbar();
      publish_ss(p, res_s, HB, tid);
      arrive(sy + 3, tid);
    }
  }
  // Counters back to zero for the next launch once every block is past its last wait.
  cbar();
  if (tid == 0) {
    __threadfence();
    unsigned* done = p.sync + 1 + 4 * p.L;
    if (atomicAdd(done, 1u) == static_cast<unsigned>(G - 1)) {
      for (int i = 0; i <= 4 * p.L; ++i) atomicExch(p.sync + i, 0u);
      atomicExch(done, 0u);
      __threadfence();
    }
  }
}


struct Layout {
  int G = 0, ns = 0, slot = 0, cbmax = 0, hbmax = 0, maxrows = 0, nseg = 0, lanes = 1;
  size_t o_bar, o_act, o_xo, o_zo, o_u, o_rp, o_xp, o_xd, o_db, o_dt, o_res, o_os, o_inv, o_A, o_cw, o_cb, o_dtb, o_D,
      o_cst, o_sst, o_ring, smem = 0;
};

Layout layout(const Mamba1DecodeShape& s, int64_t M, size_t esz, int G) {
  Layout L{};
  const int H = static_cast<int>(s.H), I = static_cast<int>(s.I), N = static_cast<int>(s.N), R = static_cast<int>(s.R);
  const int W = static_cast<int>(s.W), XD = R + 2 * N;
  L.G = G;
  for (int b = 0; b < G; ++b) {
    const Part pt = part_of(b, G, H, I);
    L.cbmax = std::max(L.cbmax, pt.c1 - pt.c0), L.hbmax = std::max(L.hbmax, pt.h1 - pt.h0);
  }
  L.cbmax = std::max(L.cbmax, 8), L.hbmax = std::max(L.hbmax, 1);
  L.maxrows = std::max(L.cbmax, L.hbmax);
  L.nseg = kConsumerWarps;  // gemv partials per row: one per consumer warp
  while (L.lanes < 32 && L.lanes * kScanMaxPerLane < N) L.lanes *= 2;
  if (L.lanes < 4 && N >= 4) L.lanes = 4;
  const int maxrow = 2 * std::max({H, I, XD, R});
  L.slot = std::max({kSlotTarget, (maxrow + 15) / 16 * 16, 4 * 2 * XD});  // shape only, not M
  auto up = [](size_t v) { return (v + 127) & ~size_t{127}; };
  const size_t m = static_cast<size_t>(M), cb = L.cbmax, hb = L.hbmax;
  size_t o = 0;
  L.o_bar = o, o += up(2 * kMaxSlots * 8);
  L.o_act = o, o += up(m * std::max(H, I) * 2);
  L.o_xo = o, o += up(m * cb * 4);
  L.o_zo = o, o += up(m * cb * 4);
  L.o_u = o, o += up(m * cb * 4);
  L.o_rp = o, o += up(m * L.maxrows * L.nseg * 4);
  L.o_xp = o, o += up(4 * m * XD * 4);
  L.o_xd = o, o += up(m * XD * 4);
  L.o_db = o, o += up(m * R * 2);
  L.o_dt = o, o += up(m * cb * 4);
  L.o_res = o, o += up(m * hb * 4);
  L.o_os = o, o += up(m * hb * 4);
  L.o_inv = o, o += up(m * 4);
  L.o_A = o, o += up(cb * N * 4);
  L.o_cw = o, o += up(cb * W * 4);
  L.o_cb = o, o += up(cb * 4);
  L.o_dtb = o, o += up(cb * 4);
  L.o_D = o, o += up(cb * 4);
  L.o_cst = o, o += up(m * (W - 1) * cb * esz);
  L.o_sst = o, o += up(m * cb * N * esz);
  L.o_ring = o;
  const size_t room = o < kSmemLimit ? kSmemLimit - o : 0;
  L.ns = static_cast<int>(std::min<size_t>(kMaxSlots, room / L.slot));
  L.smem = o + static_cast<size_t>(L.ns) * L.slot;
  return L;
}

size_t ws_sync_bytes(int num_layers) { return (static_cast<size_t>(4 * num_layers + 2) * 4 + 255) & ~size_t{255}; }

}  // namespace

bool mamba1_dataflow_supported(const Mamba1DecodeShape& s, int64_t M, DType state_dtype) {
  if (M < 1 || M > kDataflowMaxRows || s.H < 8 || s.H % 8 != 0 || s.I < 8 || s.I % 8 != 0 || s.R < 8 ||
      s.R % 8 != 0 || (s.R + 2 * s.N) % 8 != 0 || s.N < 1 || s.N > 32 * kScanMaxPerLane || s.W < 1 ||
      s.W > kConvMaxWidth || s.H > (1 << 16) || s.I > (1 << 17) || s.R > (1 << 12) ||
      (state_dtype != DType::F32 && state_dtype != DType::BF16))
    return false;
  const int G = sm_count();
  if (G < 1 || G > kMaxGrid) return false;
  const Layout L = layout(s, M, state_dtype == DType::F32 ? 4 : 2, G);
  return L.ns >= kMinSlots;
}

size_t mamba1_dataflow_workspace(const Mamba1DecodeShape& s, int num_layers) {
  const size_t G = static_cast<size_t>(std::max(sm_count(), 1)), XD = static_cast<size_t>(s.R + 2 * s.N);
  const size_t M = kDataflowMaxRows;
  auto up = [](size_t v) { return (v + 255) & ~size_t{255}; };
  return ws_sync_bytes(num_layers) + up(G * M * XD * 4) + up(M * XD * 4) + up(M * static_cast<size_t>(s.I) * 2) +
         up(G * M * 4);
}

cudaError_t mamba1_dataflow_decode(const Mamba1DecodeShape& s, const Mamba1DataflowLayer* layers_host,
                                   const Mamba1DataflowLayer* layers_dev, int num_layers, int M,
                                   const Mamba1DataflowBuffers& buf, const Mamba1DataflowOptions& opt,
                                   cudaStream_t stream) {
  auto a16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  if (num_layers < 1 || !layers_host || !layers_dev || !buf.hidden || !buf.out || !buf.state_indices ||
      !buf.workspace || buf.workspace_bytes < mamba1_dataflow_workspace(s, num_layers) || !a16(buf.hidden) ||
      !a16(buf.workspace))  // hidden is read as float4, the workspace's y as uint4
    return cudaErrorInvalidValue;
  const DType sd = layers_host[0].w.ssm_states.dtype;
  if (!mamba1_dataflow_supported(s, M, sd)) return cudaErrorInvalidValue;
  const size_t esz = sd == DType::F32 ? 4 : 2;
  for (int l = 0; l < num_layers; ++l) {
    const Mamba1DataflowLayer& L = layers_host[l];
    const Mamba1DecodeLayer& w = L.w;
    if (w.conv_states.dtype != sd || w.ssm_states.dtype != sd || !a16(w.in_proj) || !a16(L.x_proj_t) ||
        !a16(w.dt_proj) || !a16(w.out_proj) || !a16(w.A) || !a16(w.conv_weight) || !a16(w.dt_bias) || !w.norm ||
        !a16(w.norm) || !a16(w.conv_states.data) || !a16(w.ssm_states.data) || (w.conv_bias && !a16(w.conv_bias)) ||
        (w.D && !a16(w.D)) || (w.conv_states.block_stride * esz) % 16 != 0 ||
        (w.ssm_states.block_stride * esz) % 16 != 0)
      return cudaErrorInvalidValue;
  }
  const int G = sm_count();
  const Layout L = layout(s, M, esz, G);
  KP p{};
  p.H = static_cast<int>(s.H), p.I = static_cast<int>(s.I), p.N = static_cast<int>(s.N), p.R = static_cast<int>(s.R);
  p.W = static_cast<int>(s.W), p.XD = p.R + 2 * p.N, p.M = M, p.L = num_layers, p.ns = L.ns, p.slot = L.slot;
  p.cbmax = L.cbmax, p.hbmax = L.hbmax, p.maxrows = L.maxrows, p.nseg = L.nseg, p.lanes = L.lanes, p.eps = s.eps;
  p.layers = layers_dev, p.hidden = buf.hidden, p.out = buf.out, p.si = buf.state_indices, p.timing = opt.timing, p.debug = opt.debug;
  p.inflight = std::clamp(opt.inflight, 1, L.ns);
  auto up = [](size_t v) { return (v + 255) & ~size_t{255}; };
  auto* ws = static_cast<unsigned char*>(buf.workspace);
  const size_t XD = static_cast<size_t>(p.XD), MM = kDataflowMaxRows;
  size_t o = 0;
  p.sync = reinterpret_cast<unsigned*>(ws + o), o += ws_sync_bytes(num_layers);
  p.part = reinterpret_cast<float*>(ws + o), o += up(static_cast<size_t>(G) * MM * XD * 4);
  p.fin = reinterpret_cast<float*>(ws + o), o += up(MM * XD * 4);
  p.y = reinterpret_cast<__nv_bfloat16*>(ws + o), o += up(MM * static_cast<size_t>(p.I) * 2);
  p.ssp = reinterpret_cast<float*>(ws + o);
  auto off = [](size_t v) { return static_cast<int>(v); };
  p.o_bar = off(L.o_bar), p.o_act = off(L.o_act), p.o_xo = off(L.o_xo), p.o_zo = off(L.o_zo), p.o_u = off(L.o_u);
  p.o_rp = off(L.o_rp), p.o_xp = off(L.o_xp), p.o_xd = off(L.o_xd), p.o_db = off(L.o_db), p.o_dt = off(L.o_dt);
  p.o_res = off(L.o_res), p.o_os = off(L.o_os), p.o_inv = off(L.o_inv), p.o_A = off(L.o_A), p.o_cw = off(L.o_cw);
  p.o_cb = off(L.o_cb), p.o_dtb = off(L.o_dtb), p.o_D = off(L.o_D), p.o_cst = off(L.o_cst), p.o_sst = off(L.o_sst);
  p.o_ring = off(L.o_ring);
  auto go = [&](auto kernel) { return cooperative_launch_per_sm(kernel, kThreads, L.smem, stream, p); };
  auto by_m = [&](auto ts) -> cudaError_t {
    using TS = decltype(ts);
    if (M <= 1) return go(dataflow_kernel<TS, 1>);
    if (M <= 2) return go(dataflow_kernel<TS, 2>);
    if (M <= 4) return go(dataflow_kernel<TS, 4>);
    return go(dataflow_kernel<TS, 8>);
  };
  if (sd == DType::BF16) return by_m(__nv_bfloat16{});
  return by_m(float{});
}

}  // namespace ssmserve::cuda
