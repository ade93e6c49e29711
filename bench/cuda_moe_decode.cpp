// Owns the GPU benchmark of the MoE decode path (issues 30, 31): sparse_moe at T = 1 and 2 tokens (the per-pair
// GEMVs: route, up, down, combine) at the expert shapes of configs/nemotron-3-nano-30b-a3b (E 128, top-6, hidden 2688,
// I 1856, relu^2), configs/qwen3.5-35b-a3b (E 256, top-8, 2048, 512, SiLU-gated) and configs/granite-4.0-h-tiny (E 64,
// top-6, 1536, 512, SiLU-gated), old kernels (KernelTuning::moe_pair_gemv off, SSMSERVE_MOE_PAIR_GEMV=0) against the
// new ones with the moe.cu rule and every rows-per-warp x warps-per-block x one-wave shape ("tune r,w,o": the
// SSMSERVE_MOE_PAIR_TUNE value that selects it). Every expert of the model is allocated (0.3 to 2.6 GB, so the chosen
// experts come from HBM, not the 50 MB L2) and each call routes from its own random logits (64 sets, cycled). Timing: 64 calls captured in a CUDA graph with PDL (the
// decode step's form), replayed; and the same 64 calls as plain stream launches. Prints us per layer and GB/s over
// the expert bytes the pairs stream (P * (2 or 3) * I * hidden * 2 bytes; at T = 2 a shared expert is read twice).
// Usage: bench_cuda_moe_decode [nemotron|qwen|granite] [profile|sweep] (default: all three; profile: also the
// per-kernel event times (SSMSERVE_KERNEL_PROFILE's LaunchProfile) of 3 eager calls of the old kernels and the rule's,
// on stderr; sweep: T = 1 .. 64, the default path against per-pair GEMVs on sorted rows, see sweep()).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"

using namespace ssmserve;
using cuda::DeviceBuffer;

namespace {

struct Shape {
  const char* name;
  int E, k;
  int64_t hidden, inter;
  bool gated;
};

constexpr int kCalls = 64;  // calls per graph / timed loop, each with its own routing

/// Time (us) of one call: best of `reps` runs of `calls` calls made by `f`.
template <class F>
double us_per_call(F&& f, cudaStream_t s, int reps = 7) {
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  f();  // warm-up
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  float best = 1e30f;
  for (int i = 0; i < reps; ++i) {
    SSM_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    SSM_CUDA_CHECK(cudaEventRecord(b, s));
    SSM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  SSM_CUDA_CHECK(cudaEventDestroy(a));
  SSM_CUDA_CHECK(cudaEventDestroy(b));
  return 1000.0 * best / kCalls;
}

/// us_per_call of `calls(true)` (kCalls calls with PDL) captured in one CUDA graph and replayed; `calls(false)` runs
/// once eagerly first (module loading and occupancy queries outside the capture).
template <class Calls>
double graph_us_per_call(Calls&& calls, cudaStream_t stream, int reps = 7) {
  calls(false);
  SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SSM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  calls(true);
  SSM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  SSM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = us_per_call([&] { SSM_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }, stream, reps);
  SSM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SSM_CUDA_CHECK(cudaGraphDestroy(graph));
  return us;
}

void bench(const Shape& sh, cudaStream_t stream, bool profile) {
  const size_t mat = static_cast<size_t>(sh.E) * sh.inter * sh.hidden * 2;  // bytes of one stacked projection
  DeviceBuffer w1(mat), w3(sh.gated ? mat : 16), w2(mat);
  // Values do not change the time: a constant bf16 (0x3c3c, ~0.0115) everywhere.
  w1.fill_bytes(0x3c), w2.fill_bytes(0x3c);
  if (sh.gated) w3.fill_bytes(0x3c);
  SSM_CUDA_CHECK(cudaDeviceSynchronize());  // the fills run on the legacy stream, the bench on its own
  std::printf("%s: E %d top-%d hidden %lld I %lld %s, %.2f GB of experts\n", sh.name, sh.E, sh.k,
              static_cast<long long>(sh.hidden), static_cast<long long>(sh.inter), sh.gated ? "SiLU-gated" : "relu^2",
              (sh.gated ? 3.0 : 2.0) * static_cast<double>(mat) / 1e9);
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  cuda::MoeDevWeights w{sh.E, sh.k, sh.hidden, sh.inter, w1.data(), sh.gated ? w3.data() : nullptr, w2.data(),
                        cuda::MoeRouteParams{}};
  struct Config {
    std::string label;
    bool gemv;
    int rows, warps;
    bool one_wave;
  };
  std::vector<Config> configs = {{"old (SSMSERVE_MOE_PAIR_GEMV=0)", false, 0, 0, false},
                                 {"new, rule", true, 0, 0, false},
                                 {"new, rule, one wave", true, 0, 0, true}};
  for (int r : {1, 2, 4})
    for (int wp : {4, 8})
      for (bool ow : {false, true})
        configs.push_back({"new, tune " + std::to_string(r) + "," + std::to_string(wp) + "," + (ow ? "1" : "0"), true,
                           r, wp, ow});
  const cuda::KernelTuning saved = cuda::kernel_tuning();
  for (int64_t T : {int64_t{1}, int64_t{2}}) {
    const int64_t P = T * sh.k;
    std::vector<float> logits(static_cast<size_t>(kCalls) * T * sh.E), x(static_cast<size_t>(T) * sh.hidden);
    for (auto& v : logits) v = d(rng);
    for (auto& v : x) v = d(rng) / 3.0f;
    DeviceBuffer dl = cuda::to_device(logits), dx = cuda::to_device(x), out(static_cast<size_t>(T) * sh.hidden * 4),
                 ws(cuda::moe_workspace_bytes(T, w));
    const double bytes = static_cast<double>(P) * (sh.gated ? 3.0 : 2.0) * sh.inter * sh.hidden * 2;
    auto calls = [&](bool pdl) {
      for (int i = 0; i < kCalls; ++i)
        SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), sh.hidden, T, dl.as<float>() + static_cast<int64_t>(i) * T * sh.E,
                                        w, out.as<float>(), sh.hidden, ws.data(), stream, pdl));
    };
    for (const Config& c : configs) {
      cuda::KernelTuning t = saved;
      t.moe_pair_gemv = c.gemv, t.moe_pair_rows = c.rows, t.moe_pair_warps = c.warps, t.moe_pair_one_wave = c.one_wave;
      cuda::set_kernel_tuning(t);  // read by sparse_moe's host code at launch / capture
      const double g_us = graph_us_per_call(calls, stream);
      const double s_us = us_per_call([&] { calls(false); }, stream);
      std::printf("  T %lld (%2lld pairs, %6.1f MB)  %-32s graph+pdl %7.2f us/layer %7.0f GB/s   stream %7.2f us/layer %7.0f GB/s\n",
                  static_cast<long long>(T), static_cast<long long>(P), bytes / 1e6, c.label.c_str(), g_us,
                  bytes / (g_us * 1e-6) / 1e9, s_us, bytes / (s_us * 1e-6) / 1e9);
      std::fflush(stdout);
      if (profile && (c.label.rfind("old", 0) == 0 || c.label == "new, rule")) {
        // Per-kernel event times of 3 eager calls (stderr "profile moe ..." lines; up streams P * (1 or 2) * I *
        // hidden * 2 bytes, down P * hidden * I * 2).
        std::fprintf(stderr, "  profile %s T %lld (%s): up %.1f MB, down %.1f MB\n", sh.name, static_cast<long long>(T),
                     c.label.c_str(), static_cast<double>(P) * (sh.gated ? 2 : 1) * sh.inter * sh.hidden * 2 / 1e6,
                     static_cast<double>(P) * sh.inter * sh.hidden * 2 / 1e6);
        t.kernel_profile = true;
        cuda::set_kernel_tuning(t);
        for (int i = 0; i < 3; ++i)
          SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), sh.hidden, T, dl.as<float>() + static_cast<int64_t>(i) * T * sh.E,
                                          w, out.as<float>(), sh.hidden, ws.data(), stream, false));
        SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
    }
  }
  cuda::set_kernel_tuning(saved);
}

/// "sweep": sparse_moe at T = 1 .. 64 tokens on the default path (per-pair GEMVs up to 16 pairs, the grouped
/// tensor-core GEMMs above) against the per-pair GEMVs on expert-sorted rows (MoeDevWeights::per_pair, what
/// batch-invariant mode runs at every T), graph + PDL, random routing per call. Bytes: the distinct experts the calls
/// touch on average (each read once from HBM at best).
void sweep(const Shape& sh, cudaStream_t stream) {
  const size_t mat = static_cast<size_t>(sh.E) * sh.inter * sh.hidden * 2;
  DeviceBuffer w1(mat), w3(sh.gated ? mat : 16), w2(mat);
  w1.fill_bytes(0x3c), w2.fill_bytes(0x3c);
  if (sh.gated) w3.fill_bytes(0x3c);
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("sweep %s: E %d top-%d hidden %lld I %lld\n", sh.name, sh.E, sh.k, static_cast<long long>(sh.hidden),
              static_cast<long long>(sh.inter));
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  const double expert_bytes = (sh.gated ? 3.0 : 2.0) * static_cast<double>(sh.inter) * sh.hidden * 2;
  for (int64_t T : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64}) {
    std::vector<float> logits(static_cast<size_t>(kCalls) * T * sh.E), x(static_cast<size_t>(T) * sh.hidden);
    for (auto& v : logits) v = d(rng);
    for (auto& v : x) v = d(rng) / 3.0f;
    // Distinct experts per call (the top-k of each token's logits), averaged over the calls.
    double distinct = 0;
    for (int i = 0; i < kCalls; ++i) {
      std::vector<char> used(static_cast<size_t>(sh.E), 0);
      for (int64_t t = 0; t < T; ++t) {
        const float* l = logits.data() + (static_cast<int64_t>(i) * T + t) * sh.E;
        std::vector<int> idx(static_cast<size_t>(sh.E));
        for (int e = 0; e < sh.E; ++e) idx[static_cast<size_t>(e)] = e;
        std::partial_sort(idx.begin(), idx.begin() + sh.k, idx.end(), [&](int a, int b) { return l[a] > l[b]; });
        for (int j = 0; j < sh.k; ++j) used[static_cast<size_t>(idx[static_cast<size_t>(j)])] = 1;
      }
      distinct += static_cast<double>(std::count(used.begin(), used.end(), 1)) / kCalls;
    }
    DeviceBuffer dl = cuda::to_device(logits), dx = cuda::to_device(x), out(static_cast<size_t>(T) * sh.hidden * 4);
    double us[2];
    for (int pp = 0; pp < 2; ++pp) {
      cuda::MoeDevWeights w{sh.E, sh.k, sh.hidden, sh.inter, w1.data(), sh.gated ? w3.data() : nullptr, w2.data(),
                            cuda::MoeRouteParams{}};
      w.per_pair = pp == 1;
      DeviceBuffer ws(cuda::moe_workspace_bytes(T, w));
      auto calls = [&](bool pdl) {
        for (int i = 0; i < kCalls; ++i)
          SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), sh.hidden, T, dl.as<float>() + static_cast<int64_t>(i) * T * sh.E,
                                          w, out.as<float>(), sh.hidden, ws.data(), stream, pdl));
      };
      us[pp] = graph_us_per_call(calls, stream, 5);
    }
    const double gb = distinct * expert_bytes / 1e9;
    std::printf("  T %3lld (%4lld pairs, %5.1f experts, %6.1f MB)  default %8.2f us (%5.0f GB/s)   per-pair sorted %8.2f us "
                "(%5.0f GB/s)\n",
                static_cast<long long>(T), static_cast<long long>(T * sh.k), distinct, gb * 1e3, us[0], gb / (us[0] * 1e-6),
                us[1], gb / (us[1] * 1e-6));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::gpu_available()) {
    std::fprintf(stderr, "bench_cuda_moe_decode: no CUDA device\n");
    return 1;
  }
  std::string only;
  bool profile = false, do_sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "profile") profile = true;
    else if (std::string(argv[i]) == "sweep") do_sweep = true;
    else only = argv[i];
  }
  const Shape shapes[] = {{"nemotron-3-nano-30b-a3b", 128, 6, 2688, 1856, false},
                          {"qwen3.5-35b-a3b", 256, 8, 2048, 512, true},
                          {"granite-4.0-h-tiny", 64, 6, 1536, 512, true}};
  cudaStream_t stream;
  SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {  // the HBM roofline for reference: a 1 GiB device-to-device copy (reads + writes)
    const size_t n = size_t{1} << 30;
    DeviceBuffer a(n), b(n);
    a.fill_bytes(1);
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const double us = us_per_call([&] {
      for (int i = 0; i < kCalls; ++i) SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, stream));
    }, stream, 3);
    std::printf("roofline: 1 GiB device copy %.0f GB/s (read + write)\n", 2.0 * static_cast<double>(n) / (us * 1e-6) / 1e9);
  }
  for (const Shape& s : shapes)
    if (only.empty() || std::string(s.name).find(only) != std::string::npos) {
      if (do_sweep) sweep(s, stream);
      else bench(s, stream, profile);
    }
  SSM_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
