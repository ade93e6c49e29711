// Owns the GPU op benchmark of the MiniMax hybrid (issue 8): lightning prefill throughput against the bf16
// tensor-core roofline, lightning decode state bandwidth, and the MoE block, at the MiniMax-bench shapes
// (16 heads x 128, block 256, hidden 2048, 8 experts top-2). Random inputs; CUDA-event timing (best of N after a
// warm-up). Prints one line per case. Usage: bench_cuda_minimax_ops [peak_bf16_tflops (default 989)] [lightning]
// ("lightning": only the bf16 lightning prefill at 1 x 64k and 8 x 8k, for SSMSERVE_KERNEL_PROFILE=1 / ncu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/moe.h"

using namespace ssmserve;
using cuda::DeviceBuffer;

namespace {

/// Best (or median) time (ms) of `iters` runs of f after one warm-up.
double time_ms(const std::function<void()>& f, int iters = 5, bool median = false) {
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  f();
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  float best = 1e30f;
  std::vector<float> all;
  for (int i = 0; i < iters; ++i) {
    SSM_CUDA_CHECK(cudaEventRecord(a));
    f();
    SSM_CUDA_CHECK(cudaEventRecord(b));
    SSM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
    all.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(all.begin(), all.end());
  return median ? all[all.size() / 2] : best;
}

/// Uniform in [0, 1) from a xorshift64 stream seeded by rng (fast: the 64k-token inputs are 400 M values).
struct FastUniform {
  uint64_t x;
  explicit FastUniform(std::mt19937& rng) : x((uint64_t{rng()} << 32 | rng()) | 1) {}
  float operator()() {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
};

DeviceBuffer random_f32(size_t n, std::mt19937& rng, float lo, float hi) {
  FastUniform u(rng);
  std::vector<float> v(n);
  for (auto& x : v) x = lo + (hi - lo) * u();
  return cuda::to_device(v);
}

DeviceBuffer random_bf16(size_t n, std::mt19937& rng, float scale) {
  FastUniform u(rng);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(scale * (2.0f * u() - 1.0f));
  return cuda::to_device(v);
}

/// only_bf16: just the bf16 path on 1 x 64k and 8 x 8k, one timed call (the per-kernel profile / ncu runs);
/// bf16_all: just the bf16 path on every shape, median of 9 (comparing its variants).
void bench_lightning(double peak_tflops, double gemm_tflops, std::mt19937& rng, bool only_bf16 = false,
                     bool bf16_all = false) {
  const int H = 16, D = 128, bs = 256;
  std::vector<float> slopes(H);
  for (int h = 0; h < H; ++h) slopes[h] = std::pow(0.5f, (h + 1) * 0.5f);
  DeviceBuffer ds = cuda::to_device(slopes);
  const auto shapes = only_bf16 && !bf16_all ? std::vector<std::pair<int, int>>{{1, 65536}, {8, 8192}}
                                : std::vector<std::pair<int, int>>{{1, 1024}, {1, 4096}, {1, 16384}, {1, 65536}, {8, 8192}};
  for (auto [seqs, len] : shapes) {
    const int64_t T = static_cast<int64_t>(seqs) * len, qs = 3LL * H * D, os = static_cast<int64_t>(H) * D;
    std::vector<int32_t> qsl{0}, nc(seqs, 0), idx(seqs);
    for (int s = 0; s < seqs; ++s) qsl.push_back(qsl.back() + len), idx[s] = s + 1;
    // SSMSERVE_BENCH_LIGHTNING_BPR overrides the blocks per range the runner would pick.
    const char* bpr_env = std::getenv("SSMSERVE_BENCH_LIGHTNING_BPR");
    const int bpr = bpr_env ? std::atoi(bpr_env) : cuda::LightningPlan::pick_blocks_per_range(int64_t{seqs} * len, bs, H);
    auto plan = cuda::LightningPlan::build(qsl, nc, bs, bpr);
    DeviceBuffer db = cuda::to_device(plan.blocks), df = cuda::to_device(plan.seq_first_block),
                 dq = cuda::to_device(plan.qtiles), di = cuda::to_device(idx), dn = cuda::to_device(nc);
    DeviceBuffer dr = cuda::to_device(plan.ranges), dfr = cuda::to_device(plan.seq_first_range),
                 dbr = cuda::to_device(plan.block_range);
    DeviceBuffer qkv = only_bf16 ? DeviceBuffer(4) : random_f32(T * qs, rng, -1.0f, 1.0f), out(T * os * 4),
                 ws(cuda::lightning_workspace_floats(plan.num_blocks, H, D) * 4),
                 states(static_cast<size_t>(seqs + 1) * H * D * D * 4);
    cuda::LightningDevParams p{H, D, bs, ds.as<float>(), StateView{states.data(), DType::F32, int64_t{H} * D * D}};
    cuda::LightningPlanDev pd{plan.num_seqs, plan.num_blocks, plan.num_qtiles, db.as<int32_t>(), df.as<int32_t>(),
                              dq.as<int32_t>(), di.as<int32_t>(), dn.as<int32_t>(), plan.num_ranges, dr.as<int32_t>(),
                              dfr.as<int32_t>(), dbr.as<int32_t>()};
    const double ms = only_bf16 ? 1.0 : time_ms([&] {
      SSM_CUDA_CHECK(cuda::lightning_prefill(qkv.as<float>(), qs, out.as<float>(), os, p, pd, ws.as<float>(), nullptr));
    });
    // The bf16 fast path on the same shapes (bf16 q / k / v in, bf16 out, fp32 state), median of 9.
    DeviceBuffer qkv16 = random_bf16(T * qs, rng, 1.0f), out16(T * os * 2);
    const double ms16 = time_ms([&] {
      SSM_CUDA_CHECK(cuda::lightning_prefill_bf16(static_cast<const __nv_bfloat16*>(qkv16.data()), qs,
                                                  static_cast<__nv_bfloat16*>(out16.data()), os, p, pd, ws.as<float>(), nullptr));
    }, only_bf16 && !bf16_all ? 1 : 9, true);
    // Useful bf16 matrix work (what a plain one-pass bf16 kernel would issue): per head and token, the block KV
    // (2 D^2), the inter-block q S (2 D^2) and the causal intra block QK^T and PV (2 x 2 D (bs + 1) / 2).
    const double flops = static_cast<double>(T) * H * (4.0 * D * D + 2.0 * D * (bs + 1));
    const double tflops = flops / (ms * 1e-3) / 1e12;
    if (!only_bf16)
      std::printf("lightning_prefill seqs=%d len=%d H=%d D=%d bs=%d: %.3f ms  %.2f Mtok/s  %.1f TFLOP/s  %.1f%% of %.0f\n",
                  seqs, len, H, D, bs, ms, T / (ms * 1e-3) / 1e6, tflops, 100.0 * tflops / peak_tflops, peak_tflops);
    const double tf16 = flops / (ms16 * 1e-3) / 1e12;
    std::printf("lightning_prefill_bf16 seqs=%d len=%d H=%d D=%d bs=%d: %.3f ms (median)  %.2f Mtok/s  %.1f TFLOP/s  "
                "%.1f%% of %.0f, %.1f%% of the measured GEMM rate %.0f\n", seqs, len, H, D, bs, ms16, T / (ms16 * 1e-3) / 1e6,
                tf16, 100.0 * tf16 / peak_tflops, peak_tflops, 100.0 * tf16 / gemm_tflops, gemm_tflops);
  }
  if (only_bf16) return;
  for (int B : {1, 64, 256}) {
    const int64_t qs = 3LL * H * D, os = static_cast<int64_t>(H) * D;
    std::vector<int32_t> idx(B);
    for (int b = 0; b < B; ++b) idx[b] = b + 1;
    DeviceBuffer di = cuda::to_device(idx), qkv = random_f32(B * qs, rng, -1.0f, 1.0f), out(B * os * 4),
                 states = random_f32(static_cast<size_t>(B + 1) * H * D * D, rng, -0.1f, 0.1f);
    cuda::LightningDevParams p{H, D, bs, ds.as<float>(), StateView{states.data(), DType::F32, int64_t{H} * D * D}};
    const double ms = time_ms([&] {
      SSM_CUDA_CHECK(cuda::lightning_decode(qkv.as<float>(), qs, out.as<float>(), os, p, di.as<int32_t>(), B, nullptr));
    }, 20);
    const double bytes = 2.0 * B * H * D * D * 4;
    std::printf("lightning_decode batch=%d H=%d D=%d fp32 state: %.4f ms  %.0f GB/s state traffic\n", B, H, D, ms,
                bytes / (ms * 1e-3) / 1e9);
  }
}

/// The measured bf16 tensor-core rate of this run: cuBLASLt 8192^3 bf16 GEMM (bf16 out), median of 10.
double bench_gemm() {
  const int64_t n = 8192;
  DeviceBuffer x(n * n * 2), w(n * n * 2), y(n * n * 2);
  x.fill_bytes(0x3c), w.fill_bytes(0x3c);
  cuda::GemmHandle gemm;
  const double ms = time_ms([&] { gemm.run({n, n, n, x.data(), n, w.data(), n, DType::BF16, y.data(), n, DType::BF16}, nullptr); },
                            10, true);
  const double tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
  std::printf("gemm_bf16 8192^3 (cuBLASLt, this run): %.3f ms  %.1f TFLOP/s\n", ms, tflops);
  return tflops;
}

void bench_moe(double peak_tflops, std::mt19937& rng) {
  const int E = 8, k = 2;
  const int64_t Hd = 2048, I = 1024;
  DeviceBuffer w1 = random_bf16(E * I * Hd, rng, 0.05f), w3 = random_bf16(E * I * Hd, rng, 0.05f),
               w2 = random_bf16(E * Hd * I, rng, 0.05f);
  cuda::MoeDevWeights w{E, k, Hd, I, w1.data(), w3.data(), w2.data()};
  for (int64_t T : {int64_t{1}, int64_t{64}, int64_t{4096}, int64_t{16384}}) {
    DeviceBuffer x = random_f32(T * Hd, rng, -1.0f, 1.0f), logits = random_f32(T * E, rng, -2.0f, 2.0f),
                 out(T * Hd * 4), ws(cuda::moe_workspace_bytes(T, w));
    const double ms = time_ms([&] {
      SSM_CUDA_CHECK(cuda::sparse_moe(x.as<float>(), Hd, T, logits.as<float>(), w, out.as<float>(), Hd, ws.data(), nullptr));
    });
    const double flops = 2.0 * T * k * 3 * Hd * I, tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("sparse_moe T=%ld hidden=%ld I=%ld E=%d k=%d: %.3f ms  %.1f TFLOP/s  %.1f%% of %.0f\n",
                static_cast<long>(T), static_cast<long>(Hd), static_cast<long>(I), E, k, ms, tflops,
                100.0 * tflops / peak_tflops, peak_tflops);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::gpu_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const double peak = argc > 1 ? std::atof(argv[1]) : 989.0;  // H100/H200 SXM dense bf16
  std::printf("device: %s\n", cuda::device_description(0).c_str());
  std::mt19937 rng(7);
  if (argc > 2 && std::string(argv[2]) == "lightning") {  // the bf16 lightning prefill alone (profiles)
    bench_lightning(peak, peak, rng, true);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "lightning16") {  // the bf16 lightning prefill alone, every shape
    bench_lightning(peak, argc > 3 ? std::atof(argv[3]) : peak, rng, true, true);
    return 0;
  }
  const double measured = bench_gemm();
  bench_lightning(peak, measured, rng);
  bench_moe(peak, rng);
  return 0;
}
