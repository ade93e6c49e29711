// Owns what the dataflow Mamba-1 decode kernel's parts share (dataflow_decode.h): the block's thread layout
// (consumer warps + one producer warp), the shared-memory ring's limits, the block's work split (Part), the kernel
// parameters (KP), and the consumers' copy, barrier and grid-sync helpers. Included by dataflow_decode.cu only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/dataflow_decode.h"
#include "kernels/cuda/tma_ring.cuh"

namespace ssmserve::cuda::dataflow {
using namespace detail;

constexpr int kConsumerWarps = 12;
constexpr int kConsumers = kConsumerWarps * 32;  // consumer threads; warp kConsumerWarps is the producer
constexpr int kThreads = kConsumers + 32;
constexpr int kMaxSlots = 12;
constexpr int kMinSlots = 3;
constexpr int kSlotTarget = 40960;  // bytes: 8 in_proj rows or 4 out_proj rows of mamba-2.8b
constexpr size_t kSmemLimit = 227 * 1024;
constexpr int kTimePoints = 19;  // 11 phase boundaries, 3 gemv wait sums, y loaded, 2 clock64, conv, x_proj
constexpr int kTraceSlots = 64;  // layer 1's first slots traced after the time points
constexpr int kMaxGrid = 256;  // blocks (SMs) the cross-block sums take

/// Block b's channels [c0, c1) (pairs: 4-byte aligned bf16 state slices) and out_proj rows [h0, h1): every phase
/// between two grid syncs streams about the same bytes on every block (the syncs wait for the slowest).
struct Part {
  int c0, c1, h0, h1;
};

__host__ __device__ inline Part part_of(int b, int G, int H, int I) {
  Part p;
  p.c0 = 2 * static_cast<int>(static_cast<long long>(b) * (I / 2) / G);
  p.c1 = 2 * static_cast<int>(static_cast<long long>(b + 1) * (I / 2) / G);
  p.h0 = static_cast<int>(static_cast<long long>(b) * H / G);
  p.h1 = static_cast<int>(static_cast<long long>(b + 1) * H / G);
  return p;
}

struct KP {
  int H, I, N, R, W, XD, M, L, ns, slot, cbmax, hbmax, maxrows, nseg, lanes;
  float eps;
  const Mamba1DataflowLayer* layers;
  float* hidden;
  float* out;
  const int32_t* si;
  unsigned* sync;  // [0] S0, [1 + 4 l + k] S1, S1b, S2, S3 of layer l, [1 + 4 L] done
  float* part;     // [G, M, XD]
  float* fin;      // [M, XD]
  __nv_bfloat16* y;  // [M, I]
  float* ssp;      // [G, M]
  unsigned long long* timing;
  int debug, inflight;
  // shared memory offsets (bytes)
  int o_bar, o_act, o_xo, o_zo, o_u, o_rp, o_xp, o_xd, o_db, o_dt, o_res, o_os, o_inv, o_A, o_cw, o_cb, o_dtb, o_D,
      o_cst, o_sst, o_ring;
};

// ---- mbarriers, bulk copies, cp.async -------------------------------------------------------------------------
/// bytes (a multiple of 4, both 4-byte aligned) from global to shared with cp.async, spread over the consumer
/// threads: 16-byte pieces when both addresses and the size allow, else 4-byte ones.
__device__ __forceinline__ void cp_bytes(void* dst, const void* src, int bytes, int tid) {
  char* d = static_cast<char*>(dst);
  const char* g = static_cast<const char*>(src);
  if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(g) | static_cast<uintptr_t>(bytes)) & 15) == 0) {
    for (int o = tid * 16; o < bytes; o += kConsumers * 16)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr(d + o)), "l"(g + o) : "memory");
  } else {
    for (int o = tid * 4; o < bytes; o += kConsumers * 4)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(saddr(d + o)), "l"(g + o) : "memory");
  }
}
/// bytes (a multiple of 4, 4-byte aligned) from shared to global, spread over the consumer threads.
__device__ __forceinline__ void st_bytes(void* dst, const void* src, int bytes, int tid) {
  for (int o = tid * 4; o < bytes; o += kConsumers * 4)
    *reinterpret_cast<uint32_t*>(static_cast<char*>(dst) + o) = *reinterpret_cast<const uint32_t*>(static_cast<const char*>(src) + o);
}
__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/// Grid sync halves (consumer threads only): every block adds 1 after its writes; waiters spin until all G have.
__device__ __forceinline__ void arrive(unsigned* c, int tid) {
  cbar();
  if (tid == 0) {
    __threadfence();
    atomicAdd(c, 1u);
  }
}
__device__ __forceinline__ void wait_all(const unsigned* c, int tid) {
  if (tid == 0) {
    while (ld_acquire(c) < gridDim.x) {
    }
    __threadfence();
  }
  cbar();
}

__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
/// acc + Σ_i w[i] x[i] over 8 bf16 pairs, in index order.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  acc = fmaf(bf_lo(w.x), bf_lo(x.x), acc), acc = fmaf(bf_hi(w.x), bf_hi(x.x), acc);
  acc = fmaf(bf_lo(w.y), bf_lo(x.y), acc), acc = fmaf(bf_hi(w.y), bf_hi(x.y), acc);
  acc = fmaf(bf_lo(w.z), bf_lo(x.z), acc), acc = fmaf(bf_hi(w.z), bf_hi(x.z), acc);
  acc = fmaf(bf_lo(w.w), bf_lo(x.w), acc), acc = fmaf(bf_hi(w.w), bf_hi(x.w), acc);
  return acc;
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

/// Rows of x_projᵀ per ring slot: a multiple of 4 (x_proj's four accumulator chains follow the channel index).
__host__ __device__ inline int xproj_rows_per_slot(int slot, int XD) { return (slot / (2 * XD)) & ~3; }

}  // namespace ssmserve::cuda::dataflow
