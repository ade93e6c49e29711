// Owns what the dataflow Mamba-1 decode kernel's parts share (dataflow_decode.h): the block's thread layout
// (consumer warps + one producer warp), the shared-memory ring's limits, the block's work split (Part), the kernel
// parameters (KP), the consumers' copy and barrier helpers, and the LL words the blocks exchange values in.
// Included by dataflow_decode.cu only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/dataflow_decode.h"
#include "kernels/cuda/tma_ring.cuh"

namespace ssmserve::cuda::dataflow {
using namespace detail;

// 10 consumer warps: with the producer and exchange warps that is 12 warps, 3 per SM sub-partition, so a thread
// may hold 168 registers (the kernel needs 167, no spills). 12 consumer warps (14 warps, 4 per sub-partition) cap it
// at 128 registers with spills: 27.8 against 26.4-26.6 us per mamba-2.8b layer, 532.4 against 555.3 tokens/s at
// batch 1 on the H200 (docs/benchmarks.md, session 16).
constexpr int kConsumerWarps = 10;
static_assert(kConsumerWarps >= kDataflowMaxRows, "publish_residual: one consumer warp per batch row's sum of squares");
constexpr int kConsumers = kConsumerWarps * 32;  // consumer threads; then the producer warp, the exchange warp
constexpr int kExchangePollNs = 128;  // the exchange warp's pause between reads of words not there yet
constexpr int kThreads = kConsumers + 64;  // + the producer warp and the exchange warp
constexpr int kMaxSlots = 12;
constexpr int kMinSlots = 3;
constexpr int kSlotTarget = 40960;  // bytes: 8 in_proj rows or 4 out_proj rows of mamba-2.8b
constexpr size_t kSmemLimit = 227 * 1024;
constexpr int kTimePoints = kDataflowTimePoints;  // benchmarks: per layer and block
constexpr int kMaxGrid = 160;  // blocks (SMs) the cross-block sums take

/// Block b's channels [c0, c1) (pairs: 4-byte aligned bf16 state slices) and out_proj rows [h0, h1): every phase
/// between two exchanges streams about the same bytes on every block (an exchange waits for the slowest).
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
  unsigned* ctl;   // [0] launch generation (the LL flags' high bits), [1] blocks done with the launch
  // Exchanges between the blocks, in LL words (ll_st / ll_wait): 32 data bits + the exchange's 32-bit flag.
  uint64_t* part;  // [G, M, XD] x_proj partial sums over each block's channels (fp32 bits)
  uint64_t* fin;   // [M, XD] xdbl (fp32 bits)
  uint64_t* y;     // [M, I / 2] y as bf16 pairs in the GEMV operand order (act_pos)
  uint64_t* hid;   // [M, H] residual stream after the layer (fp32 bits)
  uint64_t* ssp;   // [G, M] sums of squares of each block's residual rows (fp32 bits)
  uint64_t* ll_all;  // every LL word above (ll_words of them), zeroed when the generation wraps
  size_t ll_words;
  int wrap_log2;     // the generation's bits in a flag (the rest: layer and exchange)
  int poll_ns;       // pause between two reads of an LL word that is not there yet
  unsigned long long* timing;
  int debug, inflight, groups, groups_out;
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
// ---- LL exchanges between the blocks ---------------------------------------------------------------------------
// A block publishes a value as one 64-bit word {data, flag} (NCCL's "LL" protocol): a 64-bit store is single-copy
// atomic, so a reader that sees the flag it waits for also sees the data, with no fence, counter or grid barrier
// in between. Each exchange of a launch has its own flag (ll_flag), so a word left from an earlier exchange never
// passes for a new one. Re-using a buffer is safe because every exchange is all-to-all (or all-to-owner-to-all):
// a block writes a buffer again only after reading data that every reader of the previous round produced after
// its reads.
__device__ __forceinline__ uint64_t ll_word(uint32_t data, uint32_t flag) {
  return (static_cast<uint64_t>(flag) << 32) | data;
}
__device__ __forceinline__ void ll_st(uint64_t* p, uint32_t data, uint32_t flag) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(ll_word(data, flag)) : "memory");
}
__device__ __forceinline__ uint64_t ll_ld(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
/// Two LL words (p 16-byte aligned); each is its own single-copy-atomic 64-bit access.
__device__ __forceinline__ void ll_ld2(const uint64_t* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p));
}
__device__ __forceinline__ bool ll_ok(uint64_t w, uint32_t flag) { return static_cast<uint32_t>(w >> 32) == flag; }
__device__ __forceinline__ uint32_t ll_data(uint64_t w) { return static_cast<uint32_t>(w); }
/// Re-reads the word pair at p (16-byte aligned) until both carry `flag`, sleep_ns apart; a, b: a first read of it.
__device__ __forceinline__ void ll_wait2(const uint64_t* p, uint64_t& a, uint64_t& b, uint32_t flag, int sleep_ns) {
  while (!(ll_ok(a, flag) && ll_ok(b, flag))) {
    __nanosleep(sleep_ns);
    ll_ld2(p, a, b);
  }
}
/// Flag of exchange k (0 x_proj partials, 1 xdbl, 2 y, 3 residual + sums of squares) of layer l (l = -1: the
/// input) in launch `gen`: never 0 (a zeroed word never passes).
__device__ __forceinline__ uint32_t ll_flag(unsigned gen, int wrap_log2, int l, int k) {
  return ((gen & ((1u << wrap_log2) - 1u)) << 12) | static_cast<uint32_t>(4 * (l + 1) + k + 1);
}
/// Waits for words [0, n) of src (n even, src 16-byte aligned) to carry `flag`; put(i, data) for each, spread
/// over the consumer threads (4 word pairs in flight per thread).
template <class Put>
__device__ __forceinline__ void ll_gather(const uint64_t* src, int n, uint32_t flag, int sleep_ns, int tid, Put put) {
  constexpr int kV = 4;
  const int pairs = n / 2;
  for (int base = 0; base < pairs; base += kV * kConsumers) {
    uint64_t w[kV][2];
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const int q = base + j * kConsumers + tid;
      if (q < pairs) ll_ld2(src + 2 * q, w[j][0], w[j][1]);
    }
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const int q = base + j * kConsumers + tid;
      if (q < pairs) {
        ll_wait2(src + 2 * q, w[j][0], w[j][1], flag, sleep_ns);
        put(2 * q, ll_data(w[j][0]));
        put(2 * q + 1, ll_data(w[j][1]));
      }
    }
  }
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
