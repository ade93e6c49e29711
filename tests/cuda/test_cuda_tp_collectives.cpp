// Tensor parallelism on GPUs (issue 9): the all-reduce and all-gather collectives of a 2-GPU group (one-shot
// peer-to-peer kernels up to 2^21 floats, NCCL above) bit-identical to the host's sums, eager and in CUDA graphs,
// and (DISABLED_, run by scripts/gpu-tp-check.sh) their microseconds per call. Skips without 2 GPUs or NCCL.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "runtime/nccl_communicator.h"
#include "tp_test_util.h"

namespace ssmserve {
namespace {

/// Runs f(rank, communicator, stream) on one thread per rank of a 2-GPU group, each with its GPU current.
template <class F>
void on_two_ranks(cuda::NcclGroup& group, F&& f) {
  std::vector<std::thread> th;
  std::vector<std::string> errors(2);
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      try {
        SSM_CUDA_CHECK(cudaSetDevice(r));
        cudaStream_t s = nullptr;
        SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        group.communicator(r).set_stream(s);
        f(r, group.communicator(r), s);
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        cudaStreamDestroy(s);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

/// Rank r's test values for call i (the same on the host side of both ranks' checks).
std::vector<float> values(int r, int i, int64_t n) {
  std::mt19937 g(static_cast<uint32_t>(1000 * i + r));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

/// Checks got [n] against the host rank-order sum (all-reduce) or got [2, n] against both ranks' values (gather).
void expect_collective(const std::vector<float>& got, const std::vector<float>& a, const std::vector<float>& b,
                       bool gather, const std::string& what) {
  const size_t n = a.size();
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (gather) {
      bad += std::memcmp(&got[i], &a[i], 4) != 0;
      bad += std::memcmp(&got[n + i], &b[i], 4) != 0;
    } else {
      const float want = a[i] + b[i];
      bad += std::memcmp(&got[i], &want, 4) != 0;
    }
  }
  if (bad) throw std::runtime_error(what + ": " + std::to_string(bad) + " wrong values");
}

// All-reduces and all-gathers through the group: sizes on both sides of the one-shot peer-to-peer limit (2^21
// floats; above it NCCL), odd sizes and data pointers off 16-byte alignment (the kernels' quad map must not depend
// on alignment), all-reduces and all-gathers interleaved (they share the epochs and receive slots), many calls in a
// row, then both captured in one CUDA graph and replayed with fresh values. Every result must be bit-identical to
// the host's rank-0 + rank-1 sum (gathers: both ranks' values) on both ranks.
TEST(CudaTensorParallel, CollectivesSmallAndLargeAndInGraphs) {
  REQUIRE_TWO_GPUS();
  cuda::NcclGroup group(2);
  const int64_t kLimit = int64_t{1} << 21;
  struct Case {
    int64_t n;
    int offset;  // floats past the 256-byte-aligned allocation
    bool gather;
  };
  const std::vector<Case> cases = {{1, 0, false},      {192, 1, false},     {2560, 0, false},       {7, 3, true},
                                   {16385, 2, false},  {40960, 0, false},   {50280, 1, true},       {100001, 0, false},
                                   {kLimit, 0, false}, {kLimit + 1, 1, false}, {kLimit / 2 + 3, 0, true}, {2560, 2, true},
                                   {192, 0, false}};
  const int reps = cudatest::quick() ? 2 : 6;
  on_two_ranks(group, [&](int r, dist::Communicator& comm, cudaStream_t s) {
    float *d = nullptr, *g = nullptr;
    SSM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), (kLimit + 8) * sizeof(float)));
    SSM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g), 2 * (kLimit + 8) * sizeof(float)));
    int call = 0;
    for (int rep = 0; rep < reps; ++rep)
      for (const Case& c : cases) {
        const int64_t n = c.n;
        const auto mine = values(r, call, n), a = values(0, call, n), b = values(1, call, n);
        float* x = d + c.offset;
        SSM_CUDA_CHECK(cudaMemcpyAsync(x, mine.data(), n * 4, cudaMemcpyHostToDevice, s));
        std::vector<float> got(static_cast<size_t>(c.gather ? 2 * n : n));
        if (c.gather) {
          comm.all_gather(x, n, g + c.offset);
          SSM_CUDA_CHECK(cudaMemcpyAsync(got.data(), g + c.offset, 2 * n * 4, cudaMemcpyDeviceToHost, s));
        } else {
          comm.all_reduce_sum(x, n);
          SSM_CUDA_CHECK(cudaMemcpyAsync(got.data(), x, n * 4, cudaMemcpyDeviceToHost, s));
        }
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        expect_collective(got, a, b, c.gather, "call " + std::to_string(call) + " size " + std::to_string(n));
        ++call;
      }
    // Captured: the graph's kernels read their epochs from the device, so replays stay in step.
    const int64_t n = 2560, ng = 5001;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    comm.all_reduce_sum(d, n);
    comm.all_gather(d + 4096, ng, g);
    SSM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    SSM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 30; ++rep, call += 2) {
      const auto mine = values(r, call, n), a = values(0, call, n), b = values(1, call, n);
      const auto mine2 = values(r, call + 1, ng), a2 = values(0, call + 1, ng), b2 = values(1, call + 1, ng);
      SSM_CUDA_CHECK(cudaMemcpyAsync(d, mine.data(), n * 4, cudaMemcpyHostToDevice, s));
      SSM_CUDA_CHECK(cudaMemcpyAsync(d + 4096, mine2.data(), ng * 4, cudaMemcpyHostToDevice, s));
      SSM_CUDA_CHECK(cudaGraphLaunch(exec, s));
      std::vector<float> got(static_cast<size_t>(n)), got2(static_cast<size_t>(2 * ng));
      SSM_CUDA_CHECK(cudaMemcpyAsync(got.data(), d, n * 4, cudaMemcpyDeviceToHost, s));
      SSM_CUDA_CHECK(cudaMemcpyAsync(got2.data(), g, 2 * ng * 4, cudaMemcpyDeviceToHost, s));
      SSM_CUDA_CHECK(cudaStreamSynchronize(s));
      expect_collective(got, a, b, false, "graph replay " + std::to_string(rep) + " all-reduce");
      expect_collective(got2, a2, b2, true, "graph replay " + std::to_string(rep) + " all-gather");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(g);
    cudaFree(d);
  });
}

// Benchmark (run by scripts/gpu-tp-check.sh, not in CI): microseconds per all-reduce and all-gather of decode-sized
// messages through the one-shot peer-to-peer kernels, 200 calls captured in a CUDA graph per size (the peer, NCCL
// through torch.distributed, is tools/tp_collective_peer.py).
TEST(CudaTensorParallel, DISABLED_CollectiveTimes) {
  REQUIRE_TWO_GPUS();
  const std::vector<int64_t> sizes = {192, 2560, 4 * 2560, 16 * 2560, 64 * 2560, 256 * 4096, 50280, 16 * 25140};
  {
    cuda::NcclGroup group(2);
    on_two_ranks(group, [&](int r, dist::Communicator& comm, cudaStream_t s) {
      float *d = nullptr, *g = nullptr;
      SSM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), (int64_t{1} << 21) * sizeof(float)));
      SSM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g), (int64_t{1} << 22) * sizeof(float)));
      SSM_CUDA_CHECK(cudaMemsetAsync(d, 0, (int64_t{1} << 21) * sizeof(float), s));
      for (const bool gather : {false, true})
        for (int64_t n : sizes) {
          constexpr int kCalls = 200;
          cudaGraph_t graph = nullptr;
          cudaGraphExec_t exec = nullptr;
          SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < kCalls; ++i) gather ? comm.all_gather(d, n, g) : comm.all_reduce_sum(d, n);
          SSM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
          SSM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          SSM_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          cudaEvent_t t0 = nullptr, t1 = nullptr;
          SSM_CUDA_CHECK(cudaEventCreate(&t0));
          SSM_CUDA_CHECK(cudaEventCreate(&t1));
          SSM_CUDA_CHECK(cudaEventRecord(t0, s));
          SSM_CUDA_CHECK(cudaGraphLaunch(exec, s));
          SSM_CUDA_CHECK(cudaEventRecord(t1, s));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          float ms = 0;
          SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
          if (r == 0)
            std::printf("p2p  %-10s %9lld floats: %8.2f us\n", gather ? "all-gather" : "all-reduce",
                        static_cast<long long>(n), 1e3 * ms / kCalls);
          cudaEventDestroy(t0);
          cudaEventDestroy(t1);
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
        }
      cudaFree(g);
      cudaFree(d);
    });
  }
}

}  // namespace
}  // namespace ssmserve
