// Paged softmax attention and RoPE against dense references in double: random block tables (blocks out of
// order, shared pool), GQA, rows mixing decodes and prefill chunks with context, padded rows, and a prompt
// written chunk by chunk giving bit-identical outputs to one pass.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"

namespace ssmserve::cpu {
namespace {

constexpr int kH = 4, kKV = 2, kD = 16, kBs = 8;

struct Pool {
  std::vector<float> data;
  KvCacheView view;
  explicit Pool(int blocks, int layers = 1, int layer = 0) {
    view.block_size = kBs, view.num_kv_heads = kKV, view.head_dim = kD;
    view.page_bytes = view.layer_bytes() * layers;
    view.layer_offset_bytes = view.layer_bytes() * layer;
    data.assign(static_cast<size_t>(blocks) * view.page_bytes / sizeof(float), NAN);  // unwritten slots are NaN
    view.base = reinterpret_cast<std::byte*>(data.data());
  }
};

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Dense causal GQA attention in double over one sequence's full q/k/v [L, heads, D]: outputs for positions
/// [L - n, L).
std::vector<double> dense(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int L, int n) {
  std::vector<double> out(static_cast<size_t>(n) * kH * kD);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  for (int i = 0; i < n; ++i) {
    const int pos = L - n + i;
    for (int h = 0; h < kH; ++h) {
      const int g = h / (kH / kKV);
      std::vector<double> s(pos + 1);
      double m = -1e300;
      for (int j = 0; j <= pos; ++j) {
        double a = 0;
        for (int d = 0; d < kD; ++d) a += static_cast<double>(q[(pos * kH + h) * kD + d]) * k[(j * kKV + g) * kD + d];
        s[j] = a * scale, m = std::max(m, s[j]);
      }
      double l = 0;
      for (auto& x : s) l += (x = std::exp(x - m));
      for (int d = 0; d < kD; ++d) {
        double o = 0;
        for (int j = 0; j <= pos; ++j) o += s[j] * v[(j * kKV + g) * kD + d];
        out[(static_cast<size_t>(i) * kH + h) * kD + d] = o / l;
      }
    }
  }
  return out;
}

TEST(PagedAttention, MixedBatchMatchesDense) {
  std::mt19937 rng(3);
  // Rows: a decode at position 40, a padded row, a prefill chunk of 13 tokens after 20 cached, a fresh prompt of 9.
  const std::vector<int> ctx = {40, 0, 20, 0}, n = {1, 1, 13, 9};
  const int rows = 4, num_blocks = 20;
  Pool pool(num_blocks, 2, 1);  // this layer is the second of two in each page
  std::vector<int> free_blocks(num_blocks - 1);
  std::iota(free_blocks.begin(), free_blocks.end(), 1);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  const int max_blocks = 6;
  std::vector<int32_t> tables(rows * max_blocks, 0), qsl = {0}, seq_lens, slots;
  std::vector<std::vector<float>> Q(rows), K(rows), V(rows);
  std::vector<float> q_new, k_new, v_new;
  for (int r = 0; r < rows; ++r) {
    const int L = r == 1 ? 0 : ctx[r] + n[r];
    seq_lens.push_back(L);
    qsl.push_back(qsl.back() + n[r]);
    for (int b = 0; b < (L + kBs - 1) / kBs; ++b) tables[r * max_blocks + b] = free_blocks.back(), free_blocks.pop_back();
    Q[r] = randn(static_cast<size_t>(std::max(L, 1)) * kH * kD, rng);
    K[r] = randn(static_cast<size_t>(std::max(L, 1)) * kKV * kD, rng);
    V[r] = randn(static_cast<size_t>(std::max(L, 1)) * kKV * kD, rng);
    // Cached context written directly; the new tokens go through reshape_and_cache.
    for (int j = 0; j < ctx[r] && r != 1; ++j) {
      const int b = tables[r * max_blocks + j / kBs];
      std::copy_n(&K[r][j * kKV * kD], kKV * kD, pool.view.k(b) + (j % kBs) * kKV * kD);
      std::copy_n(&V[r][j * kKV * kD], kKV * kD, pool.view.v(b) + (j % kBs) * kKV * kD);
    }
    for (int i = 0; i < n[r]; ++i) {
      const int pos = r == 1 ? 0 : ctx[r] + i;
      q_new.insert(q_new.end(), &Q[r][pos * kH * kD], &Q[r][(pos + 1) * kH * kD]);
      k_new.insert(k_new.end(), &K[r][pos * kKV * kD], &K[r][(pos + 1) * kKV * kD]);
      v_new.insert(v_new.end(), &V[r][pos * kKV * kD], &V[r][(pos + 1) * kKV * kD]);
      slots.push_back(r == 1 ? -1 : tables[r * max_blocks + pos / kBs] * kBs + pos % kBs);
    }
  }
  const int T = qsl.back();
  reshape_and_cache(k_new.data(), kKV * kD, v_new.data(), kKV * kD, T, slots, pool.view, num_blocks);
  std::vector<float> out(static_cast<size_t>(T) * kH * kD, NAN);
  paged_attention(q_new.data(), kH * kD, out.data(), kH * kD, kH, 1.0f / std::sqrt(static_cast<float>(kD)), pool.view, qsl, seq_lens,
                  tables, max_blocks);
  for (int r = 0; r < rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    if (r == 1) {
      for (int i = 0; i < kH * kD; ++i) ASSERT_EQ(out[qsl[r] * kH * kD + i], 0.0f);
      continue;
    }
    const auto want = dense(Q[r], K[r], V[r], seq_lens[r], n[r]);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[qsl[r] * kH * kD + i], want[i], 2e-5);
  }
  // The page's other layer was never touched.
  for (int b = 0; b < num_blocks; ++b)
    for (int64_t i = 0; i < pool.view.layer_bytes() / 4; ++i) ASSERT_TRUE(std::isnan(pool.data[b * pool.view.page_bytes / 4 + i]));
}

// A 50-token prompt in chunks of 7 gives bit-identical outputs to one 50-token pass (same path, same order).
TEST(PagedAttention, ChunkedEqualsOnePass) {
  std::mt19937 rng(5);
  const int L = 50, max_blocks = 8, num_blocks = 10;
  const auto q = randn(L * kH * kD, rng), k = randn(L * kKV * kD, rng), v = randn(L * kKV * kD, rng);
  std::vector<int32_t> table = {9, 2, 7, 4, 1, 3, 8, 5};
  auto run = [&](int chunk) {
    Pool pool(num_blocks);
    std::vector<float> out(L * kH * kD);
    for (int c = 0; c < L; c += chunk) {
      const int m = std::min(chunk, L - c);
      std::vector<int32_t> slots;
      for (int i = 0; i < m; ++i) slots.push_back(table[(c + i) / kBs] * kBs + (c + i) % kBs);
      reshape_and_cache(&k[c * kKV * kD], kKV * kD, &v[c * kKV * kD], kKV * kD, m, slots, pool.view, num_blocks);
      const std::vector<int32_t> qsl = {0, m}, sl = {c + m};
      paged_attention(&q[c * kH * kD], kH * kD, &out[c * kH * kD], kH * kD, kH, 0.25f, pool.view, qsl, sl, table, max_blocks);
    }
    return out;
  };
  const auto one = run(L), chunked = run(7), decode = run(1);
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i], chunked[i]) << i;
    ASSERT_EQ(one[i], decode[i]) << i;
  }
}

TEST(PagedAttention, RejectsShortBlockTable) {
  Pool pool(4);
  std::vector<float> q(kH * kD), out(kH * kD);
  const std::vector<int32_t> qsl = {0, 1}, sl = {30}, table = {1, 2};
  EXPECT_THROW(paged_attention(q.data(), kH * kD, out.data(), kH * kD, kH, 1.0f, pool.view, qsl, sl, table, 2), Error);
  const std::vector<int32_t> bad_slot = {4 * kBs};
  EXPECT_THROW(reshape_and_cache(q.data(), kKV * kD, q.data(), kKV * kD, 1, bad_slot, pool.view, 4), Error);
}

TEST(Rope, MatchesRotateHalfFormula) {
  const int D = 8, T = 3;
  const auto inv = rope_inv_freq(10000.0, D);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
  EXPECT_NEAR(inv[1], 1.0 / std::pow(10000.0, 2.0 / 8), 1e-7);
  std::vector<float> x(T * 2 * D);
  std::iota(x.begin(), x.end(), 1.0f);
  const auto x0 = x;
  const std::vector<int32_t> pos = {0, 5, 1000};
  apply_rope(x.data(), 2 * D, T, 2, D, pos, inv);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < D / 2; ++i) {
        const double a = static_cast<double>(static_cast<float>(pos[t]) * inv[i]);
        const double x1 = x0[t * 2 * D + h * D + i], x2 = x0[t * 2 * D + h * D + i + D / 2];
        EXPECT_NEAR(x[t * 2 * D + h * D + i], x1 * std::cos(a) - x2 * std::sin(a), 1e-3);
        EXPECT_NEAR(x[t * 2 * D + h * D + i + D / 2], x2 * std::cos(a) + x1 * std::sin(a), 1e-3);
      }
  EXPECT_THROW(rope_inv_freq(10000.0, 7), Error);
}

}  // namespace
}  // namespace ssmserve::cpu
