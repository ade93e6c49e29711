// Owns the one-shot peer-to-peer collectives (see p2p_all_reduce.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/p2p_all_reduce.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 256;

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// Quad q's 4 floats (or the count's tail) from p, by one 16-byte load when p + 4q is 16-byte aligned. `cg`: read
/// around the L1 (values a peer wrote into this GPU's memory).
template <bool kCg>
__device__ __forceinline__ float4 load_quad(const float* p, int64_t i, int64_t count) {
  const float* a = p + i;
  if (i + 4 <= count && (reinterpret_cast<uintptr_t>(a) & 15) == 0)
    return kCg ? __ldcg(reinterpret_cast<const float4*>(a)) : *reinterpret_cast<const float4*>(a);
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k = 0; k < 4 && i + k < count; ++k) v[k] = kCg ? __ldcg(a + k) : a[k];
  return make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void store_quad(float* p, int64_t i, int64_t count, float4 v) {
  float* a = p + i;
  if (i + 4 <= count && (reinterpret_cast<uintptr_t>(a) & 15) == 0) {
    *reinterpret_cast<float4*>(a) = v;
    return;
  }
  const float w[4] = {v.x, v.y, v.z, v.w};
  for (int k = 0; k < 4 && i + k < count; ++k) a[k] = w[k];
}

/// One call: push this rank's quads of this block to every peer, exchange the block's flags, then combine. kGather:
/// out [world, count] = every rank's values; else out [count] = their sum in rank order (out may be `in`).
template <bool kGather>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(P2pAllReduceRank g, const float* in, int64_t count,
                                                            float* out) {
  __shared__ uint64_t epoch_s;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) epoch_s = g.epoch[b] + 1;
  __syncthreads();
  const uint64_t e = epoch_s;
  const int64_t slot_base = static_cast<int64_t>(e & 1) * g.world * g.max_count;
  const int64_t quads = (count + 3) / 4, stride = static_cast<int64_t>(kP2pBlocks) * kThreads;
  const int64_t first = static_cast<int64_t>(b) * kThreads + threadIdx.x;
  // 1. Push: my quads into slot [e & 1][my rank] of every peer (16-byte stores: the buffers are 16-byte aligned).
  for (int64_t q = first; q < quads; q += stride) {
    const float4 v = load_quad<false>(in, 4 * q, count);
    for (int p = 0; p < g.world; ++p)
      if (p != g.rank)
        *reinterpret_cast<float4*>(g.recv[p] + slot_base + g.rank * g.max_count + 4 * q) = v;
  }
  __syncthreads();  // every thread's pushes precede thread 0's releases below
  // 2. Flags: raise mine on every peer, wait for every peer's on me (this block only).
  if (threadIdx.x == 0) {
    for (int p = 0; p < g.world; ++p)
      if (p != g.rank) store_release_sys(g.flags[p] + b * kP2pMaxRanks + g.rank, e);
    for (int p = 0; p < g.world; ++p)
      if (p != g.rank)
        while (load_acquire_sys(g.flags[g.rank] + b * kP2pMaxRanks + p) < e) {
        }
    g.epoch[b] = e;
  }
  __syncthreads();  // the peers' pushes for this block are visible to every thread from here
  // 3. Combine from my own memory.
  const float* mine = g.recv[g.rank] + slot_base;
  for (int64_t q = first; q < quads; q += stride) {
    const float4 own = load_quad<false>(in, 4 * q, count);
    if constexpr (kGather) {
      for (int p = 0; p < g.world; ++p) {
        const float4 v = p == g.rank ? own : __ldcg(reinterpret_cast<const float4*>(mine + p * g.max_count + 4 * q));
        store_quad(out + p * count, 4 * q, count, v);
      }
    } else {
      float4 s = g.rank == 0 ? own : __ldcg(reinterpret_cast<const float4*>(mine + 4 * q));
      for (int p = 1; p < g.world; ++p) {
        const float4 v = p == g.rank ? own : __ldcg(reinterpret_cast<const float4*>(mine + p * g.max_count + 4 * q));
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
      store_quad(out, 4 * q, count, s);
    }
  }
}

bool valid(const P2pAllReduceRank& g, int64_t count) {
  return g.world >= 2 && g.world <= kP2pMaxRanks && g.rank >= 0 && g.rank < g.world && count >= 0 &&
         count <= g.max_count && g.max_count % 4 == 0 && g.epoch;
}

}  // namespace

int64_t p2p_flags_offset(int world, int64_t max_count) { return 2LL * world * max_count * sizeof(float); }

int64_t p2p_buffer_bytes(int world, int64_t max_count) {
  return p2p_flags_offset(world, max_count) + (kP2pBlocks * kP2pMaxRanks + kP2pBlocks) * sizeof(uint64_t);
}

cudaError_t p2p_all_reduce_sum(const P2pAllReduceRank& g, float* data, int64_t count, cudaStream_t stream) {
  if (!valid(g, count)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  one_shot_kernel<false><<<kP2pBlocks, kThreads, 0, stream>>>(g, data, count, data);
  return launch_status();
}

cudaError_t p2p_all_gather(const P2pAllReduceRank& g, const float* send, int64_t count, float* recv, cudaStream_t stream) {
  if (!valid(g, count)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  one_shot_kernel<true><<<kP2pBlocks, kThreads, 0, stream>>>(g, send, count, recv);
  return launch_status();
}

}  // namespace ssmserve::cuda
