// Owns the GPU benchmark of the MoE prefill's grouped expert GEMMs (moe_grouped_gemm.h): the mma.sync kernel
// (MoeGemmPath::kMmaSync, SSMSERVE_MOE_GROUPED_WG=0) against the Hopper wgmma kernel (kWgmma) at the expert shapes of
// configs/qwen3.5-35b-a3b (E 256, top-8, hidden 2048, I 512, SiLU-gated: up = moe_grouped_up N 512 K 2048 into bf16
// act, down = N 2048 K 512 into fp32 y), configs/nemotron-3-nano-30b-a3b (E 128, top-6, 2688, 1856, relu^2: up = the
// plain grouped GEMM N 1856 K 2688 into fp32 u, down N 2688 K 1856) and configs/granite-4.0-h-tiny (E 64, top-6, 1536,
// 512, gated), at T = 2048, 8192 and 32768 tokens (P = T * top_k expert-sorted rows) with random routing (top_k distinct
// experts per token, uniform). Every expert is allocated (random bf16, up to 2.6 GB) and the rows are random bf16.
// Prints per GEMM and kernel (mma.sync; wgmma with 128- and 256-wide weight tiles, KernelTuning::moe_grouped_wg 2 and
// 3; '*' marks the default width of the projection) the median ms of 15 timed calls (3 warm-up), TFLOP/s (2 P N K per
// GEMM; 2 P K 2I for the gated up), the speedup over mma.sync ('x') and the relative difference of the output from
// mma.sync's over every 61st row ('d').
// Usage: bench_cuda_moe_prefill [qwen|nemotron|granite] [T ...] (default: all three models at 2048 8192 32768).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda_event_timing.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe_grouped_gemm.h"

using namespace ssmserve;
using cuda::DeviceBuffer;
using cuda::detail::MoeGemmPath;
using bf16 = __nv_bfloat16;

namespace {

struct Shape {
  const char* name;
  int E, k;
  int64_t hidden, inter;
  bool gated;
};

/// Fills `bytes` of `b` with random bf16 values in [-a, a): a 32 MB random block, repeated.
void fill_random_bf16(DeviceBuffer& b, size_t bytes, float a, uint64_t seed) {
  const size_t block = std::min<size_t>(bytes / 2, size_t{16} << 20);
  std::vector<uint16_t> v(block);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
  for (auto& h : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h = f32_to_bf16((static_cast<float>(x >> 40) * (1.0f / 8388608.0f) - 1.0f) * a);
  }
  for (size_t off = 0; off < bytes; off += block * 2) b.upload(v.data(), std::min(block * 2, bytes - off), off);
}

/// Every 61st row of an output [P, N] (bf16 when `half`) as floats.
std::vector<float> sample_rows(const DeviceBuffer& out, int64_t P, int64_t N, bool half) {
  std::vector<float> v;
  const size_t esz = half ? 2 : 4;
  std::vector<unsigned char> row(N * esz);
  for (int64_t r = 0; r < P; r += 61) {
    out.download(row.data(), row.size(), r * N * esz);
    for (int64_t n = 0; n < N; ++n) {
      if (half) {
        uint16_t h;
        std::memcpy(&h, row.data() + n * 2, 2);
        v.push_back(bf16_to_f32(h));
      } else {
        float f;
        std::memcpy(&f, row.data() + n * 4, 4);
        v.push_back(f);
      }
    }
  }
  return v;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void run_shape(const Shape& s, const std::vector<int64_t>& tokens) {
  const int64_t H = s.hidden, I = s.inter;
  const int E = s.E;
  // Experts: w1 (and w3) [E, I, H], w2 [E, H, I].
  DeviceBuffer w1(E * I * H * 2), w3(s.gated ? E * I * H * 2 : 16), w2(E * H * I * 2);
  fill_random_bf16(w1, w1.bytes(), 2.0f / std::sqrt(static_cast<float>(H)), 1);
  if (s.gated) fill_random_bf16(w3, w3.bytes(), 2.0f / std::sqrt(static_cast<float>(H)), 2);
  fill_random_bf16(w2, w2.bytes(), 2.0f / std::sqrt(static_cast<float>(I)), 3);
  std::mt19937 rng(42);
  for (int64_t T : tokens) {
    const int64_t P = T * s.k;
    std::vector<int32_t> counts(E, 0), ids(E);
    for (int e = 0; e < E; ++e) ids[e] = e;
    for (int64_t t = 0; t < T; ++t) {  // top_k distinct experts per token (partial Fisher-Yates)
      for (int j = 0; j < s.k; ++j) {
        std::uniform_int_distribution<int> d(j, E - 1);
        std::swap(ids[j], ids[d(rng)]);
        ++counts[ids[j]];
      }
    }
    std::vector<int32_t> offsets(E + 1, 0);
    for (int e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
    DeviceBuffer doff = cuda::to_device(offsets), xg(P * H * 2), act(P * I * 2), u(s.gated ? 16 : P * I * 4),
                 y(P * H * 4);
    fill_random_bf16(xg, xg.bytes(), 1.0f, 4 + T);
    fill_random_bf16(act, act.bytes(), 1.0f, 5 + T);  // the down GEMM's input (the up's output is timed apart)
    const int* off = doff.as<int32_t>();
    auto up = [&](MoeGemmPath path) {
      if (s.gated)
        SSM_CUDA_CHECK(cuda::detail::moe_grouped_up(xg.as<bf16>(), off, P, E, w1.as<bf16>(), w3.as<bf16>(), I, H,
                                                    act.as<bf16>(), nullptr, path));
      else
        SSM_CUDA_CHECK(cuda::detail::moe_grouped_down(xg.as<bf16>(), off, P, E, w1.as<bf16>(), I, H, u.as<float>(),
                                                      nullptr, path));
    };
    auto down = [&](MoeGemmPath path) {
      SSM_CUDA_CHECK(cuda::detail::moe_grouped_down(act.as<bf16>(), off, P, E, w2.as<bf16>(), H, I, y.as<float>(),
                                                    nullptr, path));
    };
    struct Variant {
      const char* name;
      MoeGemmPath path;
      int tuning;  // KernelTuning::moe_grouped_wg: 2 / 3 the wgmma kernel's 128- / 256-wide tiles
    };
    const Variant variants[] = {{"mma.sync", MoeGemmPath::kMmaSync, 0},
                                {"wg128", MoeGemmPath::kWgmma, 2},
                                {"wg256", MoeGemmPath::kWgmma, 3}};
    const double up_flop = 2.0 * static_cast<double>(P) * H * I * (s.gated ? 2 : 1);
    const double down_flop = 2.0 * static_cast<double>(P) * H * I;
    // Down first: the gated up overwrites act, the down's input.
    for (int op = 1; op >= 0; --op) {
      const bool is_up = op == 0;
      const DeviceBuffer& out = is_up ? (s.gated ? act : u) : y;
      const int64_t N = is_up ? I : H;
      const bool half = is_up && s.gated;
      const double flop = is_up ? up_flop : down_flop;
      std::printf("%-9s T %6lld P %7lld %-4s N %5lld K %5lld |", s.name, static_cast<long long>(T),
                  static_cast<long long>(P), is_up ? "up" : "down", static_cast<long long>(N),
                  static_cast<long long>(is_up ? H : I));
      std::vector<float> ref;
      double ms_old = NAN;
      for (const Variant& v : variants) {
        if (v.path == MoeGemmPath::kWgmma && !cuda::detail::moe_grouped_wg_supported()) continue;
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.moe_grouped_wg = v.tuning;
        cuda::set_kernel_tuning(t);
        const double ms = bench::median_ms([&] { is_up ? up(v.path) : down(v.path); });
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = sample_rows(out, P, N, half);
        // The default width of this call (KernelTuning::moe_grouped_wg 1: 256 from K = kWideTileMinK) starred.
        const bool dflt = v.tuning == ((is_up ? H : I) >= cuda::detail::kWideTileMinK ? 3 : 2);
        std::printf(" %s%s %7.3f ms %5.1f TF/s", v.name, dflt ? "*" : "", ms, flop / ms * 1e-9);
        if (ref.empty()) {
          ref = got, ms_old = ms;
        } else {
          std::printf(" x%.2f d %.1e", ms_old / ms, rel_diff(got, ref));
        }
        std::printf(" |");
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::gpu_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const std::vector<Shape> all = {{"qwen", 256, 8, 2048, 512, true},
                                  {"nemotron", 128, 6, 2688, 1856, false},
                                  {"granite", 64, 6, 1536, 512, true}};
  std::vector<Shape> shapes;
  std::vector<int64_t> tokens;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    bool named = false;
    for (const Shape& s : all)
      if (a == s.name) shapes.push_back(s), named = true;
    if (named) continue;
    const long long t = std::atoll(argv[i]);
    if (t <= 0) {
      std::fprintf(stderr, "usage: %s [qwen|nemotron|granite] [T ...]\n", argv[0]);
      return 2;
    }
    tokens.push_back(t);
  }
  if (shapes.empty()) shapes = all;
  if (tokens.empty()) tokens = {2048, 8192, 32768};
  std::printf("grouped expert GEMMs, sm_90 wgmma kernel %s\n",
              cuda::detail::moe_grouped_wg_supported() ? "available" : "NOT available (mma.sync only)");
  for (const Shape& s : shapes) run_shape(s, tokens);
  return 0;
}
