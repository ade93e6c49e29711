// Qwen3-Next / Qwen3.5's attention and MoE options on the CPU, in a two-layer decoder assembled from a spec (both layers
// softmax attention + MoE): the attention with attn_output_gate (q_proj rows [q_h | gate_h] per head, o * sigmoid(gate)
// before o_proj), qk_norm with qk_norm_weight_offset 1 (per-head zero-centred RMSNorms of q and k before RoPE), partial
// rotary (a quarter of each head) and M-RoPE fields in rope_parameters (text-only: plain RoPE); the MoE with moe_layout
// "qwen" (layer 0: per-expert tensors experts.{e}.{gate_proj, up_proj, down_proj}.weight; layer 1: transformers 5's
// fused experts.gate_up_proj / experts.down_proj) and shared_expert_gate (routed + sigmoid(x . w_g) * shared(x)).
// DecoderLM is checked against a per-layer reference written here in double precision (transformers'
// Qwen3_5MoeAttention / Qwen3_5MoeSparseMoeBlock, token by token, full causal attention) over a chunked prefill and
// decodes with two sequences sharing the batch, TP 2 against TP 1 (bit-identical), and the configuration errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "model/batch_builder.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_lm.h"
#include "model/ffns/moe_ffn.h"
#include "model/mixers/attention_mixer.h"
#include "model/tensor_parallel.h"

namespace ssmserve {
namespace {

using Vec = std::vector<double>;

// Shapes: hidden 64; attention 4 query heads and 2 KV heads of 32, rotary over the first 8 dims of each head
// (partial_rotary_factor 0.25); MoE 4 experts top-2, I = 32, shared expert I = 24.
constexpr int kH = 64, kV = 97, kL = 2;
constexpr int kQH = 4, kKVH = 2, kD = 32, kRot = 8, kE = 4, kTopK = 2, kI = 32, kIS = 24;
constexpr double kEps = 1e-6, kNormEps = 1e-6, kTheta = 10000.0;

nlohmann::json config_json() {
  return {{"architectures", {"QwenModulesTestForCausalLM"}}, {"model_type", "qwen_modules_test"}, {"vocab_size", kV},
          {"hidden_size", kH}, {"num_hidden_layers", kL}, {"rms_norm_eps", kEps}, {"tie_word_embeddings", false}};
}

/// The module hyperparameters an architecture mapping would pass (Qwen3.5's spelling of the RoPE fields).
nlohmann::json attention_params() {
  return {{"num_attention_heads", kQH}, {"num_key_value_heads", kKVH}, {"head_dim", kD},
          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", kTheta}, {"partial_rotary_factor", 0.25},
                               {"mrope_interleaved", true}, {"mrope_section", {2, 1, 1}}}},
          {"attn_output_gate", true}, {"qk_norm", true}, {"qk_norm_weight_offset", 1.0}, {"rms_norm_eps", kNormEps}};
}
nlohmann::json moe_params() {
  return {{"num_local_experts", kE}, {"num_experts_per_tok", kTopK}, {"intermediate_size", kI}, {"moe_layout", "qwen"},
          {"norm_topk_prob", true}, {"shared_intermediate_size", kIS}, {"shared_expert_gate", true}};
}

DecoderSpec qwen_spec(const ModelConfig& cfg) {
  DecoderSpec s;
  s.label = "QwenModules";
  s.embedding = "model.embed_tokens.weight", s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = false;
  s.norm_eps = static_cast<float>(kEps);
  s.module_params["attention"] = attention_params();
  s.module_params["moe"] = moe_params();
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerSpec layer;
    layer.mixer = {"attention", p + "input_layernorm.weight", p + "self_attn."};
    layer.ffn = {"moe", p + "post_attention_layernorm.weight", p + "mlp."};
    s.layers.push_back(layer);
  }
  return s;
}

/// Random checkpoint tensors, kept for the reference (the fused experts of layer 1 also under per-expert names).
struct Weights {
  std::map<std::string, std::vector<float>> t;
  std::vector<testing::FixtureTensor> tensors;
  std::mt19937 rng{11};
  std::vector<float> draw(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
  }
  const std::vector<float>& add(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v = draw(n, lo, hi);
    tensors.push_back(testing::f32_tensor(name, shape, v));
    return t[name] = v;
  }
  const std::vector<float>& operator[](const std::string& name) const { return t.at(name); }
};

void write_checkpoint(const std::filesystem::path& dir, Weights& w) {
  testing::write_file(dir / "config.json", config_json().dump());
  const float hs = 1.0f / std::sqrt(static_cast<float>(kH));
  w.add("model.embed_tokens.weight", {kV, kH}, -1, 1);
  w.add("model.norm.weight", {kH}, 0.8f, 1.2f);
  w.add("lm_head.weight", {kV, kH}, -hs, hs);
  for (int l = 0; l < kL; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.add(p + "input_layernorm.weight", {kH}, 0.8f, 1.2f);
    w.add(p + "post_attention_layernorm.weight", {kH}, 0.8f, 1.2f);
    const std::string a = p + "self_attn.";
    w.add(a + "q_proj.weight", {2 * kQH * kD, kH}, -2 * hs, 2 * hs);  // gate rows wide enough to matter
    w.add(a + "k_proj.weight", {kKVH * kD, kH}, -hs, hs);
    w.add(a + "v_proj.weight", {kKVH * kD, kH}, -hs, hs);
    w.add(a + "o_proj.weight", {kH, kQH * kD}, -0.1f, 0.1f);
    w.add(a + "q_norm.weight", {kD}, -0.5f, 0.5f);  // zero-centred: the effective weights 1 + w
    w.add(a + "k_norm.weight", {kD}, -0.5f, 0.5f);
    const std::string m = p + "mlp.";
    w.add(m + "gate.weight", {kE, kH}, -2 * hs, 2 * hs);
    w.add(m + "shared_expert_gate.weight", {1, kH}, -2 * hs, 2 * hs);
    w.add(m + "shared_expert.gate_proj.weight", {kIS, kH}, -hs, hs);
    w.add(m + "shared_expert.up_proj.weight", {kIS, kH}, -hs, hs);
    w.add(m + "shared_expert.down_proj.weight", {kH, kIS}, -0.2f, 0.2f);
    if (l == 0) {  // per-expert tensors
      for (int e = 0; e < kE; ++e) {
        const std::string q = m + "experts." + std::to_string(e) + ".";
        w.add(q + "gate_proj.weight", {kI, kH}, -hs, hs);
        w.add(q + "up_proj.weight", {kI, kH}, -hs, hs);
        w.add(q + "down_proj.weight", {kH, kI}, -0.2f, 0.2f);
      }
    } else {  // transformers 5's fused experts: gate_up_proj [E, 2I, H] (gate rows then up), down_proj [E, H, I]
      std::vector<float> gu, dn;
      for (int e = 0; e < kE; ++e) {
        const std::string q = m + "experts." + std::to_string(e) + ".";
        const auto g = w.t[q + "gate_proj.weight"] = w.draw(kI * kH, -hs, hs);
        const auto u = w.t[q + "up_proj.weight"] = w.draw(kI * kH, -hs, hs);
        const auto d = w.t[q + "down_proj.weight"] = w.draw(kH * kI, -0.2f, 0.2f);
        gu.insert(gu.end(), g.begin(), g.end()), gu.insert(gu.end(), u.begin(), u.end());
        dn.insert(dn.end(), d.begin(), d.end());
      }
      w.tensors.push_back(testing::f32_tensor(m + "experts.gate_up_proj", {kE, 2 * kI, kH}, gu));
      w.tensors.push_back(testing::f32_tensor(m + "experts.down_proj", {kE, kH, kI}, dn));
    }
  }
  testing::write_safetensors(dir / "model.safetensors", w.tensors);
}

// ---- The reference: one sequence, every position, double precision. ----

Vec matvec(const std::vector<float>& W, int rows, int cols, const Vec& x, int row0 = 0) {
  Vec y(static_cast<size_t>(rows), 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[r] += static_cast<double>(W[static_cast<size_t>(row0 + r) * cols + c]) * x[c];
  return y;
}
Vec rms_norm(const Vec& x, const std::vector<float>& w, double eps, double offset = 0.0) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (offset + w[i]);
  return y;
}
double silu(double x) { return x / (1.0 + std::exp(-x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Qwen3_5MoeAttention over a whole sequence: xs [T] normed inputs -> outputs [T].
std::vector<Vec> ref_attention(const Weights& w, const std::string& a, const std::vector<Vec>& xs) {
  const size_t T = xs.size();
  std::vector<std::vector<Vec>> q(T), k(T), v(T), g(T);  // [t][head][D]
  // rotate_half over the first kRot dims: pairs (i, i + kRot / 2), inv_freq_i = theta^(-2i / kRot).
  auto rope = [](Vec& x, size_t pos) {
    for (int i = 0; i < kRot / 2; ++i) {
      const double ang = static_cast<double>(pos) / std::pow(kTheta, 2.0 * i / kRot);
      const double a1 = x[i], a2 = x[i + kRot / 2];
      x[i] = a1 * std::cos(ang) - a2 * std::sin(ang);
      x[i + kRot / 2] = a2 * std::cos(ang) + a1 * std::sin(ang);
    }
  };
  for (size_t t = 0; t < T; ++t) {
    for (int h = 0; h < kQH; ++h) {  // q_proj(x).view(H, 2D).chunk(2): rows [2hD, 2hD + D) query, the next D gate
      q[t].push_back(rms_norm(matvec(w[a + "q_proj.weight"], kD, kH, xs[t], 2 * h * kD), w[a + "q_norm.weight"], kNormEps, 1.0));
      g[t].push_back(matvec(w[a + "q_proj.weight"], kD, kH, xs[t], 2 * h * kD + kD));
      rope(q[t].back(), t);
    }
    for (int h = 0; h < kKVH; ++h) {
      k[t].push_back(rms_norm(matvec(w[a + "k_proj.weight"], kD, kH, xs[t], h * kD), w[a + "k_norm.weight"], kNormEps, 1.0));
      v[t].push_back(matvec(w[a + "v_proj.weight"], kD, kH, xs[t], h * kD));
      rope(k[t].back(), t);
    }
  }
  std::vector<Vec> out(T);
  for (size_t t = 0; t < T; ++t) {
    Vec o(kQH * kD, 0.0);
    for (int h = 0; h < kQH; ++h) {
      const int kh = h / (kQH / kKVH);
      std::vector<double> s(t + 1);
      double mx = -1e300, sum = 0;
      for (size_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int i = 0; i < kD; ++i) d += q[t][h][i] * k[j][kh][i];
        s[j] = d / std::sqrt(static_cast<double>(kD));
        mx = std::max(mx, s[j]);
      }
      for (size_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (size_t j = 0; j <= t; ++j)
        for (int i = 0; i < kD; ++i) o[h * kD + i] += s[j] / sum * v[j][kh][i];
      for (int i = 0; i < kD; ++i) o[h * kD + i] *= sigmoid(g[t][h][i]);  // attn_output * sigmoid(gate)
    }
    out[t] = matvec(w[a + "o_proj.weight"], kH, kQH * kD, o);
  }
  return out;
}

Vec swiglu(const Weights& w, const std::string& q, int I, const Vec& x) {
  const Vec g = matvec(w[q + "gate_proj.weight"], I, kH, x), u = matvec(w[q + "up_proj.weight"], I, kH, x);
  Vec a(static_cast<size_t>(I));
  for (int i = 0; i < I; ++i) a[i] = silu(g[i]) * u[i];
  return matvec(w[q + "down_proj.weight"], kH, I, a);
}

/// Qwen3_5MoeSparseMoeBlock: softmax router, top-k renormalized, plus sigmoid(x . w_g) * shared_expert(x).
Vec ref_moe(const Weights& w, const std::string& m, const Vec& x) {
  const Vec logits = matvec(w[m + "gate.weight"], kE, kH, x);
  const double mx = *std::max_element(logits.begin(), logits.end());
  Vec p(kE);
  double sum = 0;
  for (int i = 0; i < kE; ++i) sum += (p[i] = std::exp(logits[i] - mx));
  for (double& v : p) v /= sum;
  std::vector<int> ids(kE);
  for (int i = 0; i < kE; ++i) ids[i] = i;
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return p[a] > p[b]; });
  double tw = 0;
  for (int j = 0; j < kTopK; ++j) tw += p[ids[j]];
  Vec out(kH, 0.0);
  for (int j = 0; j < kTopK; ++j) {
    const Vec y = swiglu(w, m + "experts." + std::to_string(ids[j]) + ".", kI, x);
    for (int i = 0; i < kH; ++i) out[i] += p[ids[j]] / tw * y[i];
  }
  const double gs = sigmoid(matvec(w[m + "shared_expert_gate.weight"], 1, kH, x)[0]);
  const Vec s = swiglu(w, m + "shared_expert.", kIS, x);
  for (int i = 0; i < kH; ++i) out[i] += gs * s[i];
  return out;
}

/// Logits [T][V] of every position of `ids`.
std::vector<Vec> ref_logits(const Weights& w, const std::vector<int32_t>& ids) {
  const size_t T = ids.size();
  std::vector<Vec> h(T);
  for (size_t t = 0; t < T; ++t) {
    h[t].resize(kH);
    for (int i = 0; i < kH; ++i) h[t][i] = w["model.embed_tokens.weight"][static_cast<size_t>(ids[t]) * kH + i];
  }
  for (int l = 0; l < kL; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> xs(T);
    for (size_t t = 0; t < T; ++t) xs[t] = rms_norm(h[t], w[p + "input_layernorm.weight"], kEps);
    const auto mix = ref_attention(w, p + "self_attn.", xs);
    for (size_t t = 0; t < T; ++t) {
      for (int i = 0; i < kH; ++i) h[t][i] += mix[t][i];
      const Vec f = ref_moe(w, p + "mlp.", rms_norm(h[t], w[p + "post_attention_layernorm.weight"], kEps));
      for (int i = 0; i < kH; ++i) h[t][i] += f[i];
    }
  }
  std::vector<Vec> logits(T);
  for (size_t t = 0; t < T; ++t) logits[t] = matvec(w["lm_head.weight"], kV, kH, rms_norm(h[t], w["model.norm.weight"], kEps));
  return logits;
}

// ---- Driving the model. ----

struct Seq {
  std::vector<int32_t> ids;
  int state_block = 0;
  std::vector<int32_t> kv_blocks;
  int done = 0;  // tokens already folded in
};

/// One step: seqs[i] feeds n[i] tokens; returns the logits of every fed position, per sequence.
std::vector<std::vector<std::vector<float>>> step(CausalLM& m, StateCache& cache, std::vector<Seq*> seqs, const std::vector<int>& n) {
  std::vector<ScheduledSeq> sched;
  std::vector<std::vector<int32_t>> tokens, tables;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = *seqs[i];
    sched.push_back({s.state_block, s.done, n[i], s.done == 0 || n[i] > 1});  // 1-token continuations: decode rows
    tokens.emplace_back(s.ids.begin() + s.done, s.ids.begin() + s.done + n[i]);
    tables.push_back(s.kv_blocks);
  }
  BatchBuilderOptions opt;
  opt.meta.chunk_size = m.chunk_size();
  opt.kv_block_size = m.kv_block_size();
  opt.linear_attention = m.has_linear_attention();
  ForwardBatch batch = build_forward_batch(sched, tokens, tables, opt);
  for (int t = 0; t < batch.num_tokens(); ++t) batch.logits_indices.push_back(t);
  std::vector<float> logits(static_cast<size_t>(batch.num_tokens()) * kV);
  m.forward(batch, cache, logits.data());
  std::vector<std::vector<std::vector<float>>> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int j = 0; j < n[i]; ++j) {
      const int64_t row = batch.seq_first_token[i] + j;
      out[i].emplace_back(logits.begin() + row * kV, logits.begin() + (row + 1) * kV);
    }
    seqs[i]->done += n[i];
  }
  return out;
}

std::vector<int32_t> prompt(int n, int seed) {
  std::mt19937 r(static_cast<unsigned>(seed));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(r() % kV);
  return ids;
}

double max_abs_diff(const std::vector<float>& got, const Vec& want) {
  double worst = 0;
  for (int i = 0; i < kV; ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  return worst;
}

class QwenModules : public ::testing::Test {
 protected:
  void SetUp() override {
    write_checkpoint(dir_.path(), w_);
    cfg_ = ModelConfig::load(dir_.path());
    spec_ = qwen_spec(cfg_);
  }
  /// Greedy-free check of every position of a 70- and a 40-token sequence: a 45-token chunk of a alone, then a's next
  /// 20 beside b's first 19, then decodes side by side (b in 3-token chunks for a while). Returns the worst error.
  double worst_error_over_schedule(CausalLM& m) {
    StateCache cache(m.num_state_layers(), m.state_shape(), 16);
    const int bs = m.kv_block_size();
    Seq a{prompt(70, 1), 1, {}}, b{prompt(40, 2), 2, {}};
    for (int i = 0; i * bs < 70; ++i) a.kv_blocks.push_back(3 + 2 * i), b.kv_blocks.push_back(4 + 2 * i);
    const auto want_a = ref_logits(w_, a.ids), want_b = ref_logits(w_, b.ids);
    std::vector<std::vector<float>> got_a, got_b;
    auto take = [](std::vector<std::vector<float>>& dst, const std::vector<std::vector<float>>& src) {
      dst.insert(dst.end(), src.begin(), src.end());
    };
    auto r = step(m, cache, {&a}, {45});
    take(got_a, r[0]);
    r = step(m, cache, {&a, &b}, {20, 19});
    take(got_a, r[0]), take(got_b, r[1]);
    while (a.done < 70 || b.done < 40) {
      std::vector<Seq*> s;
      std::vector<int> n;
      std::vector<std::vector<std::vector<float>>*> dst;
      if (a.done < 70) s.push_back(&a), n.push_back(1), dst.push_back(&got_a);
      if (b.done < 40) s.push_back(&b), n.push_back(std::min(b.done < 31 ? 3 : 1, 40 - b.done)), dst.push_back(&got_b);
      r = step(m, cache, s, n);
      for (size_t k = 0; k < s.size(); ++k) take(*dst[k], r[k]);
    }
    EXPECT_EQ(got_a.size(), 70u);
    EXPECT_EQ(got_b.size(), 40u);
    double worst = 0;
    for (size_t t = 0; t < got_a.size(); ++t) worst = std::max(worst, max_abs_diff(got_a[t], want_a[t]));
    for (size_t t = 0; t < got_b.size(); ++t) worst = std::max(worst, max_abs_diff(got_b[t], want_b[t]));
    return worst;
  }
  testing::TempDir dir_{"qwen-modules"};
  Weights w_;
  ModelConfig cfg_;
  DecoderSpec spec_;
};

TEST_F(QwenModules, MatchesPerLayerReferenceOverPrefillChunksAndDecodes) {
  auto m = load_decoder(cfg_, spec_, LoadFormat::Auto);
  const double worst = worst_error_over_schedule(*m);
  std::printf("qwen modules: worst |logit - reference| %.3g\n", worst);
  EXPECT_LT(worst, 2e-5);  // measured 7.8e-7
}

// The reference fails when any option is dropped or mis-set, so the check above cannot pass by accident.
TEST_F(QwenModules, EachOptionChangesTheLogits) {
  const std::vector<std::pair<std::string, std::pair<std::string, nlohmann::json>>> variants = {
      {"no output gate (q_proj then has the wrong shape)", {"attention", {{"attn_output_gate", false}}}},
      {"no qk_norm", {"attention", {{"qk_norm", false}}}},
      {"qk_norm without the weight offset", {"attention", {{"qk_norm_weight_offset", 0.0}}}},
      {"full rotary", {"attention", {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", kTheta}}}}}},
      {"no shared expert gate", {"moe", {{"shared_expert_gate", false}}}},
      {"no top-k renormalization", {"moe", {{"norm_topk_prob", false}}}},
  };
  for (const auto& [what, change] : variants) {
    SCOPED_TRACE(what);
    DecoderSpec s = spec_;
    s.module_params[change.first].update(change.second);
    try {
      auto m = load_decoder(cfg_, s, LoadFormat::Auto);
      EXPECT_GT(worst_error_over_schedule(*m), 1e-3);
    } catch (const Error& e) {  // a shape the checkpoint refuses is as good a failure
      EXPECT_THAT(e.what(), ::testing::HasSubstr("q_proj.weight"));
    }
  }
}

TEST_F(QwenModules, TensorParallelTwoRanksBitIdenticalToOne) {
  auto one = load_decoder(cfg_, spec_, LoadFormat::Auto);
  auto group = std::make_shared<dist::InProcessGroup>(2);
  std::vector<std::unique_ptr<CausalLM>> shards;
  for (int r = 0; r < 2; ++r) shards.push_back(load_decoder(cfg_, spec_, LoadFormat::Auto, {r, 2, &group->communicator(r)}));
  TensorParallelLM two(std::move(shards), group, nullptr);
  ASSERT_EQ(two.kv_block_size(), one->kv_block_size());
  StateCache c1(one->num_state_layers(), one->state_shape(), 8), c2(two.num_state_layers(), two.state_shape(), 8);
  Seq a1{prompt(20, 3), 1, {2, 3}}, a2 = a1;
  for (int n : {12, 5, 1, 1, 1}) {
    const auto x = step(*one, c1, {&a1}, {n}), y = step(two, c2, {&a2}, {n});
    for (size_t t = 0; t < x[0].size(); ++t) ASSERT_EQ(x[0][t], y[0][t]) << "token " << t << " of a " << n << "-token step";
  }
}

TEST(QwenModuleConfig, ReadsTheOptionsAndDefaultsThemOff) {
  testing::TempDir dir("qwen-module-config");
  testing::write_file(dir.path() / "config.json", config_json().dump());
  const ModelConfig cfg = ModelConfig::load(dir.path());
  const AttentionConfig a = AttentionConfig::from_json(attention_params(), cfg);
  EXPECT_TRUE(a.attn_output_gate);
  EXPECT_TRUE(a.qk_norm);
  EXPECT_EQ(a.qk_norm_weight_offset, 1.0f);
  EXPECT_EQ(a.rotary_dim, kRot);
  const AttentionConfig plain = AttentionConfig::from_json({{"num_attention_heads", kQH}}, cfg);
  EXPECT_FALSE(plain.attn_output_gate);
  EXPECT_FALSE(plain.qk_norm);
  EXPECT_EQ(plain.qk_norm_weight_offset, 0.0f);
  EXPECT_EQ(plain.qk_norm_eps, 1e-6f);
  const MoeConfig m = MoeConfig::from_json(moe_params());
  EXPECT_EQ(m.layout, "qwen");
  EXPECT_TRUE(m.shared_expert_gate);
  EXPECT_EQ(m.shared_prefix, "shared_expert.");
  EXPECT_FALSE(MoeConfig::from_json({{"intermediate_size", 8}}).shared_expert_gate);
  EXPECT_EQ(MoeConfig::from_json({{"intermediate_size", 8}}).shared_prefix, "shared_experts.");
}

TEST(QwenModuleConfig, RefusesWhatItCannotRun) {
  testing::TempDir dir("qwen-module-config");
  testing::write_file(dir.path() / "config.json", config_json().dump());
  const ModelConfig cfg = ModelConfig::load(dir.path());
  nlohmann::json a = attention_params();
  a["rope_parameters"]["rope_type"] = "yarn";
  EXPECT_THROW(AttentionConfig::from_json(a, cfg), Error);
  nlohmann::json m = moe_params();
  m.erase("shared_intermediate_size");
  try {
    MoeConfig::from_json(m);
    ADD_FAILURE() << "a shared expert gate without a shared expert accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("shared_expert_gate"));
  }
}

/// Dummy weights (what the GPU tests load on both backends) take the per-expert names and give a non-degenerate
/// q / k norm: the effective weights offset + w differ from the offset.
TEST(QwenModuleConfig, DummyWeightsArePerExpertWithOffsetNorms) {
  testing::TempDir dir("qwen-module-config");
  testing::write_file(dir.path() / "config.json", config_json().dump());
  const ModelConfig cfg = ModelConfig::load(dir.path());
  WeightSource src = WeightSource::dummy();
  const AttentionWeights a = read_attention_weights(src, "l.", kH, AttentionConfig::from_json(attention_params(), cfg));
  EXPECT_EQ(a.q_proj.rows, kQH * kD);
  EXPECT_EQ(a.gate.rows, kQH * kD);
  ASSERT_EQ(a.q_norm.size(), static_cast<size_t>(kD));
  double spread = 0;
  for (float x : a.q_norm) {
    EXPECT_TRUE(x >= 0.5f && x <= 1.5f) << x;
    spread = std::max(spread, std::abs(x - 1.0));
  }
  EXPECT_GT(spread, 0.1);
  const MoeWeights w = read_moe_weights(src, "l.mlp.", kH, MoeConfig::from_json(moe_params()));
  EXPECT_EQ(static_cast<int>(w.experts.size()), kE);
  EXPECT_EQ(w.shared_gate.size(), static_cast<size_t>(kH));
}

}  // namespace
}  // namespace ssmserve
