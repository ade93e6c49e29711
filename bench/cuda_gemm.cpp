// Owns the GPU roofline probe for the benchmark report: bf16 GEMM throughput through the engine's own cuBLASLt
// path (kernels/cuda/gemm.h: bf16 operands, fp32 accumulate) on a square 8192^3 product and on the prefill GEMMs
// of the benchmarked model shapes at M = 8192 tokens, plus device-to-device copy bandwidth. Prefill's compute
// roofline is 2 x params FLOP per token at the best measured GEMM rate. Prints one JSON object per line.
// Usage: bench_cuda_gemm [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/gemm.h"

namespace {
using namespace ssmserve;
using namespace ssmserve::cuda;

struct Shape {
  std::string name;
  int64_t M, N, K;
  DType y_dtype;
};

/// Median-of-3 of `iters` back-to-back GEMMs, TFLOP/s.
double time_gemm(GemmHandle& h, const Shape& s, cudaStream_t st, int iters) {
  DeviceBuffer x(s.M * s.K * 2), w(s.N * s.K * 2), y(s.M * s.N * dtype_size(s.y_dtype));
  x.fill_bytes(0x3c), w.fill_bytes(0x3c);  // small finite bf16 values
  const GemmArgs a{s.M, s.N, s.K, x.data(), s.K, w.data(), s.K, DType::BF16, y.data(), s.N, s.y_dtype};
  h.run(a, st);  // heuristic lookup + warmup
  h.run(a, st);
  cudaEvent_t e0, e1;
  SSM_CUDA_CHECK(cudaEventCreate(&e0));
  SSM_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> r;
  for (int rep = 0; rep < 3; ++rep) {
    SSM_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; ++i) h.run(a, st);
    SSM_CUDA_CHECK(cudaEventRecord(e1, st));
    SSM_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    r.push_back(2.0 * s.M * s.N * s.K * iters / (ms * 1e-3) / 1e12);
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  std::sort(r.begin(), r.end());
  return r[1];
}

/// Device-to-device copy of 1 GiB: bytes read + written per second (median of 3 x 10 copies).
double copy_bandwidth(cudaStream_t st) {
  const size_t n = size_t{1} << 30;
  DeviceBuffer a(n), b(n);
  a.fill_bytes(1);
  cudaEvent_t e0, e1;
  SSM_CUDA_CHECK(cudaEventCreate(&e0));
  SSM_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> r;
  SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, st));
  for (int rep = 0; rep < 3; ++rep) {
    SSM_CUDA_CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < 10; ++i) SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, st));
    SSM_CUDA_CHECK(cudaEventRecord(e1, st));
    SSM_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    r.push_back(2.0 * n * 10 / (ms * 1e-3));
  }
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  std::sort(r.begin(), r.end());
  return r[1];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!gpu_available()) {
    std::puts("{\"error\": \"no CUDA device\"}");
    return 1;
  }
  std::printf("{\"device\": \"%s\"}\n", device_description(0).c_str());
  Stream stream;
  GemmHandle h;
  const int64_t M = 8192;
  std::vector<Shape> shapes = {{"square 8192^3, bf16 out", 8192, 8192, 8192, DType::BF16},
                               {"square 8192^3, fp32 out", 8192, 8192, 8192, DType::F32}};
  if (!quick) {
    // (name, N, K) of the prefill projections at M tokens, fp32 output as the runners use them.
    const std::vector<std::tuple<std::string, int64_t, int64_t>> proj = {
        {"mamba-130m in_proj", 3072, 768},     {"mamba-130m out_proj", 768, 1536},
        {"mamba-1.4b in_proj", 8192, 2048},    {"mamba-1.4b out_proj", 2048, 4096},
        {"mamba-2.8b in_proj", 10240, 2560},   {"mamba-2.8b x_proj", 192, 5120},
        {"mamba-2.8b dt_proj", 5120, 160},     {"mamba-2.8b out_proj", 2560, 5120},
        {"mamba2-2.7b in_proj", 10576, 2560},  {"mamba2-2.7b out_proj", 2560, 5120},
        {"lm_head 50280 x 2560 (M=16)", 50280, 2560}};
    for (const auto& [n, N, K] : proj) shapes.push_back({n, n.find("M=16") != std::string::npos ? 16 : M, N, K, DType::F32});
  }
  double best = 0;
  for (const Shape& s : shapes) {
    const double tf = time_gemm(h, s, stream.get(), s.M * s.N * s.K > (int64_t{1} << 36) ? 10 : 30);
    best = std::max(best, tf);
    std::printf("{\"gemm\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"tflops\": %.1f}\n", s.name.c_str(),
                static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K), tf);
    std::fflush(stdout);
  }
  const double bw = copy_bandwidth(stream.get());
  std::printf("{\"bf16_gemm_tflops_best\": %.1f, \"d2d_copy_gb_per_s\": %.0f}\n", best, bw / 1e9);
  return 0;
}
