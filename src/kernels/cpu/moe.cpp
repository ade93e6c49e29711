// Owns the CPU sparse MoE MLP (see moe.h).
#include "kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/linear.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

// Softmax: probabilities, choice = probabilities.
void softmax_scores(const float* l, int E, float* prob) {
  const float m = *std::max_element(l, l + E);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += (prob[e] = std::exp(l[e] - m));
  for (int e = 0; e < E; ++e) prob[e] /= sum;
}

}  // namespace

void moe_route(const float* logits, int64_t T, int E, const MoeRouting& r, int32_t* ids, float* weights) {
  const int K = r.top_k;
  SSM_CHECK(K >= 1 && K <= E, "moe: num_experts_per_tok {} must be in [1, {}]", K, E);
  const bool sigmoid = r.scoring == MoeRouting::Scoring::Sigmoid;
  const int G = sigmoid ? r.n_group : 1, per = E / std::max(G, 1);
  SSM_CHECK(G >= 1 && E % G == 0 && r.topk_group >= 1 && r.topk_group <= G && (G == 1 || per >= 2) && K <= r.topk_group * per,
            "moe: n_group {} / topk_group {} do not fit {} experts and top_k {}", r.n_group, r.topk_group, E, K);
  SSM_CHECK(r.correction_bias.empty() || static_cast<int>(r.correction_bias.size()) == E,
            "moe: e_score_correction_bias has {} entries, expected {}", r.correction_bias.size(), E);
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), gscore(static_cast<size_t>(G));
  std::vector<int32_t> idx(static_cast<size_t>(E)), gidx(static_cast<size_t>(G));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    if (sigmoid) {
      for (int e = 0; e < E; ++e) {
        score[e] = 1.0f / (1.0f + std::exp(-l[e]));
        choice[e] = score[e] + (r.correction_bias.empty() ? 0.0f : r.correction_bias[e]);
      }
      if (G > 1) {  // keep the topk_group groups with the best sum of their two best choice scores
        for (int g = 0; g < G; ++g) {
          float a = -INFINITY, b = -INFINITY;
          for (int e = g * per; e < (g + 1) * per; ++e) {
            if (choice[e] > a) b = a, a = choice[e];
            else if (choice[e] > b) b = choice[e];
          }
          gscore[g] = a + b;
        }
        std::iota(gidx.begin(), gidx.end(), 0);
        std::stable_sort(gidx.begin(), gidx.end(), [&](int32_t a, int32_t b) { return gscore[a] > gscore[b]; });
        for (int i = r.topk_group; i < G; ++i)
          for (int e = gidx[i] * per; e < (gidx[i] + 1) * per; ++e) choice[e] = -INFINITY;
      }
    } else {
      softmax_scores(l, E, score.data());
      std::copy(score.begin(), score.end(), choice.begin());
    }
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
    float tot = 0.0f;
    for (int k = 0; k < K; ++k) tot += score[idx[k]];
    const float denom = !r.renormalize ? 1.0f : sigmoid ? tot + 1e-20f : tot;
    for (int k = 0; k < K; ++k) {
      ids[t * K + k] = idx[k];
      weights[t * K + k] = score[idx[k]] / denom * r.routed_scaling_factor;
    }
  }
}

void moe_route(const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights) {
  MoeRouting r;
  r.top_k = top_k;
  SSM_CPU_VARIANT::moe_route(logits, T, E, r, ids, weights);  // qualified: ADL would also find the dispatcher
}

void expert_activation(bool gated, float* g, const float* u, int64_t count) {
  if (gated) {
    for (int64_t i = 0; i < count; ++i) g[i] = silu(g[i]) * u[i];
  } else {
    for (int64_t i = 0; i < count; ++i) g[i] = g[i] > 0.0f ? g[i] * g[i] : 0.0f;
  }
}

void moe_add_weighted(float* out, const float* y, float weight, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] += y[c] * weight;
}

void expert_mlp(const ExpertWeights& w, const float* xs, int64_t n, float* g, float* u, float* y) {
  const int64_t I = w.w1.rows;
  linear(xs, n, w.w1, nullptr, g);
  if (w.gated()) linear(xs, n, w.w3, nullptr, u);
  expert_activation(w.gated(), g, u, n * I);
  linear(g, n, w.w2, nullptr, y);
}

void sparse_moe(const float* x, int64_t T, int64_t hidden, const Weight& gate, const std::vector<ExpertWeights>& experts,
                const MoeRouting& routing, float* out) {
  const int E = static_cast<int>(experts.size()), top_k = routing.top_k;
  SSM_CHECK(gate.rows == E && gate.cols == hidden, "moe: gate is [{}, {}], expected [{}, {}]", gate.rows, gate.cols, E, hidden);
  std::fill(out, out + T * hidden, 0.0f);
  if (T == 0) return;
  // 1. Route.
  std::vector<float> logits(static_cast<size_t>(T * E)), wts(static_cast<size_t>(T * top_k));
  std::vector<int32_t> ids(static_cast<size_t>(T * top_k));
  linear(x, T, gate, nullptr, logits.data());
  SSM_CPU_VARIANT::moe_route(logits.data(), T, E, routing, ids.data(), wts.data());
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
    SSM_CPU_VARIANT::expert_mlp(w, xs.data(), n, g.data(), u.data(), y.data());
    for (int64_t i = 0; i < n; ++i) moe_add_weighted(out + tok[i] * hidden, y.data() + i * hidden, tw[i], hidden);
  }
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, sparse_moe, (const float* x, int64_t T, int64_t hidden, const Weight& gate,
                 const std::vector<ExpertWeights>& experts, const MoeRouting& routing, float* out),
                 (x, T, hidden, gate, experts, routing, out))
SSM_CPU_DISPATCH(void, moe_route, (const float* logits, int64_t T, int E, const MoeRouting& routing, int32_t* ids,
                 float* weights), (logits, T, E, routing, ids, weights))
SSM_CPU_DISPATCH(void, moe_route, (const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights),
                 (logits, T, E, top_k, ids, weights))
SSM_CPU_DISPATCH(void, expert_activation, (bool gated, float* g, const float* u, int64_t count), (gated, g, u, count))
SSM_CPU_DISPATCH(void, moe_add_weighted, (float* out, const float* y, float weight, int64_t n), (out, y, weight, n))
SSM_CPU_DISPATCH(void, expert_mlp, (const ExpertWeights& w, const float* xs, int64_t n, float* g, float* u, float* y),
                 (w, xs, n, g, u, y))
