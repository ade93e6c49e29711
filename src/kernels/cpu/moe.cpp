// Owns the CPU sparse MoE MLP (see moe.h).
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/linear.h"

namespace ssmserve::cpu {

void moe_route(const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights) {
  SSM_CHECK(top_k >= 1 && top_k <= E, "moe: num_experts_per_tok {} must be in [1, {}]", top_k, E);
  std::vector<float> prob(static_cast<size_t>(E));
  std::vector<int32_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    const float m = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += (prob[e] = std::exp(l[e] - m));
    for (int e = 0; e < E; ++e) prob[e] /= sum;
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
    float tot = 0.0f;
    for (int k = 0; k < top_k; ++k) tot += prob[idx[k]];
    for (int k = 0; k < top_k; ++k) {
      ids[t * top_k + k] = idx[k];
      weights[t * top_k + k] = prob[idx[k]] / tot;
    }
  }
}

void sparse_moe(const float* x, int64_t T, int64_t hidden, const Weight& gate, const std::vector<ExpertWeights>& experts,
                int top_k, float* out) {
  const int E = static_cast<int>(experts.size());
  SSM_CHECK(gate.rows == E && gate.cols == hidden, "moe: gate is [{}, {}], expected [{}, {}]", gate.rows, gate.cols, E, hidden);
  std::fill(out, out + T * hidden, 0.0f);
  if (T == 0) return;
  // 1. Route.
  std::vector<float> logits(static_cast<size_t>(T * E)), wts(static_cast<size_t>(T * top_k));
  std::vector<int32_t> ids(static_cast<size_t>(T * top_k));
  linear(x, T, gate, nullptr, logits.data());
  moe_route(logits.data(), T, E, top_k, ids.data(), wts.data());
  // 2. Experts in ascending order, each over the tokens routed to it.
  std::vector<float> xs, g, u, y;
  std::vector<int64_t> tok;
  std::vector<float> tw;
  for (int e = 0; e < E; ++e) {
    tok.clear(), tw.clear();
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < top_k; ++k)
        if (ids[t * top_k + k] == e) tok.push_back(t), tw.push_back(wts[t * top_k + k]);
    if (tok.empty()) continue;
    const ExpertWeights& w = experts[e];
    const int64_t n = static_cast<int64_t>(tok.size()), I = w.w1.rows;
    xs.resize(n * hidden), g.resize(n * I), u.resize(n * I), y.resize(n * hidden);
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + tok[i] * hidden, hidden, xs.data() + i * hidden);
    linear(xs.data(), n, w.w1, nullptr, g.data());
    linear(xs.data(), n, w.w3, nullptr, u.data());
    for (int64_t i = 0; i < n * I; ++i) g[i] = silu(g[i]) * u[i];
    linear(g.data(), n, w.w2, nullptr, y.data());
    for (int64_t i = 0; i < n; ++i) {
      float* o = out + tok[i] * hidden;
      const float* yi = y.data() + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += yi[c] * tw[i];
    }
  }
}

}  // namespace ssmserve::cpu
