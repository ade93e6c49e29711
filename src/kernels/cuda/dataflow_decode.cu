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


/// This lane's share of Σ_b v[b * stride] over the grid's blocks (LL words carrying `flag`; b = lane, lane + 32,
/// ...; at most kMaxGrid / 32 loads, all issued before the waits and adds, which run in b order); a warp_sum
/// completes it.
__device__ __forceinline__ float ll_sum_over_blocks(const uint64_t* v, int stride, uint32_t flag, int sleep_ns,
                                                    int lane) {
  constexpr int kN = kMaxGrid / 32;
  const int G = static_cast<int>(gridDim.x);
  uint64_t w[kN];
  auto load = [&] {
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int bb = lane + 32 * k;
      w[k] = bb < G ? ll_ld(v + static_cast<size_t>(bb) * stride) : ll_word(0u, flag);
    }
  };
  auto ok = [&] {
    bool all = true;
#pragma unroll
    for (int k = 0; k < kN; ++k) all = all && ll_ok(w[k], flag);
    return all;
  };
  load();
  while (!ok()) __nanosleep(sleep_ns), load();
  float s = __uint_as_float(ll_data(w[0]));
#pragma unroll
  for (int k = 1; k < kN; ++k) s += __uint_as_float(ll_data(w[k]));
  return s;
}

/// The block's own residual rows res_s [M, hbmax] (rows [0, HB)) -> hid (LL), and their sum of squares -> ssp[b, m]
/// (LL; warp m sums lane strides in order, then a warp sum). Call after a cbar that follows res_s's writes.
__device__ __forceinline__ void publish_residual(const KP& p, const float* res_s, int h0, int HB, uint32_t flag, int tid) {
  for (int e = tid; e < p.M * HB; e += kConsumers) {
    const int m = e / HB, r = e % HB;
    ll_st(p.hid + static_cast<size_t>(m) * p.H + h0 + r, __float_as_uint(res_s[m * p.hbmax + r]), flag);
  }
  const int lane = tid & 31, warp = tid >> 5;
  if (warp < p.M) {
    float s = 0.0f;
    for (int r = lane; r < HB; r += 32) s = fmaf(res_s[warp * p.hbmax + r], res_s[warp * p.hbmax + r], s);
    s = warp_sum(s);
    if (lane == 0) ll_st(p.ssp + blockIdx.x * p.M + warp, __float_as_uint(s), flag);
  }
}

template <class TS, int MT, bool kTimed>
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
  // The launch generation (set by the previous launch's last block), in shared memory: not a live register.
  __shared__ unsigned gen_s;
  if (tid == 0) {
    gen_s = *reinterpret_cast<volatile unsigned*>(p.ctl);
    *reinterpret_cast<int*>(smem + p.o_inv + 2 * kDataflowMaxRows * 4) = 0;
  }
  __syncthreads();
  auto flag = [&](int l, int k) { return ll_flag(*reinterpret_cast<volatile unsigned*>(&gen_s), p.wrap_log2, l, k); };
  if (warp == kConsumerWarps) {
    if (lane == 0) produce(p, pt, full, empty, ring);
    return;
  }
  auto* inv = reinterpret_cast<float*>(smem + p.o_inv);  // [2, kDataflowMaxRows] 1 / rms, by layer parity
  auto* inv_ready = reinterpret_cast<volatile int*>(smem + p.o_inv + 2 * kDataflowMaxRows * 4);  // layers done
  if (warp == kConsumerWarps + 1) {
    // The exchange warp, layer after layer: 1 / rms of the layer's input rows from the blocks' sums of squares
    // (into shared memory for the consumers), then this block's share of the x_proj reduce-scatter.
    const int E = M * XD, e0 = static_cast<int>(static_cast<long long>(b) * E / G),
              e1 = static_cast<int>(static_cast<long long>(b + 1) * E / G);
    for (int l = 0; l < p.L; ++l) {
      for (int m = 0; m < M; ++m) {
        const float ss = warp_sum(ll_sum_over_blocks(p.ssp + m, M, flag(l - 1, 3), kExchangePollNs, lane));
        if (lane == 0) inv[(l & 1) * kDataflowMaxRows + m] = 1.0f / sqrtf(ss / static_cast<float>(H) + p.eps);
      }
      __syncwarp();
      if (lane == 0) __threadfence_block(), *inv_ready = l + 1;
      const uint32_t f0 = flag(l, 0), f1 = flag(l, 1);
      for (int e = e0; e < e1; ++e) {
        const float s = warp_sum(ll_sum_over_blocks(p.part + e, E, f0, kExchangePollNs, lane));
        if (lane == 0) ll_st(p.fin + e, __float_as_uint(s), f1);
      }
    }
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
  auto* As = reinterpret_cast<float*>(smem + p.o_A);               // [cbmax, N]
  auto* cws = reinterpret_cast<float*>(smem + p.o_cw);             // [cbmax, W]
  auto* cbs = reinterpret_cast<float*>(smem + p.o_cb);             // [cbmax]
  auto* dtbs = reinterpret_cast<float*>(smem + p.o_dtb);           // [cbmax]
  auto* Ds = reinterpret_cast<float*>(smem + p.o_D);               // [cbmax]
  auto* cst = reinterpret_cast<TS*>(smem + p.o_cst);               // [M, W - 1, cbmax]
  auto* sst = reinterpret_cast<TS*>(smem + p.o_sst);               // [M, cbmax, N]
  // Benchmarks (kTimed): every block's %globaltimer at kTimePoints points of every layer; p.timing is a kernel
  // parameter and l, b are live anyway, so a point costs no register.
  auto mark = [&](int l, int k) {
    if constexpr (kTimed)
      if (tid == 0) p.timing[(static_cast<size_t>(l) * G + b) * kTimePoints + k] = now_ns();
  };
  const int S = Wd - 1;

  // Layer 0's residual is the input: the block's rows and their sum of squares, published as exchange (-1, 3).
  for (int e = tid; e < M * HB; e += kConsumers) {
    const int m = e / HB, r = e % HB;
    res_s[m * p.hbmax + r] = __ldcg(p.hidden + static_cast<size_t>(m) * H + h0 + r);
  }
  cbar();
  publish_residual(p, res_s, h0, HB, flag(-1, 3), tid);

  for (int l = 0; l < p.L; ++l) {
    mark(l, 0);
    const Mamba1DecodeLayer& Lw = p.layers[l].w;
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

    // B. After the previous layer's exchange 3 (every block's residual rows, LL words) and the exchange warp's
    //    1 / rms of every row: xn = bf16(rms norm).
    {
      const uint32_t fr = flag(l - 1, 3);
      const float* iv_l = inv + (l & 1) * kDataflowMaxRows;
      constexpr int kV = 2;  // groups of 4 values (two 16-byte loads) in flight per thread per pass
      const int n4 = M * H / 4;
      for (int base = 0; base < n4; base += kV * kConsumers) {
        uint64_t w4[kV][4];
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const int q = base + j * kConsumers + tid;
          if (q < n4) ll_ld2(p.hid + 4 * q, w4[j][0], w4[j][1]), ll_ld2(p.hid + 4 * q + 2, w4[j][2], w4[j][3]);
        }
        if (base == 0) {
          while (*inv_ready <= l) {
          }
          __threadfence_block();
        }
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const int q = base + j * kConsumers + tid;
          if (q < n4) {
            ll_wait2(p.hid + 4 * q, w4[j][0], w4[j][1], fr, p.poll_ns);
            ll_wait2(p.hid + 4 * q + 2, w4[j][2], w4[j][3], fr, p.poll_ns);
            const float4 v = make_float4(__uint_as_float(ll_data(w4[j][0])), __uint_as_float(ll_data(w4[j][1])),
                                         __uint_as_float(ll_data(w4[j][2])), __uint_as_float(ll_data(w4[j][3])));
            const int m = (q * 4) / H, h = (q * 4) % H;
            const float iv = iv_l[m];
            const float4 nw = *reinterpret_cast<const float4*>(Lw.norm + h);
            __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * iv * nw.x, v.y * iv * nw.y);
            __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * iv * nw.z, v.w * iv * nw.w);
            __nv_bfloat16* row = act + static_cast<size_t>(m) * H;  // act_pos order (h % 4 == 0)
            *reinterpret_cast<__nv_bfloat162*>(row + act_pos(h)) = lo;
            *reinterpret_cast<__nv_bfloat162*>(row + act_pos(h + 2)) = hi;
            if (h + 3 >= h0 && h < h0 + HB) {
              const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
              for (int i = 0; i < 4; ++i)
                if (h + i >= h0 && h + i < h0 + HB) res_s[m * p.hbmax + h + i - h0] = vv[i];
            }
          }
        }
      }
      cbar();
    }
    mark(l, 1);

    // C. x rows of in_proj (own channels).
    gemv<MT>(rg, p, CB, H, act, rp, xo, p.cbmax, p.groups, tid);
    mark(l, 2);

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
    mark(l, 3);

    // E. x_proj partial sums over the own channels (bf16 u, as the op chain's x_proj input) -> part[b] (exchange 0).
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
      const uint32_t f0 = flag(l, 0);
      for (int e = tid; e < E; e += kConsumers)
        ll_st(p.part + static_cast<size_t>(b) * E + e,
              __float_as_uint((xq[e] + xq[E + e]) + (xq[2 * E + e] + xq[3 * E + e])), f0);
      mark(l, 4);
    }
    // The shifted conv windows back to the state pool (own channels; read again only by the next launch).
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

    // F. z rows of in_proj (own channels), while the other blocks' partials arrive.
    gemv<MT>(rg, p, CB, H, act, rp, zo, p.cbmax, p.groups, tid);
    mark(l, 5);

    // G. All of xdbl from fin (exchange 1: the blocks' reduce-scatter warps sum each element over the blocks'
    //    partials in block order as they arrive, while the consumers stream the z rows).
    {
      const int E = M * XD;
      const uint32_t f1 = flag(l, 1);
      ll_gather(p.fin, E, f1, p.poll_ns, tid, [&](int e, uint32_t d) {
        const float v = __uint_as_float(d);
        xd[e] = v;
        const int m = e / XD, j = e % XD;
        if (j < R) db[m * R + j] = __float2bfloat16_rn(v);
      });
      cbar();
    }
    mark(l, 6);

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
    mark(l, 7);

    // I. Selective state update of the own channels, y = (Σ state C + D u) SiLU(z) -> y (exchange 2: bf16 pairs in
    //    out_proj's operand order); states back.
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
          xo[m * p.cbmax + c] = yv;  // xo (the x rows) is free after the conv
        }
      }
      cbar();
      const uint32_t f2 = flag(l, 2);
      for (int e = tid; e < M * CB / 2; e += kConsumers) {  // channel pairs (c0 and c1 are even)
        const int m = e / (CB / 2), c = 2 * (e % (CB / 2));
        const __nv_bfloat162 v2 = __floats2bfloat162_rn(xo[m * p.cbmax + c], xo[m * p.cbmax + c + 1]);
        ll_st(p.y + (static_cast<size_t>(m) * I + act_pos(c0 + c)) / 2, *reinterpret_cast<const uint32_t*>(&v2), f2);
      }
      mark(l, 8);
      if (CB > 0) {  // the updated states back to the pool (as the conv windows)
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
    {
      auto* act32 = reinterpret_cast<uint32_t*>(act);
      ll_gather(p.y, M * I / 2, flag(l, 2), p.poll_ns, tid, [&](int i, uint32_t d) { act32[i] = d; });
      cbar();
    }

    // K. out_proj rows h0..h1: the next layer's residual rows and their sum of squares (exchange 3), or `out`.
    mark(l, 9);
    gemv<MT>(rg, p, HB, I, act, rp, os, p.hbmax, p.groups_out, tid);
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
    mark(l, 10);
    if (!last) {
      cbar();
      publish_residual(p, res_s, h0, HB, flag(l, 3), tid);
    }
    mark(l, 11);
  }
  // The last block past its last read starts the next generation (new flags for the next launch); when the flags'
  // generation bits wrap, it first zeroes every LL word so that no word left from 2^wrap_log2 launches ago passes.
  __shared__ int is_last;
  cbar();
  if (tid == 0) {
    __threadfence();
    is_last = atomicAdd(p.ctl + 1, 1u) == static_cast<unsigned>(G - 1);
  }
  cbar();
  if (is_last) {
    const unsigned next = gen_s + 1;
    if ((next & ((1u << p.wrap_log2) - 1u)) == 0)
      for (size_t i = tid; i < p.ll_words; i += kConsumers) p.ll_all[i] = 0;
    cbar();
    if (tid == 0) {
      __threadfence();
      atomicExch(p.ctl + 1, 0u);
      atomicExch(p.ctl, next);
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
  L.o_inv = o, o += up(2 * kDataflowMaxRows * 4 + 4);  // 1 / rms by layer parity, then the layers done
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

constexpr size_t kCtlBytes = 256;  // the launch generation and the done counter

/// The workspace's LL regions (bytes from its start): part [G, 8, XD], fin [8, XD], y [8, I / 2], hid [8, H],
/// ssp [G, 8] words, each 256-byte aligned, after the control words.
struct WsLayout {
  size_t part, fin, y, hid, ssp, end;
};
WsLayout ws_layout(const Mamba1DecodeShape& s, size_t G) {
  auto up = [](size_t v) { return (v + 255) & ~size_t{255}; };
  const size_t XD = static_cast<size_t>(s.R + 2 * s.N), M = kDataflowMaxRows, w = sizeof(uint64_t);
  WsLayout L{};
  size_t o = kCtlBytes;
  L.part = o, o += up(G * M * XD * w);
  L.fin = o, o += up(M * XD * w);
  L.y = o, o += up(M * static_cast<size_t>(s.I) / 2 * w);
  L.hid = o, o += up(M * static_cast<size_t>(s.H) * w);
  L.ssp = o, o += up(G * M * w);
  L.end = o;
  return L;
}

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

size_t mamba1_dataflow_workspace(const Mamba1DecodeShape& s, int /*num_layers*/) {
  return ws_layout(s, static_cast<size_t>(std::max(sm_count(), 1))).end;
}

cudaError_t mamba1_dataflow_decode(const Mamba1DecodeShape& s, const Mamba1DataflowLayer* layers_host,
                                   const Mamba1DataflowLayer* layers_dev, int num_layers, int M,
                                   const Mamba1DataflowBuffers& buf, const Mamba1DataflowOptions& opt,
                                   cudaStream_t stream) {
  auto a16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  if (num_layers < 1 || num_layers > kDataflowMaxLayers || !layers_host || !layers_dev || !buf.hidden || !buf.out || !buf.state_indices ||
      !buf.workspace || buf.workspace_bytes < mamba1_dataflow_workspace(s, num_layers) || !a16(buf.hidden) ||
      !a16(buf.workspace))  // the workspace's LL words are read in 16-byte pairs
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
  // A group count must divide the consumer warps (else some warps would idle in every GEMV): 1, 2 or 5.
  auto groups = [](int g) { return g >= 2 && g <= kConsumerWarps / 2 && kConsumerWarps % g == 0 ? g : 1; };
  p.groups = groups(opt.slot_groups), p.groups_out = groups(opt.slot_groups_out);
  p.wrap_log2 = std::clamp(opt.flag_wrap_log2, 1, 20);
  p.poll_ns = std::clamp(opt.poll_ns, 0, 1 << 20);
  auto* ws = static_cast<unsigned char*>(buf.workspace);
  const WsLayout W = ws_layout(s, static_cast<size_t>(G));
  p.ctl = reinterpret_cast<unsigned*>(ws);
  p.part = reinterpret_cast<uint64_t*>(ws + W.part), p.fin = reinterpret_cast<uint64_t*>(ws + W.fin);
  p.y = reinterpret_cast<uint64_t*>(ws + W.y), p.hid = reinterpret_cast<uint64_t*>(ws + W.hid);
  p.ssp = reinterpret_cast<uint64_t*>(ws + W.ssp);
  p.ll_all = p.part, p.ll_words = (W.end - W.part) / sizeof(uint64_t);
  auto off = [](size_t v) { return static_cast<int>(v); };
  p.o_bar = off(L.o_bar), p.o_act = off(L.o_act), p.o_xo = off(L.o_xo), p.o_zo = off(L.o_zo), p.o_u = off(L.o_u);
  p.o_rp = off(L.o_rp), p.o_xp = off(L.o_xp), p.o_xd = off(L.o_xd), p.o_db = off(L.o_db), p.o_dt = off(L.o_dt);
  p.o_res = off(L.o_res), p.o_os = off(L.o_os), p.o_inv = off(L.o_inv), p.o_A = off(L.o_A), p.o_cw = off(L.o_cw);
  p.o_cb = off(L.o_cb), p.o_dtb = off(L.o_dtb), p.o_D = off(L.o_D), p.o_cst = off(L.o_cst), p.o_sst = off(L.o_sst);
  p.o_ring = off(L.o_ring);
  auto go = [&](auto kernel) { return cooperative_launch_per_sm(kernel, kThreads, L.smem, stream, p); };
  auto by_m = [&](auto ts) -> cudaError_t {
    using TS = decltype(ts);
    if (p.timing) {
      if (M <= 1) return go(dataflow_kernel<TS, 1, true>);
      if (M <= 2) return go(dataflow_kernel<TS, 2, true>);
      if (M <= 4) return go(dataflow_kernel<TS, 4, true>);
      return go(dataflow_kernel<TS, 8, true>);
    }
    if (M <= 1) return go(dataflow_kernel<TS, 1, false>);
    if (M <= 2) return go(dataflow_kernel<TS, 2, false>);
    if (M <= 4) return go(dataflow_kernel<TS, 4, false>);
    return go(dataflow_kernel<TS, 8, false>);
  };
  if (sd == DType::BF16) return by_m(__nv_bfloat16{});
  return by_m(float{});
}

}  // namespace ssmserve::cuda
