// Owns the CPU roofline probe for the benchmark report: streaming read bandwidth (what bounds batch-1 decode,
// which reads every weight once per token) and single-precision GEMM throughput (what bounds prefill), both
// measured with the engine's thread count. Prints JSON.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/huge_pages.h"
#include "kernels/cpu/linear.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Best-of-5 read bandwidth over a 1 GiB buffer, bytes/s. huge_pages: the buffer lives on transparent huge
/// pages, as the engine's weights and state pools do (core/huge_pages.h); otherwise on ordinary 4 KiB pages.
double read_bandwidth(bool huge_pages) {
  const size_t n = (size_t{1} << 30) / sizeof(float);
  std::vector<float, ssmserve::HugePageAllocator<float>> huge;
  std::vector<float> plain;
  if (huge_pages) huge.assign(n, 1.0f);
  else plain.assign(n, 1.0f);
  const float* buf = huge_pages ? huge.data() : plain.data();
  double best = 1e30, sink = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    float acc = 0;
#pragma omp parallel reduction(+ : acc)
    {
      float part[64] = {};  // independent partial sums: the loop is bound by memory, not add latency
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; i += 64)
        for (int j = 0; j < 64; ++j) part[j] += buf[i + j];
      for (float p : part) acc += p;
    }
    best = std::min(best, seconds_since(t0));
    sink += acc;
  }
  if (sink < 0) std::puts("");
  return static_cast<double>(n * sizeof(float)) / best;
}

/// Best-of-5 sgemm FLOP/s for a prefill-like product [512 x 768] x [768 x 3072], one call as the engine's
/// linear() makes it (OpenBLAS's OpenMP build threads it over our OpenMP team).
double sgemm_flops() {
  const int M = 512, N = 3072, K = 768;
  std::vector<float> a(M * K, 0.5f), b(static_cast<size_t>(N) * K, 0.25f), c(static_cast<size_t>(M) * N);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * M * N * K / best;
}

/// Best-of-5 FLOP/s of our batch-invariant cpu::linear on the same product with a bf16 weight, row-major
/// (packed = false) or repacked into panels (pack_for_linear).
double linear_flops(bool packed) {
  const int64_t M = 512, N = 3072, K = 768;
  ssmserve::Weight w = ssmserve::Weight::allocate(ssmserve::DType::BF16, N, K);
  std::fill(reinterpret_cast<uint16_t*>(w.owned->data()), reinterpret_cast<uint16_t*>(w.owned->data()) + N * K,
            uint16_t{0x3e80});  // 0.25
  if (packed) ssmserve::cpu::pack_for_linear(w);
  std::vector<float> x(M * K, 0.5f), y(M * N);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ssmserve::cpu::linear(x.data(), M, w, nullptr, y.data());
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * M * N * K / best;
}

}  // namespace

int main() {
  std::printf("{\"threads\": %d, \"read_bandwidth_GBps\": %.2f, \"read_bandwidth_4k_pages_GBps\": %.2f, \"sgemm_GFLOPs\": %.1f, \"openblas_core\": \"%s\", "
              "\"linear_GFLOPs\": %.1f, \"linear_packed_GFLOPs\": %.1f}\n",
              omp_get_max_threads(), read_bandwidth(true) / 1e9, read_bandwidth(false) / 1e9, sgemm_flops() / 1e9, openblas_get_corename(),
              linear_flops(false) / 1e9, linear_flops(true) / 1e9);
  return 0;
}
