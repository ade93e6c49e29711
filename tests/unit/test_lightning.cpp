// Lightning attention kernels against the token-by-token recurrence S_t = e^{-s} S_{t-1} + k_t^T v_t, o_t = q_t S_t
// evaluated in double: blocked prefill for lengths around the block size with a random non-zero initial state,
// slopes up to 0.92, chunked continuations (7, 64, 100 tokens), varlen batches, and the decode update over a
// batch of state blocks with null rows skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/lightning.h"

namespace ssmserve::cpu {
namespace {

constexpr int kH = 4, kD = 32, kBlock = 64;
const std::vector<float> kSlopes = {0.92f, 0.5f, 0.0625f, 0.004f};

/// A pool of `blocks` state blocks [H, D, D] fp32 plus random q/k/v.
struct Fixture {
  std::vector<float> pool;
  std::mt19937 rng{7};
  explicit Fixture(int blocks) : pool(static_cast<size_t>(blocks) * kH * kD * kD, 0.0f) {}
  StateView view() { return {pool.data(), DType::F32, static_cast<int64_t>(kH) * kD * kD}; }
  float* block(int b) { return pool.data() + static_cast<size_t>(b) * kH * kD * kD; }
  std::vector<float> random(size_t n, float scale) {
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  }
  LightningParams params() {
    LightningParams p;
    p.num_heads = kH, p.head_dim = kD, p.block_size = kBlock, p.slopes = kSlopes.data(), p.states = view();
    return p;
  }
};

/// The recurrence in double over tokens [0, n) of qkv [n, H, 3D] from state S (double [H, D, D], updated).
std::vector<double> recurrence(const std::vector<float>& qkv, int64_t n, std::vector<double>& S) {
  std::vector<double> out(static_cast<size_t>(n) * kH * kD, 0.0);
  for (int h = 0; h < kH; ++h) {
    const double decay = std::exp(-static_cast<double>(kSlopes[h]));
    double* Sh = S.data() + static_cast<size_t>(h) * kD * kD;
    for (int64_t t = 0; t < n; ++t) {
      const float* q = qkv.data() + (t * kH + h) * 3 * kD;
      const float *k = q + kD, *v = q + 2 * kD;
      for (int d = 0; d < kD; ++d)
        for (int e = 0; e < kD; ++e) Sh[d * kD + e] = decay * Sh[d * kD + e] + static_cast<double>(k[d]) * v[e];
      for (int e = 0; e < kD; ++e) {
        double o = 0;
        for (int d = 0; d < kD; ++d) o += static_cast<double>(q[d]) * Sh[d * kD + e];
        out[(t * kH + h) * kD + e] = o;
      }
    }
  }
  return out;
}

/// ||a - b|| / ||b|| (Frobenius).
template <class A>
double rel_err(const A& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Case {
  int64_t len;
  int32_t num_computed;  // where the chunk starts in its sequence (block alignment); > 0 = initial state
};

class LightningPrefill : public ::testing::TestWithParam<Case> {};

TEST_P(LightningPrefill, EqualsRecurrence) {
  const auto [n, c] = GetParam();
  Fixture f(3);
  const auto qkv = f.random(static_cast<size_t>(n) * kH * 3 * kD, 1.0f);
  const auto s0 = f.random(static_cast<size_t>(kH) * kD * kD, c > 0 ? 2.0f : 0.0f);
  std::copy(s0.begin(), s0.end(), f.block(2));
  std::vector<double> S(s0.begin(), s0.end());
  const auto want = recurrence(qkv, n, S);
  std::vector<float> out(static_cast<size_t>(n) * kH * kD, NAN);
  const std::vector<int32_t> qsl = {0, static_cast<int32_t>(n)}, nc = {c}, idx = {2};
  lightning_prefill(qkv.data(), kH * 3 * kD, out.data(), kH * kD, f.params(), qsl, nc, idx);
  EXPECT_LT(rel_err(out, want), 1e-5) << "outputs";
  EXPECT_LT(rel_err(std::vector<float>(f.block(2), f.block(3)), S), 1e-5) << "final state";
  // Per head too (the small-slope head dominates the norms).
  for (int h = 0; h < kH; ++h) {
    std::vector<double> wh;
    std::vector<float> oh;
    for (int64_t t = 0; t < n; ++t)
      for (int e = 0; e < kD; ++e) wh.push_back(want[(t * kH + h) * kD + e]), oh.push_back(out[(t * kH + h) * kD + e]);
    EXPECT_LT(rel_err(oh, wh), 1e-5) << "head " << h << " slope " << kSlopes[h];
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, LightningPrefill,
                         ::testing::Values(Case{1, 0}, Case{63, 0}, Case{64, 0}, Case{65, 0}, Case{200, 0}, Case{700, 0},
                                           Case{1, 128}, Case{63, 64}, Case{64, 128}, Case{65, 64}, Case{200, 64},
                                           Case{700, 128}, Case{1, 37}, Case{63, 37}, Case{64, 5}, Case{65, 63},
                                           Case{200, 100}, Case{700, 1}),
                         [](const auto& info) {
                           return "len" + std::to_string(info.param.len) + "_at" + std::to_string(info.param.num_computed);
                         });

// A 700-token prompt prefilled in chunks (each continuing from the state the previous one left) equals the
// recurrence over the whole prompt.
TEST(LightningPrefillChunks, ContinuationsEqualRecurrence) {
  for (int chunk : {7, 64, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const int64_t n = 700;
    Fixture f(2);
    const auto qkv = f.random(static_cast<size_t>(n) * kH * 3 * kD, 1.0f);
    std::vector<double> S(static_cast<size_t>(kH) * kD * kD, 0.0);
    const auto want = recurrence(qkv, n, S);
    std::vector<float> out(static_cast<size_t>(n) * kH * kD, NAN);
    for (int32_t c = 0; c < n; c += chunk) {
      const int32_t m = static_cast<int32_t>(std::min<int64_t>(chunk, n - c));
      const std::vector<int32_t> qsl = {0, m}, nc = {c}, idx = {1};
      lightning_prefill(qkv.data() + static_cast<size_t>(c) * kH * 3 * kD, kH * 3 * kD,
                        out.data() + static_cast<size_t>(c) * kH * kD, kH * kD, f.params(), qsl, nc, idx);
    }
    EXPECT_LT(rel_err(out, want), 1e-5);
    EXPECT_LT(rel_err(std::vector<float>(f.block(1), f.block(2)), S), 1e-5);
  }
}

// Several rows in one varlen call equal one call per row, bit for bit; a null-block row writes zeros only.
TEST(LightningPrefillBatch, VarlenRowsAreIndependent) {
  Fixture f(5);
  const std::vector<int32_t> lens = {70, 1, 128, 5}, nc = {0, 9, 64, 3}, idx = {3, 1, 0, 4};
  std::vector<int32_t> qsl = {0};
  for (int32_t l : lens) qsl.push_back(qsl.back() + l);
  const int64_t T = qsl.back();
  const auto qkv = f.random(static_cast<size_t>(T) * kH * 3 * kD, 1.0f);
  const auto init = f.random(f.pool.size(), 1.0f);
  f.pool = init;
  std::vector<float> out(static_cast<size_t>(T) * kH * kD, NAN);
  lightning_prefill(qkv.data(), kH * 3 * kD, out.data(), kH * kD, f.params(), qsl, nc, idx);
  const auto batched_pool = f.pool;
  for (size_t r = 0; r < lens.size(); ++r) {
    Fixture g(5);
    g.pool = init;
    std::vector<float> o1(static_cast<size_t>(lens[r]) * kH * kD, NAN);
    const std::vector<int32_t> q1 = {0, lens[r]}, n1 = {nc[r]}, i1 = {idx[r]};
    lightning_prefill(qkv.data() + static_cast<size_t>(qsl[r]) * kH * 3 * kD, kH * 3 * kD, o1.data(), kH * kD, g.params(), q1, n1, i1);
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_EQ(o1[i], out[static_cast<size_t>(qsl[r]) * kH * kD + i]) << "row " << r;
    if (idx[r] != 0)
      for (int64_t i = 0; i < kH * kD * kD; ++i) ASSERT_EQ(g.block(idx[r])[i], batched_pool[idx[r] * kH * kD * kD + i]);
  }
  for (int64_t i = 0; i < kH * kD * kD; ++i) ASSERT_EQ(f.block(0)[i], init[i]) << "null block written";
  for (int32_t t = qsl[2]; t < qsl[3]; ++t)
    for (int i = 0; i < kH * kD; ++i) ASSERT_EQ(out[static_cast<size_t>(t) * kH * kD + i], 0.0f);
}

// Decode over a batch of state blocks: each row one recurrence step; rows with state index 0 are skipped
// (block 0 holds NaN and stays untouched, the row's output is zero). 700 decode steps follow the recurrence.
TEST(LightningDecode, BatchOfBlocksWithNullRows) {
  Fixture f(4);
  f.pool = f.random(f.pool.size(), 1.0f);
  std::fill(f.block(0), f.block(1), NAN);
  const std::vector<int32_t> idx = {2, 0, 3, 1, 0};
  const int64_t B = static_cast<int64_t>(idx.size());
  const auto qkv = f.random(static_cast<size_t>(B) * kH * 3 * kD, 1.0f);
  std::vector<std::vector<double>> want(B);
  for (int64_t r = 0; r < B; ++r) {
    if (idx[r] == 0) continue;
    std::vector<double> S(f.block(idx[r]), f.block(idx[r] + 1));
    std::vector<float> row(qkv.begin() + r * kH * 3 * kD, qkv.begin() + (r + 1) * kH * 3 * kD);
    want[r] = recurrence(row, 1, S);
  }
  std::vector<float> out(static_cast<size_t>(B) * kH * kD, NAN);
  lightning_decode(qkv.data(), kH * 3 * kD, out.data(), kH * kD, f.params(), idx);
  for (int64_t r = 0; r < B; ++r) {
    std::vector<float> o(out.begin() + r * kH * kD, out.begin() + (r + 1) * kH * kD);
    if (idx[r] == 0) {
      for (float x : o) ASSERT_EQ(x, 0.0f);
    } else {
      EXPECT_LT(rel_err(o, want[r]), 1e-6) << "row " << r;
    }
  }
  for (int64_t i = 0; i < kH * kD * kD; ++i) ASSERT_TRUE(std::isnan(f.block(0)[i]));
}

TEST(LightningDecode, LongRunFollowsRecurrence) {
  const int64_t n = 700;
  Fixture f(2);
  const auto qkv = f.random(static_cast<size_t>(n) * kH * 3 * kD, 1.0f);
  const auto s0 = f.random(static_cast<size_t>(kH) * kD * kD, 2.0f);
  std::copy(s0.begin(), s0.end(), f.block(1));
  std::vector<double> S(s0.begin(), s0.end());
  const auto want = recurrence(qkv, n, S);
  std::vector<float> out(static_cast<size_t>(n) * kH * kD);
  const std::vector<int32_t> idx = {1};
  for (int64_t t = 0; t < n; ++t)
    lightning_decode(qkv.data() + t * kH * 3 * kD, kH * 3 * kD, out.data() + t * kH * kD, kH * kD, f.params(), idx);
  EXPECT_LT(rel_err(out, want), 1e-5);
}

// Prefill and decode agree on the state they hand each other: prefill 300 tokens, decode 50, vs the recurrence.
TEST(LightningMixed, PrefillThenDecode) {
  const int64_t n = 350, np = 300;
  Fixture f(2);
  const auto qkv = f.random(static_cast<size_t>(n) * kH * 3 * kD, 1.0f);
  std::vector<double> S(static_cast<size_t>(kH) * kD * kD, 0.0);
  const auto want = recurrence(qkv, n, S);
  std::vector<float> out(static_cast<size_t>(n) * kH * kD);
  const std::vector<int32_t> qsl = {0, static_cast<int32_t>(np)}, nc = {0}, idx = {1};
  lightning_prefill(qkv.data(), kH * 3 * kD, out.data(), kH * kD, f.params(), qsl, nc, idx);
  for (int64_t t = np; t < n; ++t)
    lightning_decode(qkv.data() + t * kH * 3 * kD, kH * 3 * kD, out.data() + t * kH * kD, kH * kD, f.params(), idx);
  EXPECT_LT(rel_err(out, want), 1e-5);
}

TEST(LightningPrefill, RejectsMalformedRows) {
  Fixture f(2);
  std::vector<float> qkv(kH * 3 * kD), out(kH * kD);
  const std::vector<int32_t> qsl = {0}, nc = {0}, idx = {1};
  EXPECT_THROW(lightning_prefill(qkv.data(), kH * 3 * kD, out.data(), kH * kD, f.params(), qsl, nc, idx), Error);
}

}  // namespace
}  // namespace ssmserve::cpu
