// Owns the device side of a shared-memory weight ring filled by TMA bulk copies (sm_90): mbarrier operations, the
// bulk copy with an L2 cache hint, and the consumers' cursor. One producer thread fills slot it % ns with
// expect_tx on full[slot] after every consumer warp has arrived on empty[slot]; consumer warps take slots in
// order and give each back once read (PTX ISA, "mbarrier" and "cp.async.bulk"). Used by the dataflow decode kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ssmserve::cuda::detail {

/// Shared-memory address of a generic pointer to shared memory.
__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
/// mbarrier (shared::cta, 64-bit) init with an arrival count / plain arrival / arrival expecting `bytes` of
/// transactions / spin until the phase of the given parity has completed.
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
/// mbar_wait with a bound: a wait that never completes (a ring protocol or transaction-count error) traps after ~2^26
/// failed polls (seconds) instead of hanging the stream, so it surfaces as an error (the trap ends the context). For
/// producer warps: in a kernel's consumer warpgroups the trap path can cost registers (paged_attention_tc_ws.cu).
__device__ __forceinline__ void mbar_wait_bounded(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    if (polls == (1u << 26)) __trap();
  }
}
/// TMA bulk copy global -> shared (bytes and both addresses multiples of 16), completing on mbarrier `bar`, with an
/// L2 cache policy (createpolicy).
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, unsigned bytes, uint32_t bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}
/// %globaltimer in ns (benchmark timing).
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// The consumers' position in the ring (every consumer warp takes and gives back every slot).
struct Ring {
  uint64_t* full;
  uint64_t* empty;
  unsigned char* base;
  int ns, slot, s = 0;
  uint32_t phase = 0;                // parity of the slot's current fill
  __device__ __forceinline__ const unsigned char* take() {
    mbar_wait(saddr(full + s), phase);
    return base + static_cast<size_t>(s) * slot;
  }
  __device__ __forceinline__ void give(int lane) {
    __syncwarp();
    if (lane == 0) mbar_arrive(saddr(empty + s));
    if (++s == ns) s = 0, phase ^= 1u;
  }
};

}  // namespace ssmserve::cuda::detail
