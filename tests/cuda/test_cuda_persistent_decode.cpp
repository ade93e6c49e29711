// GPU persistent Mamba-1 decode kernel (issue 7, kernels/cuda/persistent_decode.h): per layer, the whole stack in
// one launch and inside a CUDA graph, bit-identical to the runner's op-by-op decode chain (hidden, out, states) for
// several shapes, batch sizes, state dtypes and prefetch depths. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "mamba1_decode_case.h"
#include "device/cuda_check.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/persistent_decode.h"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

TEST(CudaPersistentDecode, EqualsOpChainBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::pair<const char*, cuda::Mamba1DecodeShape>> shapes = {
      {"mamba-130m", {768, 1536, 16, 48, 4, 1e-5f}}, {"odd", {520, 1048, 8, 24, 3, 1e-5f}},
      {"tiny-mamba", {256, 512, 16, 16, 4, 1e-5f}}};
  if (!quick()) shapes.push_back({"mamba-2.8b", {2560, 5120, 16, 160, 4, 1e-5f}});
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (const auto& [name, sh] : shapes) {
    for (DType sd : {DType::F32, DType::BF16}) {
      for (int M : {1, 3, 8}) {
        SCOPED_TRACE(::testing::Message() << name << " M=" << M << " state " << dtype_name(sd));
        ASSERT_TRUE(cuda::mamba1_persistent_supported(sh, M, sd));
        const int nl = 3;
        Mamba1DecodeCase pc(rng, sh, nl, M, sd);
        auto ref = pc.fresh();
        for (int l = 0; l < nl; ++l) pc.chain(ref, l, s);
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto want = pc.result(ref);
        for (int prefetch : {0, 1, 2, 3, 4, 5}) {
          // Per layer (the runner's form).
          auto r = pc.fresh();
          for (int l = 0; l < nl; ++l)
            SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(sh, nullptr, pc.layer(r, l), 1, l == 0, M, pc.buffers(r),
                                                          {prefetch}, s));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          EXPECT_TRUE(pc.result(r) == want) << "per-layer, prefetch " << prefetch;
          // The whole stack in one launch.
          auto r2 = pc.fresh();
          std::vector<cuda::Mamba1DecodeLayer> ls;
          for (int l = 0; l < nl; ++l) ls.push_back(pc.layer(r2, l));
          DeviceBuffer dl(ls.size() * sizeof(cuda::Mamba1DecodeLayer));
          dl.upload(ls.data(), dl.bytes());
          SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(sh, static_cast<const cuda::Mamba1DecodeLayer*>(dl.data()),
                                                        ls[0], nl, true, M, pc.buffers(r2), {prefetch}, s));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          EXPECT_TRUE(pc.result(r2) == want) << "stack, prefetch " << prefetch;
        }
        // Inside a CUDA graph (captured once, replayed): same bits as the chain.
        auto r3 = pc.fresh();
        cudaGraph_t g = nullptr;
        cudaGraphExec_t e = nullptr;
        SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < nl; ++l)
          SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(sh, nullptr, pc.layer(r3, l), 1, l == 0, M, pc.buffers(r3), {}, s));
        SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        SSM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
        SSM_CUDA_CHECK(cudaGraphLaunch(e, s));
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_TRUE(pc.result(r3) == want) << "graph";
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);
      }
    }
  }
}

}  // namespace
}  // namespace ssmserve
