// Owns the bulk-copy form of the skinny GEMM (see skinny_gemm_bulk.h).
//
// Same arithmetic as skinny_kernel (skinny_gemm.cu) for MT = 1: lane (g = lane / 4, t = lane % 4) of the warp that
// owns an item holds W rows n0 + g / n0 + g + 8 and x row g at k = chunk * 32 + 8 t; each split's chunks go through
// mma_chunk in increasing order from a zero accumulator; the split sums of the group are added in split order,
// the group sums (groups > 1) in group order after the last block of the tile arrives. Only where the W fragments
// come from differs (shared memory filled by the copy engine, not registers), so the bits are skinny_kernel's.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_math.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/skinny_gemm_bulk.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace ssmserve::cuda::detail {
namespace {

constexpr int kMaxStages = 12;
constexpr int kMaxWarps = 8;  // consumer warps
// Shared memory for the x rows and the ring: at most 200 KB, so that one block fits next to a small predecessor
// kernel on the same SM (the producer's first copies are issued while the predecessor still runs, under PDL).
constexpr size_t kSmemMax = 200u * 1024;
constexpr int kBarrierBytes = 256;  // full[kMaxStages], empty[kMaxStages], x: 8 bytes each, rounded up

/// Launch shape (speed only; every shape sums in the same order): shared-memory budget, target stage bytes,
/// consumer warps. SSMSERVE_BULK_SHAPE="budget_kb,stage_kb,warps" (benchmarks) overrides the default.
struct Shape {
  size_t budget = kSmemMax;
  size_t stage_target = 40u * 1024;
  int warps = 4;
};
Shape shape() {
  static const Shape sh = [] {
    Shape v;
    int b = 0, st = 0, w = 0;
    if (const char* e = std::getenv("SSMSERVE_BULK_SHAPE"); e && std::sscanf(e, "%d,%d,%d", &b, &st, &w) == 3) {
      v.budget = std::clamp<size_t>(static_cast<size_t>(b) * 1024, 16 * 1024, kSmemMax);
      v.stage_target = std::clamp<size_t>(static_cast<size_t>(st) * 1024, 1024, kSmemMax);
      v.warps = std::clamp(w, 1, kMaxWarps);
    }
    return v;
  }();
  return sh;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, unsigned bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

/// Row pitch (bytes) of a stage: one part's k range (ps splits of cps chunks of 64 bytes), plus 64 bytes when that
/// is a multiple of 128, so rows 2i and 2i + 1 (one 8-lane phase of a 16-byte load) hit disjoint banks.
__host__ __device__ inline int row_pitch(int ps, int cps) {
  const int b = ps * cps * 64;
  return b % 128 == 0 ? b + 64 : b;
}

/// Row pitch (bytes) of the x rows in shared memory (K bf16, padded like row_pitch).
__host__ __device__ inline int x_pitch(int K) {
  const int b = K * 2;
  return b % 128 == 0 ? b + 64 : b;
}

/// Ring stages of ps-split parts that fit next to the M x rows in `budget` bytes (0 when fewer than two would).
inline int ring_stages(int M, int K, int ps, int cps, size_t budget) {
  const size_t x = static_cast<size_t>(M) * x_pitch(K), stage = 16u * static_cast<size_t>(row_pitch(ps, cps));
  if (kBarrierBytes + x + 2 * stage > budget) return 0;
  const size_t n = (budget - kBarrierBytes - x) / stage;
  return static_cast<int>(n < kMaxStages ? n : kMaxStages);
}

/// Splits per part: the largest divisor of cta_splits whose stage is at most `target` bytes (at least 1).
inline int part_splits(int cta_splits, int cps, size_t target) {
  int ps = cta_splits;
  while (ps > 1 && 16u * static_cast<size_t>(row_pitch(ps, cps)) > target) ps /= 2;
  return ps;
}

/// Item `item` = (tile, group): chunk range [clo, chi) of the split group; k range [clo * 32, min(K, chi * 32)).
struct Item {
  int tile, group, clo, chi;
};
__device__ __forceinline__ Item item_of(const BulkParams& p, int item) {
  Item it;
  it.tile = item / p.groups, it.group = item % p.groups;
  it.clo = min(p.chunks, it.group * p.cta_splits * p.cps);
  it.chi = min(p.chunks, it.clo + p.cta_splits * p.cps);
  return it;
}

/// Geometry of a launch: ps splits per part (stage), P parts per item, nst ring stages, nw consumer warps.
struct Geom {
  int ps, parts, nst, nw, depth, pitch;  // depth = nst / nw: stages of each consumer warp's own sub-ring
};

/// Producer (one warp): copies part `part` of item `item` (16 row segments) into the stage, completing on bar.
__device__ __forceinline__ void issue_part(const BulkParams& p, const Geom& gm, int item, int part, uint32_t stage,
                                           uint32_t bar, int lane) {
  const Item it = item_of(p, item);
  const int n0 = it.tile * 16, rows = min(16, p.N - n0);
  const int c0 = min(it.chi, it.clo + part * gm.ps * p.cps), c1 = min(it.chi, c0 + gm.ps * p.cps);
  const int k0 = c0 * 32, k1 = min(p.K, c1 * 32);
  const unsigned bytes = k1 > k0 ? static_cast<unsigned>(k1 - k0) * 2 : 0u;
  if (lane == 0) mbar_expect_tx(bar, bytes * rows);
  __syncwarp();
  if (bytes > 0 && lane < rows)
    bulk_copy(stage + lane * gm.pitch,
              static_cast<const __nv_bfloat16*>(p.w) + static_cast<int64_t>(n0 + lane) * p.ws + k0, bytes, bar);
}

/// Loads of chunk i of splits s0 .. s0 + SB - 1 (those in [s_beg, s_end), the part's) of the item: W fragments from the part's stage
/// (chunk offsets from chunk `pc0`), x from the block's x rows (offsets from the item's first chunk). `on` false
/// past a split's chunks (no mma then, as in skinny_kernel's loop).
template <int SB>
__device__ __forceinline__ void load_step(const BulkParams& p, const Item& it, const unsigned char* r0,
                                          const unsigned char* r1, const unsigned char* xr, bool xok, int pc0,
                                          int s0, int s_beg, int s_end, int i, int t, uint4 (&a0)[SB], uint4 (&a1)[SB],
                                          uint4 (&b)[SB], bool (&on)[SB]) {
#pragma unroll
  for (int s = 0; s < SB; ++s) {
    const int c = it.clo + (s0 + s) * p.cps + i;
    on[s] = s0 + s >= s_beg && s0 + s < s_end && i < p.cps && c < it.chi;
    const bool kin = on[s] && c * 32 + 8 * t < p.K;
    a0[s] = kin ? *reinterpret_cast<const uint4*>(r0 + (c - pc0) * 64) : make_uint4(0, 0, 0, 0);
    a1[s] = kin ? *reinterpret_cast<const uint4*>(r1 + (c - pc0) * 64) : make_uint4(0, 0, 0, 0);
    b[s] = kin && xok ? *reinterpret_cast<const uint4*>(xr + (c - it.clo) * 64) : make_uint4(0, 0, 0, 0);
  }
}

/// Consumer (one warp): item `item` (local index j of the block), part by part from the ring; writes y (and y2)
/// or, for groups > 1, the group sum (the last block of the tile to arrive adds them in group order, writes y).
template <int CTA>
__device__ __forceinline__ void consume_item(const BulkParams& p, const Geom& gm, int item, int j,
                                             const unsigned char* ring, const unsigned char* xs, uint32_t full0,
                                             uint32_t empty0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const Item it = item_of(p, item);
  const bool xok = g < p.M;
  const unsigned char* xr = xs + (xok ? g : 0) * x_pitch(p.K) + it.clo * 64 + 16 * t;
  float acc[CTA][4];
#pragma unroll
  for (int s = 0; s < CTA; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
  // Part by part; inside a part SB splits at a time, chunk by chunk (independent chains: their loads and mma steps
  // interleave, the next chunk's loads issued before this chunk's mma steps). Each split sums its chunks in
  // increasing order from zero, as skinny_kernel does.
  constexpr int SB = CTA < 4 ? CTA : 4;
  for (int part = 0; part < gm.parts; ++part) {
    // This warp's stage lq lives in slot w * depth + lq % depth of its own sub-ring.
    const int lq = (j / gm.nw) * gm.parts + part, slot = (j % gm.nw) * gm.depth + lq % gm.depth;
    mbar_wait(full0 + 8 * slot, static_cast<uint32_t>((lq / gm.depth) & 1));
    const unsigned char* r0 = ring + static_cast<size_t>(slot) * 16 * gm.pitch + g * gm.pitch + 16 * t;
    const unsigned char* r1 = r0 + 8 * gm.pitch;
    const int pc0 = it.clo + part * gm.ps * p.cps;
#pragma unroll
    for (int s0 = 0; s0 < CTA; s0 += SB) {
      if (s0 + SB <= part * gm.ps || s0 >= (part + 1) * gm.ps) continue;  // no split of this part
      const int s_beg = part * gm.ps, s_end = s_beg + gm.ps;
      uint4 a0[SB], a1[SB], b[SB];
      bool on[SB];
      load_step<SB>(p, it, r0, r1, xr, xok, pc0, s0, s_beg, s_end, 0, t, a0, a1, b, on);
      for (int i = 0; i < p.cps; ++i) {
        uint4 na0[SB], na1[SB], nb[SB];
        bool non[SB];
        load_step<SB>(p, it, r0, r1, xr, xok, pc0, s0, s_beg, s_end, i + 1, t, na0, na1, nb, non);
#pragma unroll
        for (int s = 0; s < SB; ++s)
          if (on[s]) mma_chunk(acc[s0 + s], a0[s], a1[s], b[s]);
#pragma unroll
        for (int s = 0; s < SB; ++s)
          a0[s] = na0[s], a1[s] = na1[s], b[s] = nb[s], on[s] = non[s];
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * slot);
  }
#pragma unroll
  for (int s = 1; s < CTA; ++s)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[0][q] += acc[s][q];
  float* a = acc[0];
  if (p.groups > 1) {
    float* mine = p.partials + (static_cast<int64_t>(it.tile) * p.groups + it.group) * (4 * 32);
#pragma unroll
    for (int q = 0; q < 4; ++q) mine[q * 32 + lane] = a[q];
    __threadfence();
    __syncwarp();
    unsigned prev = 0;
    if (lane == 0) prev = atomicAdd(p.counters + it.tile, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != static_cast<unsigned>(p.groups - 1)) return;
    __threadfence();
    const float* all = p.partials + static_cast<int64_t>(it.tile) * p.groups * (4 * 32);
#pragma unroll
    for (int q = 0; q < 4; ++q) a[q] = __ldcg(all + q * 32 + lane);
    for (int gi = 1; gi < p.groups; ++gi)
#pragma unroll
      for (int q = 0; q < 4; ++q) a[q] += __ldcg(all + (gi * 4 + q) * 32 + lane);
    if (lane == 0) p.counters[it.tile] = 0;  // ready for the next launch
  }
  // a[2h + e] is y[2t + e, n0 + g + 8h].
  const int n0 = it.tile * 16;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int m = 2 * t + e, n = n0 + g + 8 * h;
      if (m >= p.M || n >= p.N) continue;
      const float v = a[2 * h + e];
      if (p.y_bf16) static_cast<__nv_bfloat16*>(p.y)[static_cast<int64_t>(m) * p.ys + n] = __float2bfloat16_rn(v);
      else static_cast<float*>(p.y)[static_cast<int64_t>(m) * p.ys + n] = v;
      if (p.y2) static_cast<__nv_bfloat16*>(p.y2)[static_cast<int64_t>(m) * p.y2s + n] = __float2bfloat16_rn(v);
    }
}

/// Block = warp 0 (producer) + gm.nw consumer warps. The block's items are blockIdx.x + j * gridDim.x; consumer
/// warp w takes the items with j % nw == w and owns a sub-ring of `depth` slots (its stage lq = its item count x
/// parts + part in slot w * depth + lq % depth: one consumer per slot, so a slot's barrier is never more than one
/// phase behind its waiter). The producer fills the warps' stages round-robin (lq-major). Shared memory: the
/// mbarriers, the M x rows (copied after the PDL wait), the ring.
template <int CTA>
__global__ void __launch_bounds__((kMaxWarps + 1) * 32, 1) skinny_bulk_kernel(BulkParams p, Geom gm) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t base = smem_addr(smem);
  const uint32_t full0 = base, empty0 = base + 8 * kMaxStages, xbar = base + 16 * kMaxStages;
  unsigned char* xs = smem + kBarrierBytes;
  unsigned char* ring = xs + p.M * x_pitch(p.K);
  const int stage_bytes = 16 * gm.pitch;
  const int items = p.tiles * p.groups;
  const int my_items = blockIdx.x < items ? (items - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < gm.nst; ++s) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, 1);
    mbar_init(xbar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
    // Producer: the weights depend on no earlier kernel, so each warp's first `depth` stages go out before the PDL
    // wait; x (the previous kernel's output) right after it; then the refills as the consumers free their slots.
    const int rounds = ((my_items + gm.nw - 1) / gm.nw) * gm.parts;  // stages of the busiest warp
    for (int lq = 0; lq < rounds; ++lq) {
      if (lq == gm.depth) {
        pdl_wait();
        pdl_launch_dependents();
        const unsigned xrow = static_cast<unsigned>(p.K) * 2;
        if (lane == 0) mbar_expect_tx(xbar, xrow * p.M);
        __syncwarp();
        if (lane < p.M)
          bulk_copy(smem_addr(xs + lane * x_pitch(p.K)),
                    static_cast<const __nv_bfloat16*>(p.x) + static_cast<int64_t>(lane) * p.xs, xrow, xbar);
      }
      for (int w = 0; w < gm.nw; ++w) {
        const int j = w + (lq / gm.parts) * gm.nw;
        if (j >= my_items) break;
        const int slot = w * gm.depth + lq % gm.depth;
        if (lq >= gm.depth) {
          mbar_wait(empty0 + 8 * slot, static_cast<uint32_t>((lq / gm.depth - 1) & 1));
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // consumer reads before the next copy
        }
        issue_part(p, gm, blockIdx.x + j * gridDim.x, lq % gm.parts, smem_addr(ring + slot * stage_bytes),
                   full0 + 8 * slot, lane);
      }
    }
    if (rounds <= gm.depth) {  // every stage issued before the wait: x still to copy
      pdl_wait();
      pdl_launch_dependents();
      const unsigned xrow = static_cast<unsigned>(p.K) * 2;
      if (lane == 0) mbar_expect_tx(xbar, xrow * p.M);
      __syncwarp();
      if (lane < p.M)
        bulk_copy(smem_addr(xs + lane * x_pitch(p.K)),
                  static_cast<const __nv_bfloat16*>(p.x) + static_cast<int64_t>(lane) * p.xs, xrow, xbar);
    }
    return;
  }
  pdl_wait();  // the outputs belong to the stream's order
  pdl_launch_dependents();
  const int w = warp - 1;
  if (w >= gm.nw) return;
  mbar_wait(xbar, 0);
  for (int j = w; j < my_items; j += gm.nw)
    consume_item<CTA>(p, gm, blockIdx.x + j * gridDim.x, j, ring, xs, full0, empty0, lane);
}

int num_sms() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return v > 0 ? v : 132;
  }();
  return n;
}

/// The launch geometry for p under the current shape (nst == 0: the bulk form does not fit).
Geom geom_of(const BulkParams& p) {
  const Shape sh = shape();
  Geom gm{};
  gm.ps = part_splits(p.cta_splits, p.cps, sh.stage_target);
  gm.parts = p.cta_splits / gm.ps;
  gm.pitch = row_pitch(gm.ps, p.cps);
  gm.nst = ring_stages(p.M, p.K, gm.ps, p.cps, sh.budget);
  gm.nw = std::min(sh.warps, std::max(1, gm.nst));
  gm.depth = gm.nst / gm.nw;
  gm.nst = gm.depth * gm.nw;  // whole sub-rings
  return gm;
}

template <int CTA>
cudaError_t launch(const BulkParams& p, const Geom& gm, bool pdl, cudaStream_t stream) {
  const size_t smem = kBarrierBytes + static_cast<size_t>(p.M) * x_pitch(p.K) + gm.nst * 16u * static_cast<size_t>(gm.pitch);
  auto kernel = skinny_bulk_kernel<CTA>;
  static bool raised = false;  // the kernel's dynamic shared-memory limit raised to the maximum (per instantiation)
  if (!raised) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kSmemMax));
        e != cudaSuccess)
      return e;
    raised = true;
  }
  const int items = p.tiles * p.groups;
  const int grid = std::min(items, num_sms());
  return launch_pdl(pdl, kernel, dim3(grid), dim3((gm.nw + 1) * 32), smem, stream, p, gm);
}

}  // namespace


bool skinny_bulk_eligible(const BulkParams& p) {
  const auto al16 = [](const void* q, int64_t stride) {
    return reinterpret_cast<uintptr_t>(q) % 16 == 0 && stride % 8 == 0;
  };
  const int c = p.cta_splits;
  return p.M >= 1 && p.M <= 8 && p.K % 8 == 0 && al16(p.x, p.xs) && al16(p.w, p.ws) &&
         (c == 1 || c == 2 || c == 4 || c == 8 || c == 16) && p.cps >= 1 && p.tiles >= 1 && p.groups >= 1 &&
         p.M <= 32 && geom_of(p).nst >= 2 && (p.groups == 1 || (p.partials && p.counters));
}

cudaError_t skinny_bulk_launch(const BulkParams& p, bool pdl, cudaStream_t stream) {
  if (!skinny_bulk_eligible(p)) return cudaErrorInvalidValue;
  const Geom gm = geom_of(p);
  switch (p.cta_splits) {
    case 1: return launch<1>(p, gm, pdl, stream);
    case 2: return launch<2>(p, gm, pdl, stream);
    case 4: return launch<4>(p, gm, pdl, stream);
    case 8: return launch<8>(p, gm, pdl, stream);
    default: return launch<16>(p, gm, pdl, stream);
  }
}

}  // namespace ssmserve::cuda::detail
