// Owns the one-shot peer-to-peer all-reduce (see p2p_all_reduce.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/p2p_all_reduce.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 512;

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/// A peer's staging value, read around the L1 (it was written by another GPU).
__device__ __forceinline__ float load_peer(const float* p) {
  float v;
  asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

/// One block: stage, signal, wait, sum in rank order.
__global__ void __launch_bounds__(kThreads) one_shot_kernel(P2pAllReduceRank g, float* __restrict__ data,
                                                            int64_t count) {
  __shared__ uint64_t epoch_s;
  if (threadIdx.x == 0) epoch_s = *g.epoch + 1;
  __syncthreads();
  const uint64_t e = epoch_s;
  const int slot = static_cast<int>(e & 1);
  float* mine = g.staging[g.rank][slot];
  for (int64_t i = threadIdx.x; i < count; i += kThreads) mine[i] = data[i];
  __syncthreads();  // every thread's staging writes precede thread 0's release below
  if (threadIdx.x == 0) {
    for (int p = 0; p < g.world; ++p)
      if (p != g.rank) store_release_sys(g.flags[p] + g.rank, e);
    for (int p = 0; p < g.world; ++p)
      if (p != g.rank)
        while (load_acquire_sys(g.flags[g.rank] + p) < e) {
        }
    *g.epoch = e;
  }
  __syncthreads();  // the peers' staging writes are visible to every thread from here
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    float s = 0.0f;
    for (int p = 0; p < g.world; ++p) s += p == g.rank ? mine[i] : load_peer(g.staging[p][slot] + i);
    data[i] = s;
  }
}

}  // namespace

cudaError_t p2p_all_reduce_sum(const P2pAllReduceRank& g, float* data, int64_t count, cudaStream_t stream) {
  if (g.world < 2 || g.world > kP2pMaxRanks || g.rank < 0 || g.rank >= g.world || count < 0 || count > g.max_count ||
      !g.epoch)
    return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  one_shot_kernel<<<1, kThreads, 0, stream>>>(g, data, count);
  return launch_status();
}

}  // namespace ssmserve::cuda
