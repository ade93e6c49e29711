// GPU decode benchmarks (issue 7; DISABLED_, scripts/gpu-check.sh runs them with --gtest_also_run_disabled_tests):
// copy bandwidth and the bf16 GEMM rate, the skinny GEMM vs cuBLASLt per M at the decode projections and LM heads
// (and every tuning variant), and the mamba-2.8b decode layer chain in CUDA graphs (the op chain).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/mamba1_decode_layer.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// Mean milliseconds of `f` over `iters` runs after 3 warmups, by CUDA events on the legacy stream.
template <class F>
double time_ms(F&& f, int iters = 20, cudaStream_t s = nullptr) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  SSM_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  SSM_CUDA_CHECK(cudaEventRecord(b, s));
  SSM_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

TEST(CudaDecodeBench, DISABLED_RooflinesAndGemms) {
  REQUIRE_GPU();
  // 1. Device-to-device copy bandwidth (bytes read + written) and the bf16 GEMM rate (cuBLASLt, 8192^3).
  {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer a(bytes), b(bytes);
    a.fill_bytes(1);
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr)); }, 10);
    std::printf("roofline copy_bandwidth_TBps %.3f\n", 2.0 * bytes / (ms * 1e-3) / 1e12);
  }
  cuda::GemmHandle gemm;
  gemm.set_skinny_max_m(0);  // cuBLASLt
  {
    const int64_t n = 8192;
    std::mt19937 rng(1);
    auto v = rand_vec(rng, n * n);
    DeviceBuffer x = to_device(to_bf16_bits(v)), w = to_device(to_bf16_bits(v)), y(n * n * 2);
    const double ms = time_ms([&] { gemm.run({n, n, n, x.data(), n, w.data(), n, DType::BF16, y.data(), n, DType::BF16}, nullptr); }, 10);
    std::printf("roofline bf16_gemm_TFLOPs %.1f\n", 2.0 * n * n * n / (ms * 1e-3) / 1e12);
  }
  // 2. Skinny GEMM vs cuBLASLt at the decode projections and LM heads, per M, with the weights rotated over
  //    copies of >= 256 MB in all (so every launch streams its weight from HBM, not from the 60 MB L2); launches
  //    back to back on one stream with PDL, as in the decode graphs. Then every tuning variant at M = 1 and 16.
  const std::vector<Shape> shapes = {
      {"m1-2.8b.in_proj", 10240, 2560}, {"m1-2.8b.x_proj", 192, 5120},  {"m1-2.8b.dt_proj", 5120, 160},
      {"m1-2.8b.out_proj", 2560, 5120}, {"m2-2.7b.in_proj", 10576, 2560}, {"m1-1.4b.in_proj", 8192, 2048},
      {"m1-1.4b.x_proj", 160, 4096},    {"m1-1.4b.out_proj", 2048, 4096}, {"m1-130m.in_proj", 3072, 768},
      {"m1-130m.x_proj", 80, 1536},     {"m1-130m.out_proj", 768, 1536},  {"lm_head.2560", 50280, 2560},
      {"lm_head.2048", 50280, 2048},    {"lm_head.768", 50280, 768}};
  cuda::Stream stream;
  std::mt19937 rng(2);
  for (const auto& sh : shapes) {
    const int64_t Mmax = 256;
    const size_t wbytes = static_cast<size_t>(sh.N * sh.K * 2);
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / wbytes + 1, 2, 256));
    auto xv = rand_vec(rng, Mmax * sh.K), wv = rand_vec(rng, sh.N * sh.K, -0.05f, 0.05f);
    DeviceBuffer x = to_device(to_bf16_bits(xv)), y(Mmax * sh.N * 4);
    const auto wb = to_bf16_bits(wv);
    std::vector<DeviceBuffer> w;
    for (int i = 0; i < copies; ++i) w.push_back(to_device(wb));
    int next = 0;
    auto args = [&](int64_t M) {
      next = (next + 1) % copies;
      return cuda::GemmArgs{M, sh.N, sh.K, x.data(), sh.K, w[next].data(), sh.K, DType::BF16, y.data(), sh.N, DType::F32};
    };
    auto on_stream = [&](auto&& f) {
      return time_ms([&] { f(); }, 40, stream.get());
    };
    for (int64_t M : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      const double sk = on_stream([&] { SSM_CUDA_CHECK(skinny(args(M), nullptr, 0, true, stream.get())); });
      const double lt = on_stream([&] { gemm.run(args(M), stream.get()); });
      std::printf("gemm %-18s M=%-4ld skinny %8.2f us (%6.2f TB/s, %6.1f TFLOP/s)  cublaslt %8.2f us (%6.2f TB/s, %6.1f TFLOP/s)\n",
                  sh.name.c_str(), static_cast<long>(M), sk * 1e3, wbytes / (sk * 1e-3) / 1e12,
                  2.0 * M * sh.N * sh.K / (sk * 1e-3) / 1e12, lt * 1e3, wbytes / (lt * 1e-3) / 1e12,
                  2.0 * M * sh.N * sh.K / (lt * 1e-3) / 1e12);
    }
    for (int64_t M : {1, 16}) {
      double best = 1e30;
      std::string best_name;
      for (const auto& tu : tunings()) {
        cuda::SkinnyExtras ex;
        ex.tuning = &tu;
        const double ms = on_stream([&] { SSM_CUDA_CHECK(skinny(args(M), nullptr, 0, true, stream.get(), ex)); });
        char name[64];
        std::snprintf(name, sizeof(name), "u%d%s%s%+d/%d", tu.unroll, tu.pipelined ? "p" : "", tu.reg_cap ? "c" : "",
                      tu.split_shift, tu.cta_splits);
        std::printf("tune %-18s M=%-3ld %-8s splits %-3d %8.2f us (%6.2f TB/s)\n", sh.name.c_str(), static_cast<long>(M),
                    name, cuda::skinny_gemm_splits(sh.N, sh.K, tu.split_shift), ms * 1e3, wbytes / (ms * 1e-3) / 1e12);
        if (ms < best) best = ms, best_name = name;
      }
      std::printf("best %-18s M=%-3ld %-8s %8.2f us (%6.2f TB/s)\n", sh.name.c_str(), static_cast<long>(M),
                  best_name.c_str(), best * 1e3, wbytes / (best * 1e-3) / 1e12);
    }
  }
}

/// Mean microseconds per launch of `launch` (called `n` times, each one launch on `s`), captured into one CUDA graph
/// and replayed (the decode step's form: no host launch cost in the time, PDL edges where the launches ask for them).
template <class F>
double graph_us_per_launch(F&& launch, int n, cudaStream_t s) {
  launch();  // sizes any workspace outside the capture
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) launch();
  SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  SSM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaGraphLaunch(ge, s)); }, 10, s);
  SSM_CUDA_CHECK(cudaGraphExecDestroy(ge));
  SSM_CUDA_CHECK(cudaGraphDestroy(g));
  return ms * 1e3 / n;
}

/// Batch-1 (M = 1) skinny GEMMs at the given weight shapes (N x K): the default launch against split / unroll /
/// block-reduction variants, max(40, copies) launches captured in a CUDA graph with PDL (the next launch's weight
/// preload overlaps the previous one, as in a decode graph) and without (every launch's ramp-up and tail exposed).
/// Weight copies rotate through >= 256 MB (at most 96 copies, each launched once per replay) so they come from HBM.
/// Variant names: u<unroll>[p]<split shift>/<splits per block>.
void sweep_decode_gemms(const std::vector<Shape>& shapes) {
  // "default" is skinny_default_tuning with its shape rules, "split0" with the split rule before session 40
  // (SSMSERVE_SKINNY_SPLIT_RULE=0), "rules0" without any shape rule (SSMSERVE_SKINNY_RULES=0).
  std::vector<std::pair<std::string, std::optional<cuda::SkinnyTuning>>> variants = {
      {"default", std::nullopt}, {"split0", std::nullopt}, {"rules0", std::nullopt}};
  for (int shift : {-2, -1, 0, 1, 2})
    for (int cta : {4, 16})
      for (int u : {2, 4, 8}) {
        const cuda::SkinnyTuning t{u, u == 2, false, shift, cta};
        char name[32];
        std::snprintf(name, sizeof(name), "u%d%s%+d/%d", u, u == 2 ? "p" : "", shift, cta);
        variants.emplace_back(name, t);
      }
  cuda::Stream stream;
  std::mt19937 rng(3);
  for (const auto& sh : shapes) {
    const size_t wbytes = static_cast<size_t>(sh.N * sh.K * 2);
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / wbytes + 1, 2, 96));
    const int launches = std::max(40, copies);  // one graph replay touches every copy
    DeviceBuffer x = to_device(to_bf16_bits(rand_vec(rng, sh.K))), y(sh.N * 4);
    const auto wb = to_bf16_bits(rand_vec(rng, sh.N * sh.K, -0.05f, 0.05f));
    std::vector<DeviceBuffer> w;
    for (int i = 0; i < copies; ++i) w.push_back(to_device(wb));
    int next = 0;
    for (const auto& [name, tu] : variants) {
      cuda::SkinnyExtras ex;
      if (tu) ex.tuning = &*tu;
      cuda::KernelTuning kt = cuda::kernel_tuning();
      kt.skinny_rules = name != "rules0";
      if (name == "split0") kt.skinny_split_rule = 0;
      const TuningScope scope(kt);
      double us[2];
      for (int pdl = 0; pdl < 2; ++pdl)
        us[pdl] = graph_us_per_launch([&] {
          next = (next + 1) % copies;
          SSM_CUDA_CHECK(skinny({1, sh.N, sh.K, x.data(), sh.K, w[next].data(), sh.K, DType::BF16, y.data(), sh.N, DType::F32},
                                nullptr, 0, pdl != 0, stream.get(), ex));
        }, launches, stream.get());
      const cuda::SkinnyTuning used = tu ? *tu : cuda::skinny_default_tuning(1, sh.N, sh.K);
      const int splits = cuda::skinny_gemm_splits(sh.N, sh.K, used.split_shift);
      std::printf("hgemm %-14s %6ld x %5ld %5.1f MB %-8s splits %2d/%-2d pdl %7.2f us %5.2f TB/s  plain %7.2f us %5.2f TB/s\n",
                  sh.name.c_str(), static_cast<long>(sh.N), static_cast<long>(sh.K), wbytes / 1e6, name.c_str(), splits,
                  std::min(splits, used.cta_splits), us[1], wbytes / (us[1] * 1e-6) / 1e12, us[0],
                  wbytes / (us[0] * 1e-6) / 1e12);
    }
  }
}

TEST(CudaDecodeBench, DISABLED_HybridDecodeGemms) {
  REQUIRE_GPU();
  sweep_decode_gemms({{"q9.gdn_in", 12352, 4096},   {"q9.o_proj", 4096, 4096},    {"q9.gate_up", 24576, 4096},
                      {"q9.down", 4096, 12288},     {"q9.attn_qkvg", 10240, 4096}, {"q9.lm_head", 248320, 4096},
                      {"f7.gate_up", 24576, 3072},  {"f7.down", 3072, 12288},     {"f7.attn_o", 3072, 1536},
                      {"f7.lm_head", 130049, 3072}, {"q27.gate_up", 34816, 5120}, {"q27.down", 5120, 17408},
                      {"m28.lm_head", 50280, 2560}, {"m28.out_proj", 2560, 5120}, {"n9.down", 4480, 15680}});
}

/// The same sweep at the dense projections of the MoE hybrids (Granite-4.0-H-Tiny, Nemotron-3-Nano-30B-A3B,
/// Qwen3.5-35B-A3B): 3-20 MB weights, where a launch's ramp-up and tail weigh most.
TEST(CudaDecodeBench, DISABLED_MoeModelDecodeGemms) {
  REQUIRE_GPU();
  sweep_decode_gemms({{"gt.in_proj", 6448, 1536},     {"gt.out_proj", 1536, 3072},  {"gt.sh_gate_up", 2048, 1536},
                      {"gt.sh_down", 1536, 1024},     {"gt.lm_head", 100352, 1536},     {"n3.in_proj", 10304, 2688},  {"n3.out_proj", 2688, 4096},
                      {"n3.sh_up", 3712, 2688},       {"n3.sh_down", 2688, 3712},   {"q35.gdn_in", 12352, 2048},
                      {"q35.gdn_out", 2048, 4096},    {"q35.sh_gate_up", 1024, 2048}, {"q35.sh_down", 2048, 512}});
}

/// The mamba-2.8b decode layer stack (64 layers, random bf16 weights, fp32 states) as the runner enqueues it,
/// captured into one CUDA graph per variant and replayed: where a decode step's time goes inside a graph (GEMMs
/// alone, the op chain, per GEMM tuning).
TEST(CudaDecodeBench, DISABLED_LayerChain) {
  REQUIRE_GPU();
  {  // the decode roofline's bandwidth in the same run: device-to-device copy (bytes read + written)
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer a(bytes), b(bytes);
    a.fill_bytes(1);
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr)); }, 10);
    std::printf("roofline copy_bandwidth_TBps %.3f\n", 2.0 * bytes / (ms * 1e-3) / 1e12);
  }
  const int64_t H = 2560, I = 5120, N = 16, R = 160, XD = R + 2 * N, W = 4;
  const int layers = 64;
  const float eps = 1e-5f;
  std::mt19937 rng(3);
  auto bf = [&](int64_t n, float a) { return to_bf16_bits(rand_vec(rng, n, -a, a)); };
  const auto w_in = bf(2 * I * H, 0.02f), w_x = bf(XD * I, 0.02f), w_dt = bf(I * R, 0.05f), w_out = bf(H * I, 0.02f);
  const auto normw = rand_vec(rng, H, 0.9f, 1.1f), convw = rand_vec(rng, I * W, -0.3f, 0.3f),
             convb = rand_vec(rng, I, -0.1f, 0.1f), dtb = rand_vec(rng, I, -4.0f, -2.0f), Dv = rand_vec(rng, I);
  std::vector<float> A(I * N);
  for (int64_t c = 0; c < I; ++c)
    for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1);
  struct LayerW {
    DeviceBuffer in, x, dt, out, norm, cw, cb, dtb, A, D, conv_state, ssm_state;
  };
  const int Mmax = 16;
  std::vector<LayerW> Ls(layers);
  for (auto& l : Ls) {
    l.in = to_device(w_in), l.x = to_device(w_x), l.dt = to_device(w_dt), l.out = to_device(w_out);
    l.norm = to_device(normw), l.cw = to_device(convw), l.cb = to_device(convb), l.dtb = to_device(dtb);
    l.A = to_device(A), l.D = to_device(Dv);
    l.conv_state = DeviceBuffer((Mmax + 1) * (W - 1) * I * 4), l.ssm_state = DeviceBuffer((Mmax + 1) * I * N * 4);
    l.conv_state.fill_bytes(0), l.ssm_state.fill_bytes(0);
  }
  std::vector<int32_t> si(Mmax);
  for (int i = 0; i < Mmax; ++i) si[i] = i + 1;
  DeviceBuffer dsi = to_device(si);
  DeviceBuffer hidden(Mmax * H * 4), out(Mmax * H * 4), normed(Mmax * H * 2), xz(Mmax * 2 * I * 4), xc(Mmax * I * 4),
      xc16(Mmax * I * 2), xdbl(Mmax * XD * 4), xdbl16(Mmax * XD * 2), delta(Mmax * I * 4), y16(Mmax * I * 2);
  hidden.fill_bytes(0), out.fill_bytes(0);
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const cuda::SkinnyTuning* tuning = nullptr;
  auto gemm = [&](int64_t M, const void* x, int64_t xs, const DeviceBuffer& w, int64_t Nn, int64_t K, void* y,
                  int64_t ys, void* y2 = nullptr) {
    cuda::SkinnyExtras ex;
    ex.tuning = tuning;
    SSM_CUDA_CHECK(skinny({M, Nn, K, x, xs, w.data(), K, DType::BF16, y, ys, DType::F32}, y2, ys, true, s, ex));
  };
  enum Part { kNorm = 1, kGemms = 2, kSmall = 4, kInOnly = 32, kOutOnly = 64 };
  auto layer = [&](int l, int64_t M, int parts) {
    const LayerW& L = Ls[l];
    const StateView cs{L.conv_state.data(), DType::F32, (W - 1) * I}, ss{L.ssm_state.data(), DType::F32, I * N};
    cuda::ConvParams conv{I, static_cast<int>(W), L.cw.as<float>(), L.cb.as<float>(), cs, true};
    cuda::ScanParams sp{I, static_cast<int>(N), L.A.as<float>(), L.D.as<float>(), L.dtb.as<float>(), true, ss};
    if (parts & kInOnly) return gemm(M, normed.data(), H, L.in, 2 * I, H, xz.data(), 2 * I);
    if (parts & kOutOnly) return gemm(M, y16.data(), I, L.out, H, I, out.data(), H);
    if (parts & kNorm)
      SSM_CUDA_CHECK(cuda::add_rms_norm_rows(l == 0 ? nullptr : out.as<float>(), H, hidden.as<float>(), H,
                                             L.norm.as<float>(), eps, nullptr, M, H, true, normed.data(), DType::BF16,
                                             H, true, s));
    cuda::ScanInputs in{{xc.as<float>(), I}, {delta.as<float>(), I}, {xdbl.as<float>() + R, XD},
                        {xdbl.as<float>() + R + N, XD}, {xz.as<float>() + I, 2 * I}};
    if (parts & kGemms) gemm(M, normed.data(), H, L.in, 2 * I, H, xz.data(), 2 * I);
    if (parts & kSmall)
      SSM_CUDA_CHECK(cuda::conv1d_update_dual(xz.as<float>(), 2 * I, xc.as<float>(), I, xc16.data(), I, conv,
                                              dsi.as<int32_t>(), static_cast<int>(M), true, s));
    if (parts & kGemms) {
      gemm(M, xc16.data(), I, L.x, XD, I, xdbl.data(), XD, xdbl16.data());
      gemm(M, xdbl16.data(), XD, L.dt, I, R, delta.data(), I);
    }
    if (parts & kSmall)
      SSM_CUDA_CHECK(cuda::selective_state_update_out(in, sp, y16.data(), DType::BF16, I, dsi.as<int32_t>(),
                                                      static_cast<int>(M), true, s));
    if (parts & kGemms) gemm(M, y16.data(), I, L.out, H, I, out.data(), H);
  };
  auto time_graph = [&](const char* name, int64_t M, int parts) {
    for (int l = 0; l < layers; ++l) layer(l, M, parts);  // eager once (allocations, module loads)
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < layers; ++l) layer(l, M, parts);
    SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    SSM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaGraphLaunch(e, s)); }, 10, s);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    std::printf("chain %-26s M=%-3ld %8.1f us/step %6.2f us/layer\n", name, static_cast<long>(M), ms * 1e3,
                ms * 1e3 / layers);
  };
  const cuda::SkinnyTuning old_default{4, false, true, 0, 16}, nocap16{4, false, false, 0, 16},
      pipe16{2, true, false, 0, 16}, pipe4{2, true, false, 0, 4}, nocap4{4, false, false, 0, 4};
  const std::pair<const char*, const cuda::SkinnyTuning*> tus[] = {
      {"default", nullptr}, {"old(u4c/16)", &old_default}, {"u4/16", &nocap16}, {"u2p/16", &pipe16},
      {"u2p/4", &pipe4}, {"u4/4", &nocap4}};
  const bool chain_quick = std::getenv("SSMSERVE_CHAIN_QUICK") != nullptr;  // default tuning, M = 1 only
  for (int64_t M : {1, 4}) {
    for (const auto& [tname, tu] : tus) {
      if (chain_quick && (M > 1 || tu)) break;
      tuning = tu;
      const std::string t(tname);
      time_graph((t + " in_proj only").c_str(), M, kInOnly);
      time_graph((t + " out_proj only").c_str(), M, kOutOnly);
      time_graph((t + " gemms").c_str(), M, kGemms);
      time_graph((t + " chain").c_str(), M, kNorm | kGemms | kSmall);
      if (M > 1) break;
    }
  }
  tuning = nullptr;
  time_graph("default norm only", 1, kNorm);
  time_graph("default small only", 1, kSmall);
}

}  // namespace
}  // namespace ssmserve
