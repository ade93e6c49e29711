// Owns the helpers shared by the decode-path GPU tests and benchmarks (skinny GEMM, decode ops, dataflow decode
// kernel, DISABLED_ decode benchmarks): poisoned buffers, bf16 bit conversion, the skinny GEMM with its
// workspace, the model GEMM shapes, random bf16 operands with their CPU reference, and the skinny tuning variants.
#pragma once
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/linear.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/weight.h"

namespace ssmserve::cudatest {

/// A device buffer of `bytes` bytes, every byte 0xFF.
inline cuda::DeviceBuffer poisoned_bytes(size_t bytes) {
  cuda::DeviceBuffer b(bytes);
  b.fill_bytes(0xff);
  return b;
}
/// bf16 bit patterns widened to fp32.
inline std::vector<float> bf16_bits_to_f32(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

/// Runs launch(stream) and waits for it: captured in a CUDA graph on a stream of its own and replayed once (graph), or
/// on the legacy default stream.
inline void launch_once(bool graph, const std::function<cudaError_t(cudaStream_t)>& launch) {
  if (!graph) {
    SSM_CUDA_CHECK(launch(nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  cudaStream_t st;
  SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  SSM_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  SSM_CUDA_CHECK(launch(st));
  SSM_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  SSM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  SSM_CUDA_CHECK(cudaGraphLaunch(ge, st));
  SSM_CUDA_CHECK(cudaStreamSynchronize(st));
  SSM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  SSM_CUDA_CHECK(cudaGraphDestroy(g));
  SSM_CUDA_CHECK(cudaStreamDestroy(st));
}

/// Bytes of two device buffers equal (state pools updated by two paths).
inline bool same_bytes(const cuda::DeviceBuffer& a, const cuda::DeviceBuffer& b) {
  return a.bytes() == b.bytes() && cuda::to_host<uint8_t>(a, a.bytes()) == cuda::to_host<uint8_t>(b, b.bytes());
}

/// skinny_gemm with its workspace (allocated per call; counters zeroed).
inline cudaError_t skinny(const cuda::GemmArgs& g, void* y2, int64_t y2s, bool pdl, cudaStream_t s,
                          const cuda::SkinnyExtras& ex = {}) {
  size_t cb = 0;
  const size_t wb = cuda::skinny_gemm_workspace(g.M, g.N, g.K, &cb, ex.tuning);
  static cuda::DeviceBuffer ws, counters;
  if (wb > ws.bytes()) ws = cuda::DeviceBuffer(wb);
  if (cb > counters.bytes()) {
    counters = cuda::DeviceBuffer(cb);
    counters.fill_bytes(0);
  }
  return cuda::skinny_gemm(g, y2, y2s, pdl, s, ws.data(), ws.bytes(), counters.as<unsigned>(), ex);
}

/// A named GEMM weight shape: N output columns, K inputs.
struct Shape {
  std::string name;
  int64_t N, K;
};
/// The decode projections of the named Mamba-1 / Mamba-2 shapes, the LM head and two odd sizes.
inline std::vector<Shape> gemm_shapes() {
  std::vector<Shape> c;
  for (const auto& s : mamba1_shapes()) {
    c.push_back({std::string(s.name) + ".in_proj", 2 * s.d_inner, s.d_model});
    c.push_back({std::string(s.name) + ".x_proj", s.dt_rank + 2 * s.d_state, s.d_inner});
    c.push_back({std::string(s.name) + ".dt_proj", s.d_inner, s.dt_rank});
    c.push_back({std::string(s.name) + ".out_proj", s.d_model, s.d_inner});
  }
  for (const auto& s : mamba2_shapes())
    c.push_back({std::string(s.name) + ".in_proj", 2 * s.d_inner() + 2LL * s.n_groups * s.d_state + s.heads, s.d_model});
  c.push_back({"lm_head", 50280, quick() ? 768 : 2560});
  c.push_back({"odd", 70, 35});   // K % 8 != 0: scalar loads
  c.push_back({"tiny", 5, 3});
  return c;
}

/// Random bf16 operands for one shape: x [M, xs], w [N, K]; device copies.
struct Operands {
  int64_t M, N, K, xs;
  std::vector<float> x, w;
  cuda::DeviceBuffer dx, dw;
  Operands(std::mt19937& rng, int64_t m, int64_t n, int64_t k, int64_t x_stride)
      : M(m), N(n), K(k), xs(x_stride), x(rand_vec(rng, m * x_stride)), w(rand_vec(rng, n * k, -0.05f, 0.05f)) {
    round_bf16(x), round_bf16(w);
    dx = cuda::to_device(to_bf16_bits(x)), dw = cuda::to_device(to_bf16_bits(w));
  }
  std::vector<float> reference(int64_t ys) const {
    Weight W = Weight::allocate(DType::F32, N, K);
    std::memcpy(const_cast<void*>(W.data), w.data(), w.size() * 4);
    std::vector<float> ref(M * ys, 0.0f);
    cpu::linear(x.data(), M, xs, W, nullptr, ref.data(), ys);
    return ref;
  }
};

/// The tuning variants the tests and the benchmark sweep; the default's summation order first (cta 4, shift 0).
inline std::vector<cuda::SkinnyTuning> tunings() {
  std::vector<cuda::SkinnyTuning> t;
  for (int u : {2, 4, 8})
    for (bool pipe : {false, true})
      for (bool cap : {false, true}) t.push_back({u, pipe, cap, 0, 4});
  for (int cta : {8, 16}) {
    t.push_back({4, false, true, 0, cta});
    t.push_back({2, true, false, 0, cta});
  }
  for (int shift : {-1, 1}) {
    t.push_back({2, true, false, shift, 4});
    t.push_back({4, false, false, shift, 4});
  }
  return t;
}

}  // namespace ssmserve::cudatest
