// Standalone probe (not part of the CMake build): what a grid-wide sync and a thread-block-cluster sync cost on the
// current GPU, with the dataflow decode kernel's launch shape (one 416-thread block per SM, ~200 KB of dynamic
// shared memory). Numbers for the design of its cross-block exchanges (docs/benchmarks.md, session 11).
//
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a bench/cuda_sync_probe.cu -o cuda_sync_probe
//   ./cuda_sync_probe
//
// Prints, per variant, µs per sync (CUDA events over kIters syncs in one launch, median of 5 launches):
//   grid flag sync    every block: bar.sync, thread 0 __threadfence + atomicAdd on the iteration's counter, spins
//                     with ld.acquire.gpu until all blocks arrived, bar.sync (the dataflow kernel's arrive/wait_all);
//   cluster sync C    cluster.sync() in clusters of C = 2, 4, 8 blocks (grid = C x the most co-resident clusters);
//   cluster exchange  a value written to shared memory, cluster.sync(), the next rank's value read through
//                     distributed shared memory, cluster.sync();
//   grid + cluster    the grid flag sync in a cooperative launch that also has clusters of C (whether the runtime
//                     takes both attributes together).
// and cudaOccupancyMaxActiveClusters for each C (blocks that can be co-resident in clusters of C).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace cg = cooperative_groups;

namespace {

constexpr int kThreads = 416;
constexpr size_t kSmem = 200 * 1024;
constexpr int kIters = 2000;

#define CHECK(x)                                                                           \
  do {                                                                                     \
    const cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                                 \
      return -1.0f;                                                                        \
    }                                                                                      \
  } while (0)

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void grid_sync_kernel(unsigned* counters, float* sink) {
  extern __shared__ float smem[];
  float acc = 0.0f;
  for (int i = 0; i < kIters; ++i) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counters + i, 1u);
      while (ld_acquire(counters + i) < gridDim.x) {
      }
      __threadfence();
    }
    __syncthreads();
    acc += smem[threadIdx.x];
  }
  if (acc == 12345.0f) sink[0] = acc;
}

__global__ void cluster_sync_kernel(float* sink, int exchange) {
  extern __shared__ float smem[];
  cg::cluster_group cl = cg::this_cluster();
  const unsigned rank = cl.block_rank(), n = cl.num_blocks();
  float acc = 0.0f;
  for (int i = 0; i < kIters; ++i) {
    if (exchange && threadIdx.x == 0) smem[0] = static_cast<float>(i + rank);
    cl.sync();
    if (exchange) {
      const float* other = cl.map_shared_rank(smem, (rank + 1) % n);
      acc += other[0];
      cl.sync();
    }
  }
  if (acc == 12345.0f) sink[0] = acc;
}

/// µs per sync of `launch` (kIters syncs per launch), median of 5 launches after one warm-up.
template <class Launch>
float time_it(Launch launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> us;
  for (int r = 0; r < 6; ++r) {
    CHECK(cudaEventRecord(a));
    CHECK(launch());
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) us.push_back(ms * 1000.0f / kIters);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  std::printf("%s, %d SMs; %d threads and %zu KB shared memory per block, %d syncs per launch\n", prop.name, sms,
              kThreads, kSmem / 1024, kIters);
  cudaFuncSetAttribute(grid_sync_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  cudaFuncSetAttribute(cluster_sync_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  cudaFuncSetAttribute(cluster_sync_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  unsigned* counters = nullptr;
  float* sink = nullptr;
  cudaMalloc(&counters, kIters * sizeof(unsigned));
  cudaMalloc(&sink, sizeof(float));

  auto grid_launch = [&](int cluster) {
    return [&, cluster]() -> cudaError_t {
      cudaMemsetAsync(counters, 0, kIters * sizeof(unsigned));
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(static_cast<unsigned>(cluster > 1 ? sms / cluster * cluster : sms));
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = kSmem;
      cudaLaunchAttribute at[2];
      at[0].id = cudaLaunchAttributeCooperative, at[0].val.cooperative = 1;
      at[1].id = cudaLaunchAttributeClusterDimension, at[1].val.clusterDim.x = static_cast<unsigned>(cluster);
      at[1].val.clusterDim.y = at[1].val.clusterDim.z = 1;
      cfg.attrs = at, cfg.numAttrs = cluster > 1 ? 2 : 1;
      return cudaLaunchKernelEx(&cfg, grid_sync_kernel, counters, sink);
    };
  };
  std::printf("grid flag sync (%d blocks): %.3f us\n", sms, time_it(grid_launch(1)));

  for (int c : {2, 4, 8, 16}) {
    cudaLaunchConfig_t q{};
    q.gridDim = dim3(static_cast<unsigned>(sms / c * c));
    q.blockDim = dim3(kThreads);
    q.dynamicSmemBytes = kSmem;
    cudaLaunchAttribute at{};
    at.id = cudaLaunchAttributeClusterDimension, at.val.clusterDim.x = static_cast<unsigned>(c);
    at.val.clusterDim.y = at.val.clusterDim.z = 1;
    q.attrs = &at, q.numAttrs = 1;
    int clusters = 0;
    const cudaError_t oe = cudaOccupancyMaxActiveClusters(&clusters, cluster_sync_kernel, &q);
    if (oe != cudaSuccess || clusters < 1) {
      std::printf("clusters of %d: not co-resident (%s)\n", c, cudaGetErrorString(oe));
      cudaGetLastError();
      continue;
    }
    q.gridDim = dim3(static_cast<unsigned>(clusters * c));
    for (int ex : {0, 1}) {
      const float us = time_it([&]() { return cudaLaunchKernelEx(&q, cluster_sync_kernel, sink, ex); });
      std::printf("clusters of %d: %d co-resident (%d blocks); %s: %.3f us\n", c, clusters, clusters * c,
                  ex ? "cluster exchange (2 syncs + a DSMEM read)" : "cluster sync", us);
    }
    if (c <= 8) {
      const float us = time_it(grid_launch(c));
      if (us >= 0.0f) std::printf("grid + clusters of %d (%d blocks): grid flag sync %.3f us\n", c, sms / c * c, us);
      cudaGetLastError();
    }
  }
  cudaFree(counters);
  cudaFree(sink);
  return 0;
}
