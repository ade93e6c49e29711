// Tests of the CPU gated delta rule (kernels/cpu/gated_delta.h): the chunked prefill and the one-token decode against
// the double-precision recurrence, on random inputs shaped as the mixer produces them (unit q / k, q scaled by
// 1/sqrt(Dk), g <= 0, beta in (0, 1)); lengths 1..700, continued prefills from non-zero states with chunk boundaries
// inside and on the sequence start, several value heads per key head, null blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/gated_delta.h"

namespace ssmserve::cpu {
namespace {

struct Shape {
  int hk, hv, dk, dv;
};

/// Random per-token inputs for T tokens, laid out as one packed [T, ...] matrix per input.
struct Inputs {
  int64_t T;
  Shape s;
  std::vector<float> q, k, v, g, beta;
  Inputs(int64_t T_, Shape s_, std::mt19937& rng, float decay_scale = 1.0f) : T(T_), s(s_) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    q.resize(T * s.hk * s.dk), k.resize(q.size()), v.resize(T * s.hv * s.dv), g.resize(T * s.hv), beta.resize(g.size());
    for (float& x : q) x = n(rng);
    for (float& x : k) x = n(rng);
    for (float& x : v) x = n(rng);
    for (int64_t i = 0; i < T * s.hk; ++i) {  // L2-normalise per head; q also scaled by 1/sqrt(Dk)
      for (std::vector<float>* x : {&q, &k}) {
        float* h = x->data() + i * s.dk;
        double ss = 0;
        for (int d = 0; d < s.dk; ++d) ss += double{h[d]} * h[d];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6)) * (x == &q ? 1.0f / std::sqrt(float(s.dk)) : 1.0f);
        for (int d = 0; d < s.dk; ++d) h[d] *= inv;
      }
    }
    // g = -exp(A_log) softplus(a + dt_bias): mostly mild decay, some strong (A up to 16 as Qwen's init), some ~0.
    for (float& x : g) {
      const float r = u(rng);
      x = r < 0.1f ? -1e-4f * u(rng) : r < 0.9f ? -decay_scale * 0.3f * u(rng) : -decay_scale * 12.0f * u(rng);
    }
    for (float& x : beta) x = 0.05f + 0.9f * u(rng);
  }
  GatedDeltaInputs view(int64_t row0 = 0) const {
    return {q.data() + row0 * s.hk * s.dk, int64_t{s.hk} * s.dk, k.data() + row0 * s.hk * s.dk, int64_t{s.hk} * s.dk,
            v.data() + row0 * s.hv * s.dv, int64_t{s.hv} * s.dv, g.data() + row0 * s.hv, s.hv, beta.data() + row0 * s.hv, s.hv};
  }
};

/// A pool of `blocks` fp32 state blocks of one layer.
struct Pool {
  int64_t n;
  std::vector<float> data;
  Pool(Shape s, int blocks) : n(int64_t{s.hv} * s.dk * s.dv), data(static_cast<size_t>(n * blocks), 0.0f) {}
  StateView view() { return StateView{data.data(), DType::F32, n}; }
  float* block(int b) { return data.data() + b * n; }
};

GatedDeltaParams params(Shape s, Pool& pool, int chunk = 64) {
  GatedDeltaParams p;
  p.num_k_heads = s.hk, p.num_v_heads = s.hv, p.head_k_dim = s.dk, p.head_v_dim = s.dv, p.chunk_size = chunk;
  p.states = pool.view();
  return p;
}

double max_abs_diff(const float* a, const double* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(double{a[i]} - b[i]));
  return m;
}

// Chunked prefill of several packed sequences (lengths 1..700), each continuing from a random non-zero state at a
// random offset, against the double recurrence: outputs and final states within 1e-5.
TEST(GatedDelta, ChunkedPrefillMatchesDoubleRecurrence) {
  std::mt19937 rng(7);
  for (Shape s : {Shape{2, 2, 16, 16}, Shape{2, 4, 32, 32}, Shape{1, 4, 32, 16}, Shape{2, 8, 16, 24}}) {
    const std::vector<int> lens = {1, 2, 63, 64, 65, 130, 257, 700, 17};
    const std::vector<int> computed = {0, 5, 64, 0, 63, 128, 1, 37, 64 * 3};
    std::vector<int32_t> qsl{0}, nc, idx;
    for (size_t r = 0; r < lens.size(); ++r) qsl.push_back(qsl.back() + lens[r]), nc.push_back(computed[r]), idx.push_back(int32_t(r) + 1);
    Inputs in(qsl.back(), s, rng);
    Pool pool(s, int(lens.size()) + 1);
    std::normal_distribution<float> n(0.0f, 0.5f);
    std::vector<std::vector<double>> init(lens.size());
    for (size_t r = 0; r < lens.size(); ++r) {
      init[r].assign(static_cast<size_t>(pool.n), 0.0);
      if (nc[r] > 0)
        for (int64_t i = 0; i < pool.n; ++i) init[r][i] = pool.block(idx[r])[i] = n(rng);
      else
        for (int64_t i = 0; i < pool.n; ++i) pool.block(idx[r])[i] = 1e9f;  // must not be read
    }
    std::vector<float> out(static_cast<size_t>(in.T * s.hv * s.dv), -1.0f);
    gated_delta_prefill(in.view(), params(s, pool), out.data(), int64_t{s.hv} * s.dv, qsl, nc, idx);
    for (size_t r = 0; r < lens.size(); ++r) {
      std::vector<double> st = init[r], ref(static_cast<size_t>(lens[r] * s.hv * s.dv));
      gated_delta_reference(in.view(qsl[r]), params(s, pool), lens[r], st.data(), ref.data());
      EXPECT_LT(max_abs_diff(out.data() + int64_t{qsl[r]} * s.hv * s.dv, ref.data(), int64_t(ref.size())), 1e-5)
          << "seq " << r << " len " << lens[r] << " computed " << nc[r] << " hv " << s.hv << " hk " << s.hk;
      EXPECT_LT(max_abs_diff(pool.block(idx[r]), st.data(), pool.n), 1e-5) << "final state, seq " << r;
    }
  }
}

// Every length 1..700 from zero state, one head group, strong decays included.
TEST(GatedDelta, AllLengthsFromZero) {
  std::mt19937 rng(11);
  const Shape s{1, 2, 8, 8};
  for (int len = 1; len <= 700; len += (len < 140 ? 1 : 37)) {
    Inputs in(len, s, rng, 2.0f);
    Pool pool(s, 2);
    std::vector<int32_t> qsl{0, len}, nc{0}, idx{1};
    std::vector<float> out(static_cast<size_t>(len * s.hv * s.dv));
    gated_delta_prefill(in.view(), params(s, pool), out.data(), int64_t{s.hv} * s.dv, qsl, nc, idx);
    std::vector<double> st(static_cast<size_t>(pool.n), 0.0), ref(out.size());
    gated_delta_reference(in.view(), params(s, pool), len, st.data(), ref.data());
    ASSERT_LT(max_abs_diff(out.data(), ref.data(), int64_t(out.size())), 1e-5) << "len " << len;
    ASSERT_LT(max_abs_diff(pool.block(1), st.data(), pool.n), 1e-5) << "len " << len;
  }
}

// A prompt cut into steps on chunk boundaries equals the uncut prefill bit for bit; cut anywhere it stays within
// rounding; decode steps continue it within rounding.
TEST(GatedDelta, SplitPrefillAndDecodeContinue) {
  std::mt19937 rng(3);
  const Shape s{2, 4, 16, 16};
  const int len = 300;
  Inputs in(len, s, rng);
  const int64_t W = int64_t{s.hv} * s.dv;
  Pool whole(s, 2);
  std::vector<float> ref(static_cast<size_t>(len * W));
  gated_delta_prefill(in.view(), params(s, whole, 32), ref.data(), W, std::vector<int32_t>{0, len}, std::vector<int32_t>{0},
                      std::vector<int32_t>{1});
  for (const std::vector<int>& cuts : {std::vector<int>{64, 160, 300}, std::vector<int>{7, 100, 101, 299, 300}}) {
    Pool pool(s, 2);
    std::vector<float> out(ref.size());
    int prev = 0;
    for (int cut : cuts) {
      const int n = cut - prev;
      if (n == 1 && prev > 0) {  // a one-token step through the decode form
        gated_delta_decode(in.view(prev), params(s, pool, 32), out.data() + prev * W, W, std::vector<int32_t>{1});
      } else {
        gated_delta_prefill(in.view(prev), params(s, pool, 32), out.data() + prev * W, W, std::vector<int32_t>{0, n},
                            std::vector<int32_t>{prev}, std::vector<int32_t>{1});
      }
      prev = cut;
    }
    const bool aligned = cuts[0] == 64;
    for (size_t i = 0; i < out.size(); ++i) {
      if (aligned) ASSERT_EQ(out[i], ref[i]) << i;
      else ASSERT_NEAR(out[i], ref[i], 1e-5) << i;
    }
  }
}

// Decode rows against the recurrence; padding rows (state index 0) write zeros and touch no state.
TEST(GatedDelta, DecodeRowsAndNullBlocks) {
  std::mt19937 rng(5);
  const Shape s{2, 8, 16, 32};
  const int rows = 5;
  Inputs in(rows, s, rng);
  Pool pool(s, 4);
  std::normal_distribution<float> n(0.0f, 0.5f);
  for (float& x : pool.data) x = n(rng);
  const std::vector<float> before = pool.data;
  const std::vector<int32_t> idx = {2, 0, 1, 3, 0};
  const int64_t W = int64_t{s.hv} * s.dv;
  std::vector<float> out(static_cast<size_t>(rows * W), 7.0f);
  gated_delta_decode(in.view(), params(s, pool), out.data(), W, idx);
  for (int r = 0; r < rows; ++r) {
    if (idx[r] == 0) {
      for (int64_t i = 0; i < W; ++i) ASSERT_EQ(out[r * W + i], 0.0f);
      continue;
    }
    std::vector<double> st(before.begin() + idx[r] * pool.n, before.begin() + (idx[r] + 1) * pool.n), ref(static_cast<size_t>(W));
    gated_delta_reference(in.view(r), params(s, pool), 1, st.data(), ref.data());
    EXPECT_LT(max_abs_diff(out.data() + r * W, ref.data(), W), 1e-6) << r;
    EXPECT_LT(max_abs_diff(pool.block(idx[r]), st.data(), pool.n), 1e-6) << r;
  }
  for (int64_t i = 0; i < pool.n; ++i) ASSERT_EQ(pool.data[i], before[i]) << "null block written";
}

// Bad shapes are errors, not crashes.
TEST(GatedDelta, RejectsBadShapes) {
  const Shape s{3, 4, 8, 8};
  Pool pool(s, 2);
  std::mt19937 rng(1);
  Inputs in(4, Shape{1, 4, 8, 8}, rng);
  std::vector<float> out(64);
  EXPECT_THROW(gated_delta_decode(in.view(), params(s, pool), out.data(), 32, std::vector<int32_t>{1}), std::exception);
  EXPECT_THROW(gated_delta_prefill(in.view(), params(Shape{1, 4, 8, 8}, pool), out.data(), 32, std::vector<int32_t>{0},
                                   std::vector<int32_t>{0}, std::vector<int32_t>{1}),
               std::exception);
}

}  // namespace
}  // namespace ssmserve::cpu
