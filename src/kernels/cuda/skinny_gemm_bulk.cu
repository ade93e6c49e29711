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

namespace ssmserve::cuda::detail {
namespace {

constexpr int kMaxStages = 6;
// Shared memory for the x rows and the ring: at most 200 KB, so that one block fits next to a small predecessor
// kernel on the same SM (the producer's first copies are issued while the predecessor still runs, under PDL).
constexpr size_t kSmemBudget = 200u * 1024;
constexpr int kBarrierBytes = 128;  // full[kMaxStages], empty[kMaxStages], x: 8 bytes each, rounded up

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

/// Row pitch (bytes) of a stage: the item's k range (cta_splits * cps chunks of 64 bytes), plus 64 bytes when that
/// is a multiple of 128, so rows 2i and 2i + 1 (one 8-lane phase of a 16-byte load) hit disjoint banks.
__host__ __device__ inline int row_pitch(int cta_splits, int cps) {
  const int b = cta_splits * cps * 64;
  return b % 128 == 0 ? b + 64 : b;
}

/// Row pitch (bytes) of the x rows in shared memory (K bf16, padded like row_pitch).
__host__ __device__ inline int x_pitch(int K) {
  const int b = K * 2;
  return b % 128 == 0 ? b + 64 : b;
}

/// Ring stages that fit next to the M x rows (0 when fewer than two would).
__host__ __device__ inline int ring_stages(int M, int K, int cta_splits, int cps) {
  const size_t x = static_cast<size_t>(M) * x_pitch(K), stage = 16u * static_cast<size_t>(row_pitch(cta_splits, cps));
  if (kBarrierBytes + x + 2 * stage > kSmemBudget) return 0;
  const size_t n = (kSmemBudget - kBarrierBytes - x) / stage;
  return static_cast<int>(n < kMaxStages ? n : kMaxStages);
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

/// Producer (one warp): copies item `item`'s 16 row segments into the stage, completing on bar.
__device__ __forceinline__ void issue_item(const BulkParams& p, int item, uint32_t stage, int pitch, uint32_t bar,
                                           int lane) {
  const Item it = item_of(p, item);
  const int n0 = it.tile * 16, rows = min(16, p.N - n0);
  const int k0 = it.clo * 32, k1 = min(p.K, it.chi * 32);
  const unsigned bytes = k1 > k0 ? static_cast<unsigned>(k1 - k0) * 2 : 0u;
  if (lane == 0) mbar_expect_tx(bar, bytes * rows);
  __syncwarp();
  if (bytes > 0 && lane < rows)
    bulk_copy(stage + lane * pitch, static_cast<const __nv_bfloat16*>(p.w) + static_cast<int64_t>(n0 + lane) * p.ws + k0,
              bytes, bar);
}

/// Loads of chunk i of splits s0 .. s0 + SB - 1 of the item (W fragments from the stage, x from global / L1); `on`
/// false past a split's chunks (no mma then, as in skinny_kernel's loop).
template <int SB>
__device__ __forceinline__ void load_step(const BulkParams& p, const Item& it, const unsigned char* r0,
                                          const unsigned char* r1, const unsigned char* xr, bool xok, int s0, int i,
                                          int t, uint4 (&a0)[SB], uint4 (&a1)[SB], uint4 (&b)[SB], bool (&on)[SB]) {
#pragma unroll
  for (int s = 0; s < SB; ++s) {
    const int c = it.clo + (s0 + s) * p.cps + i;
    on[s] = i < p.cps && c < it.chi;
    const int k = c * 32 + 8 * t;
    const bool kin = on[s] && k < p.K;
    const int off = (c - it.clo) * 64;
    a0[s] = kin ? *reinterpret_cast<const uint4*>(r0 + off) : make_uint4(0, 0, 0, 0);
    a1[s] = kin ? *reinterpret_cast<const uint4*>(r1 + off) : make_uint4(0, 0, 0, 0);
    b[s] = xok && on[s] && k < p.K ? *reinterpret_cast<const uint4*>(xr + off) : make_uint4(0, 0, 0, 0);
  }
}

/// Consumer (one warp): item `item` from its stage; writes y (and y2) or, for groups > 1, the group sum (the last
/// block of the tile to arrive adds them in group order and writes y).
template <int CTA>
__device__ __forceinline__ void consume_item(const BulkParams& p, int item, const unsigned char* stage, int pitch,
                                             const unsigned char* xs, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const Item it = item_of(p, item);
  const bool xok = g < p.M;
  // x row g at the item's k range (xr + off addresses the same k as the W fragments).
  const unsigned char* xr = xs + (xok ? g : 0) * x_pitch(p.K) + it.clo * 64 + 16 * t;
  const unsigned char* r0 = stage + g * pitch + 16 * t;
  const unsigned char* r1 = r0 + 8 * pitch;
  float acc[CTA][4];
#pragma unroll
  for (int s = 0; s < CTA; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
  // SB splits at a time, chunk by chunk (independent chains, so their loads and mma steps interleave); the next
  // chunk's loads are issued before this chunk's mma steps. Each split still sums its chunks in increasing order.
  constexpr int SB = CTA < 4 ? CTA : 4;
#pragma unroll
  for (int s0 = 0; s0 < CTA; s0 += SB) {
    uint4 a0[SB], a1[SB], b[SB];
    bool on[SB];
    load_step<SB>(p, it, r0, r1, xr, xok, s0, 0, t, a0, a1, b, on);
    for (int i = 0; i < p.cps; ++i) {
      uint4 na0[SB], na1[SB], nb[SB];
      bool non[SB];
      load_step<SB>(p, it, r0, r1, xr, xok, s0, i + 1, t, na0, na1, nb, non);
#pragma unroll
      for (int s = 0; s < SB; ++s)
        if (on[s]) mma_chunk(acc[s0 + s], a0[s], a1[s], b[s]);
#pragma unroll
      for (int s = 0; s < SB; ++s) a0[s] = na0[s], a1[s] = na1[s], b[s] = nb[s], on[s] = non[s];
    }
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

/// Block = warp 0 (producer) + nst consumer warps; consumer warp w owns ring stage w - 1 and the block's items
/// w - 1, w - 1 + nst, ... (item j of the block = blockIdx.x + j * gridDim.x). Shared memory: the mbarriers, the
/// M x rows (copied after the PDL wait), the ring.
template <int CTA>
__global__ void __launch_bounds__((kMaxStages + 1) * 32, 1) skinny_bulk_kernel(BulkParams p, int nst, int pitch) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t base = smem_addr(smem);
  const uint32_t full0 = base, empty0 = base + 8 * kMaxStages, xbar = base + 16 * kMaxStages;
  const int xp = x_pitch(p.K);
  unsigned char* xs = smem + kBarrierBytes;
  unsigned char* ring = xs + p.M * xp;
  const int stage_bytes = 16 * pitch;
  const int items = p.tiles * p.groups;
  if (threadIdx.x == 0) {
    for (int s = 0; s < nst; ++s) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, 1);
    mbar_init(xbar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
    // Producer: the weights depend on no earlier kernel, so the first ring's copies go out before the PDL wait;
    // x (the previous kernel's output) right after it; then the refills as the consumers free their stages.
    for (int j = 0; j < nst; ++j) {
      const int item = blockIdx.x + j * gridDim.x;
      if (item >= items) break;
      issue_item(p, item, smem_addr(ring + j * stage_bytes), pitch, full0 + 8 * j, lane);
    }
    pdl_wait();
    pdl_launch_dependents();
    const unsigned xrow = static_cast<unsigned>(p.K) * 2;
    if (lane == 0) mbar_expect_tx(xbar, xrow * p.M);
    __syncwarp();
    if (lane < p.M)
      bulk_copy(smem_addr(xs + lane * xp), static_cast<const __nv_bfloat16*>(p.x) + static_cast<int64_t>(lane) * p.xs,
                xrow, xbar);
    for (int j = nst;; ++j) {
      const int item = blockIdx.x + j * gridDim.x;
      if (item >= items) break;
      const int s = j % nst;
      mbar_wait(empty0 + 8 * s, static_cast<uint32_t>((j / nst - 1) & 1));
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // consumer reads before the next copy
      issue_item(p, item, smem_addr(ring + s * stage_bytes), pitch, full0 + 8 * s, lane);
    }
    return;
  }
  pdl_wait();  // the outputs belong to the stream's order
  pdl_launch_dependents();
  const int s = warp - 1;
  if (s >= nst) return;
  mbar_wait(xbar, 0);
  for (int j = s;; j += nst) {
    const int item = blockIdx.x + j * gridDim.x;
    if (item >= items) break;
    mbar_wait(full0 + 8 * s, static_cast<uint32_t>((j / nst) & 1));
    consume_item<CTA>(p, item, ring + s * stage_bytes, pitch, xs, lane);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
  }
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

template <int CTA>
cudaError_t launch(const BulkParams& p, bool pdl, cudaStream_t stream) {
  const int pitch = row_pitch(p.cta_splits, p.cps);
  const int nst = ring_stages(p.M, p.K, p.cta_splits, p.cps);
  const size_t smem = kBarrierBytes + static_cast<size_t>(p.M) * x_pitch(p.K) + nst * 16u * static_cast<size_t>(pitch);
  auto kernel = skinny_bulk_kernel<CTA>;
  static bool raised = false;  // the kernel's dynamic shared-memory limit raised to the budget (per instantiation)
  if (!raised) {
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(kSmemBudget));
        e != cudaSuccess)
      return e;
    raised = true;
  }
  const int items = p.tiles * p.groups;
  const int grid = std::min(items, num_sms());
  return launch_pdl(pdl, kernel, dim3(grid), dim3((nst + 1) * 32), smem, stream, p, nst, pitch);
}

}  // namespace

size_t skinny_bulk_stage_bytes(int cta_splits, int cps) { return 16u * static_cast<size_t>(row_pitch(cta_splits, cps)); }

bool skinny_bulk_eligible(const BulkParams& p) {
  const auto al16 = [](const void* q, int64_t stride) {
    return reinterpret_cast<uintptr_t>(q) % 16 == 0 && stride % 8 == 0;
  };
  const int c = p.cta_splits;
  return p.M >= 1 && p.M <= 8 && p.K % 8 == 0 && al16(p.x, p.xs) && al16(p.w, p.ws) &&
         (c == 1 || c == 2 || c == 4 || c == 8 || c == 16) && p.cps >= 1 && p.tiles >= 1 && p.groups >= 1 &&
         ring_stages(p.M, p.K, c, p.cps) >= 2 && (p.groups == 1 || (p.partials && p.counters));
}

cudaError_t skinny_bulk_launch(const BulkParams& p, bool pdl, cudaStream_t stream) {
  if (!skinny_bulk_eligible(p)) return cudaErrorInvalidValue;
  switch (p.cta_splits) {
    case 1: return launch<1>(p, pdl, stream);
    case 2: return launch<2>(p, pdl, stream);
    case 4: return launch<4>(p, pdl, stream);
    case 8: return launch<8>(p, pdl, stream);
    default: return launch<16>(p, pdl, stream);
  }
}

}  // namespace ssmserve::cuda::detail
