// Op benchmark of the gated delta rule on the GPU (kernels/cuda/gated_delta.h) at Qwen3.5 shapes (Hk 16, Hv 32,
// Dk = Dv = 128, fp32 state):
//   decode: batch 1..256, state bytes moved (read + write, Hv Dk Dv 4 B x 2 per row) per second against the HBM
//           peak (4.8 TB/s); the rows' blocks rotate over a 4 GiB pool so the state does not sit in L2;
//   prefill: one sequence of 2k..32k tokens and 8 x 4k packed, TFLOP/s of the chunked form's tile products
//           (per 64-token chunk and value head: K S, Q S, K^T V~ at 64 Dk Dv MACs each, K K^T and Q K^T at 64^2 Dk,
//           P V~ at 64^2 Dv; 2 FLOPs per MAC) for both precisions and both paths (fused walk, two-pass); the
//           two-pass form once per walk of KernelTuning::gdn_walk: "old" (0: the previous walk), "w64" (1: the
//           prefetching walk on 64-column tiles), "auto" (2, the default: 32-column tiles when the grid is small).
// Prints one line per case; median of several event-timed repetitions. Needs a GPU. Argument "decode" or
// "prefill": that part only.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/kernel_tuning.h"

namespace {
using namespace ssmserve;
using cuda::DeviceBuffer;

constexpr int Hk = 16, Hv = 32, Dk = 128, Dv = 128;

std::vector<float> random_vec(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Token inputs for T tokens on the device (q, k of unit-ish norm; g, beta in their ranges).
struct DevTokens {
  DeviceBuffer q, k, v, g, b;
  cuda::GatedDeltaInputs in;
  DevTokens(int64_t T, std::mt19937& rng) {
    const float s = 1.0f / 11.3f;  // ~ 1 / sqrt(128): unit-norm rows
    q = cuda::to_device(random_vec(rng, T * Hk * Dk, -s, s));
    k = cuda::to_device(random_vec(rng, T * Hk * Dk, -s, s));
    v = cuda::to_device(random_vec(rng, T * Hv * Dv, -1, 1));
    g = cuda::to_device(random_vec(rng, T * Hv, -1.0f, -0.01f));
    b = cuda::to_device(random_vec(rng, T * Hv, 0.0f, 1.0f));
    in = {q.as<float>(), Hk * Dk, k.as<float>(), Hk * Dk, v.as<float>(), Hv * Dv, g.as<float>(), Hv, b.as<float>(), Hv};
  }
};

template <class F>
float median_ms(F&& launch, int reps, int iters) {
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  launch(0);  // warm-up (module load, smem opt-in)
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    SSM_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) launch(r * iters + i);
    SSM_CUDA_CHECK(cudaEventRecord(b));
    SSM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / iters);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

void bench_decode(std::mt19937& rng) {
  const int64_t block = int64_t{Hv} * Dk * Dv;
  const int blocks = 2048;  // 4 GiB of fp32 states
  DeviceBuffer pool(static_cast<size_t>(block) * (blocks + 1) * 4);
  SSM_CUDA_CHECK(cudaMemset(pool.data(), 0, pool.bytes()));
  cuda::GatedDeltaParams p{Hk, Hv, Dk, Dv, 64, StateView{pool.data(), DType::F32, block}};
  DevTokens tk(256, rng);
  DeviceBuffer out(256 * Hv * Dv * 4);
  for (int B : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    const int rot = blocks / B;  // disjoint block sets, cycled
    std::vector<int32_t> idx(static_cast<size_t>(rot) * B);
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i + 1);
    DeviceBuffer didx = cuda::to_device(idx);
    const float ms = median_ms(
        [&](int it) {
          const int32_t* rows = didx.as<int32_t>() + (it % rot) * B;
          SSM_CUDA_CHECK(cuda::gated_delta_decode(tk.in, p, out.as<float>(), Hv * Dv, rows, B, nullptr));
        },
        7, 50);
    const double bytes = 2.0 * B * block * 4;
    std::printf("decode  B=%-4d %8.2f us  %7.1f GB/s  (%4.1f%% of 4.8 TB/s)\n", B, ms * 1e3, bytes / ms / 1e6,
                100.0 * bytes / ms / 1e6 / 4800);
  }
}

void bench_prefill(std::mt19937& rng) {
  const int64_t block = int64_t{Hv} * Dk * Dv;
  constexpr int kMaxSeqs = 64;  // the largest case below; state block s + 1 for sequence s (block 0: null)
  DeviceBuffer pool(static_cast<size_t>(block) * (kMaxSeqs + 1) * 4);
  SSM_CUDA_CHECK(cudaMemset(pool.data(), 0, pool.bytes()));
  cuda::GatedDeltaParams p{Hk, Hv, Dk, Dv, 64, StateView{pool.data(), DType::F32, block}};
  struct Case {
    const char* name;
    int seqs, len;
  };
  for (const Case c : {Case{"1x2k", 1, 2048}, Case{"1x8k", 1, 8192}, Case{"1x32k", 1, 32768}, Case{"8x4k", 8, 4096},
                       Case{"64x256", 64, 256}}) {
    if (c.seqs > kMaxSeqs) throw std::runtime_error("bench case with more sequences than state blocks");
    const int64_t T = int64_t{c.seqs} * c.len;
    DevTokens tk(T, rng);
    DeviceBuffer out(T * Hv * Dv * 4);
    std::vector<int32_t> qsl{0}, nc(c.seqs, 0), idx;
    for (int s = 0; s < c.seqs; ++s) qsl.push_back(qsl.back() + c.len), idx.push_back(s + 1);
    DeviceBuffer dq = cuda::to_device(qsl), dn = cuda::to_device(nc), di = cuda::to_device(idx);
    const double chunks = static_cast<double>(T) / 64;
    const double flops = 2.0 * chunks * Hv * (3.0 * 64 * Dk * Dv + 2.0 * 64 * 64 * Dk + 64.0 * 64 * Dv);
    DeviceBuffer ws(cuda::gated_delta_prefill_workspace_floats(T, c.seqs, p) * 4);
    std::vector<float> old_out;
    for (int variant : {-1, 0, 1, 2}) {  // -1: fused; else the two-pass form with KernelTuning::gdn_walk = variant
      const bool two_pass = variant >= 0;
      cuda::KernelTuning tune = cuda::kernel_tuning();
      tune.gdn_walk = two_pass ? variant : 2;
      cuda::set_kernel_tuning(tune);
      static const char* const kNames[] = {"fused", "2p-old", "2p-w64", "2p-auto"};
      for (auto prec : {cuda::GatedDeltaPrecision::kFp32, cuda::GatedDeltaPrecision::kTf32}) {
        const float ms = median_ms(
            [&](int) {
              if (two_pass)
                SSM_CUDA_CHECK(cuda::gated_delta_prefill_two_pass(tk.in, p, out.as<float>(), Hv * Dv, dq.as<int32_t>(),
                                                                  dn.as<int32_t>(), di.as<int32_t>(), c.seqs, T,
                                                                  ws.as<float>(), nullptr, prec));
              else
                SSM_CUDA_CHECK(cuda::gated_delta_prefill(tk.in, p, out.as<float>(), Hv * Dv, dq.as<int32_t>(),
                                                         dn.as<int32_t>(), di.as<int32_t>(), c.seqs, nullptr, prec));
            },
            3, 2);
        std::printf("prefill %-6s %-8s %-6s %9.3f ms  %7.2f TFLOP/s  %9.0f tok/s\n", c.name, kNames[variant + 1],
                    prec == cuda::GatedDeltaPrecision::kFp32 ? "3xTF32" : "TF32", ms,
                    flops / ms / 1e9, T / ms * 1e3);
        std::fflush(stdout);  // lines survive a later failure (stdout to a file is fully buffered)
        if (two_pass && prec == cuda::GatedDeltaPrecision::kFp32) {  // the new walks' outputs against the old one's
          std::vector<float> o = cuda::to_host<float>(out, T * Hv * Dv);
          if (variant == 0) {
            old_out = std::move(o);
          } else {
            double num = 0, den = 0;
            for (size_t i = 0; i < o.size(); ++i)
              num += (double(o[i]) - old_out[i]) * (double(o[i]) - old_out[i]), den += double(old_out[i]) * old_out[i];
            std::printf("        %-6s %-8s 3xTF32 outputs vs 2p-old: norm-wise rel diff %.2e\n", c.name,
                        kNames[variant + 1], std::sqrt(num / std::max(den, 1e-300)));
          }
        }
        if (two_pass && c.seqs == 1 && c.len == 32768) {  // one call with per-pass times (stderr)
          std::fflush(stdout);
          std::fprintf(stderr, "profile of %s %s %s:\n", c.name, kNames[variant + 1],
                       prec == cuda::GatedDeltaPrecision::kFp32 ? "3xTF32" : "TF32");
          cuda::KernelTuning pt = cuda::kernel_tuning();
          pt.kernel_profile = true;
          cuda::set_kernel_tuning(pt);
          SSM_CUDA_CHECK(cuda::gated_delta_prefill_two_pass(tk.in, p, out.as<float>(), Hv * Dv, dq.as<int32_t>(),
                                                            dn.as<int32_t>(), di.as<int32_t>(), c.seqs, T,
                                                            ws.as<float>(), nullptr, prec));
          pt.kernel_profile = false;
          cuda::set_kernel_tuning(pt);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!ssmserve::cuda::gpu_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  std::mt19937 rng(1234);
  const std::string only = argc > 1 ? argv[1] : "";  // "decode" / "prefill": that part only
  if (only != "prefill") bench_decode(rng);
  if (only != "decode") bench_prefill(rng);
  return 0;
}
