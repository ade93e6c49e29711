// The gated delta rule GPU op tests' fixtures (test_cuda_gated_delta_ops.cpp, test_cuda_gated_delta_two_pass.cpp):
// shapes, per-token inputs with padded row strides, a layer's state pool, a packed prefill step, and the prefill
// paths with the two-pass walks of KernelTuning::gdn_walk.
#pragma once
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/kernel_tuning.h"

namespace ssmserve::gdntest {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct GdnShape {
  const char* name;
  int Hk, Hv, Dk, Dv;
};
inline std::vector<GdnShape> gdn_shapes() {
  std::vector<GdnShape> s = {{"tiny-qwen3_5", 4, 8, 32, 32}, {"gqa1-d64", 2, 2, 64, 64}};
  if (!quick()) {
    s.push_back({"qwen3.5-9b", 16, 32, 128, 128});
    s.push_back({"gqa4-dv96", 2, 8, 128, 96});
    s.push_back({"gqa2-dk64-dv160", 3, 6, 64, 160});
  }
  return s;
}

/// Per-token inputs on host and device with padded row strides: q / k L2-normalised per head (q / sqrt(Dk)), v in
/// [-1, 1), g = -exp(u), u in [-6, 1) (decays from ~1 to e^-2.7 per token), beta in (0, 1).
struct Tokens {
  int64_t T;
  int64_t qs, ks, vs, gs, bs;
  std::vector<float> q, k, v, g, beta;
  DeviceBuffer dq, dk, dv, dg, db;
  Tokens(const GdnShape& sh, int64_t t, std::mt19937& rng) : T(t) {
    qs = int64_t{sh.Hk} * sh.Dk + 4, ks = int64_t{sh.Hk} * sh.Dk + 8, vs = int64_t{sh.Hv} * sh.Dv + 4;
    gs = sh.Hv + 3, bs = sh.Hv + 1;
    q = rand_vec(rng, std::max<int64_t>(1, T * qs));
    k = rand_vec(rng, std::max<int64_t>(1, T * ks));
    v = rand_vec(rng, std::max<int64_t>(1, T * vs));
    g = rand_vec(rng, std::max<int64_t>(1, T * gs), -6.0f, 1.0f);
    for (auto& x : g) x = -std::exp(x);
    beta = rand_vec(rng, std::max<int64_t>(1, T * bs), 0.0f, 1.0f);
    for (int64_t i = 0; i < T; ++i)
      for (int h = 0; h < sh.Hk; ++h) {
        normalize(q.data() + i * qs + int64_t{h} * sh.Dk, sh.Dk, 1.0 / std::sqrt(double(sh.Dk)));
        normalize(k.data() + i * ks + int64_t{h} * sh.Dk, sh.Dk, 1.0);
      }
    upload();
  }
  /// Rows [r0, r0 + n) of `src` (a later step of the same prompt).
  Tokens(const Tokens& src, int64_t r0, int64_t n)
      : T(n), qs(src.qs), ks(src.ks), vs(src.vs), gs(src.gs), bs(src.bs) {
    const auto rows = [&](const std::vector<float>& x, int64_t stride) {
      return std::vector<float>(x.begin() + r0 * stride, x.begin() + (r0 + n) * stride);
    };
    q = rows(src.q, qs), k = rows(src.k, ks), v = rows(src.v, vs), g = rows(src.g, gs), beta = rows(src.beta, bs);
    upload();
  }
  void upload() { dq = to_device(q), dk = to_device(k), dv = to_device(v), dg = to_device(g), db = to_device(beta); }
  static void normalize(float* x, int n, double scale) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += double(x[i]) * x[i];
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * scale / std::sqrt(s + 1e-6));
  }
  /// Row offset `r0` of the host inputs (the reference walks one sequence).
  cpu::GatedDeltaInputs host(int64_t r0 = 0) const {
    return {q.data() + r0 * qs, qs, k.data() + r0 * ks, ks, v.data() + r0 * vs, vs,
            g.data() + r0 * gs, gs, beta.data() + r0 * bs, bs};
  }
  cuda::GatedDeltaInputs dev() const {
    return {dq.as<float>(), qs, dk.as<float>(), ks, dv.as<float>(), vs, dg.as<float>(), gs, db.as<float>(), bs};
  }
};

/// One layer's state pool (random initial states, block 0 the null block) and its parameters.
struct GdnLayer {
  GdnShape sh;
  StatePool pool;
  GdnLayer(const GdnShape& s, DType t, int blocks, std::mt19937& rng)
      : sh(s), pool(t, int64_t{s.Hv} * s.Dk * s.Dv, blocks, rng, 0.5f) {}
  cpu::GatedDeltaParams host() { return {sh.Hk, sh.Hv, sh.Dk, sh.Dv, 64, pool.host_view()}; }
  cuda::GatedDeltaParams dev() { return {sh.Hk, sh.Hv, sh.Dk, sh.Dv, 64, pool.dev_view()}; }
};

/// A packed prefill step: lengths, tokens already computed, state blocks (0 = null row).
struct Step {
  std::vector<int32_t> qsl{0}, nc, idx;
  Step(const std::vector<int32_t>& lens, const std::vector<int32_t>& computed, int null_at) : nc(computed) {
    for (size_t s = 0; s < lens.size(); ++s) {
      qsl.push_back(qsl.back() + lens[s]);
      idx.push_back(static_cast<int>(s) == null_at ? 0 : static_cast<int32_t>(s + 1));
    }
  }
  int64_t T() const { return qsl.back(); }
  int n() const { return static_cast<int>(idx.size()); }
};

/// The two GPU prefill paths: the fused walk (gated_delta_prefill) and the two-pass form (chunk-parallel WY pass,
/// then the walk with only the state products: gated_delta_prefill_two_pass), the latter with each walk of
/// KernelTuning::gdn_walk: the default (2: 32-column tiles at these small grids), 1 (64-column tiles), 0 (the
/// previous walk).
enum class Algo { kFused, kTwoPass, kTwoPassW64, kTwoPassOld };
inline const char* algo_name(Algo a) {
  return a == Algo::kFused ? "fused" : a == Algo::kTwoPass ? "two-pass" : a == Algo::kTwoPassW64 ? "2p-w64" : "2p-old";
}
inline constexpr Algo kAlgos[] = {Algo::kFused, Algo::kTwoPass, Algo::kTwoPassW64, Algo::kTwoPassOld};

/// Sets kernel_tuning().gdn_walk for its lifetime.
struct ScopedGdnWalk {
  cuda::KernelTuning saved = cuda::kernel_tuning();
  explicit ScopedGdnWalk(int walk) {
    cuda::KernelTuning t = saved;
    t.gdn_walk = walk;
    cuda::set_kernel_tuning(t);
  }
  ~ScopedGdnWalk() { cuda::set_kernel_tuning(saved); }
};

}  // namespace ssmserve::gdntest
