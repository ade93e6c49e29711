// A hybrid assembled from a config alone (issue 27): Mamba-2 and softmax-attention mixers interleaved, MoE and dense
// MLP FFNs alternating, muP-style scalars (embedding multiplier, FFN residual multiplier, logits scaling), untied
// head; random fp32 weights written as a safetensors checkpoint. DecoderLM is checked against a straightforward
// per-layer reference written here in double precision (token-by-token recurrences, full causal attention, dense
// routing), over one prefill, over a chunked + decode schedule with two sequences sharing the batch (and so each KV
// block table spanning several blocks), and TP 2 against TP 1 (bit-identical, as every CPU TP path).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
#include "model/decoder/layer_types.h"
#include "model/tensor_parallel.h"

namespace ssmserve {
namespace {

using Vec = std::vector<double>;

// Shapes: hidden 64; Mamba-2 4 heads x 32 (d_inner 128), 2 groups, d_state 8, conv 4, chunk 8; attention 8 query
// heads and 4 KV heads of 16; MoE 4 experts top-2, I = 32; MLP I = 48 (SiLU-gated).
constexpr int kH = 64, kV = 97, kL = 4;
constexpr int kNH = 4, kP = 32, kI = kNH * kP, kG = 2, kN = 8, kK = 4, kConv = kI + 2 * kG * kN;
constexpr int kQH = 8, kKVH = 4, kD = 16, kE = 4, kTopK = 2, kIMoe = 32, kIMlp = 48;
constexpr double kEps = 1e-5, kEmbMult = 2.0, kFfnBeta = 0.5, kLogitsScale = 4.0, kTheta = 10000.0;

nlohmann::json config_json() {
  return {{"architectures", {"HybridTestForCausalLM"}}, {"model_type", "hybrid_test"}, {"vocab_size", kV},
          {"hidden_size", kH}, {"num_hidden_layers", kL}, {"rms_norm_eps", kEps}, {"layer_norm_epsilon", kEps},
          {"tie_word_embeddings", false},
          // Mixers by transformers' Nemotron-H spelling, FFNs by Jamba's expert period.
          {"hybrid_override_pattern", "M*M*"}, {"num_experts", kE}, {"expert_layer_period", 2}, {"expert_layer_offset", 1},
          {"num_attention_heads", kQH}, {"num_key_value_heads", kKVH}, {"head_dim", kD}, {"rope_theta", kTheta}};
}

/// The architecture mapping a real family would write: config fields -> DecoderSpec.
DecoderSpec hybrid_spec(const ModelConfig& cfg) {
  DecoderSpec s;
  s.label = "Hybrid";
  s.embedding = "model.embed_tokens.weight", s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = false;
  s.norm_eps = static_cast<float>(kEps);
  s.embedding_multiplier = static_cast<float>(kEmbMult), s.logits_scaling = static_cast<float>(kLogitsScale);
  s.chunk_size = 8;
  s.module_params["mamba2"] = {{"num_heads", kNH}, {"head_dim", kP}, {"state_size", kN}, {"n_groups", kG}, {"conv_kernel", kK},
                               {"chunk_size", 8}, {"expand", 2}};
  s.module_params["moe"] = {{"num_local_experts", kE}, {"num_experts_per_tok", kTopK}, {"intermediate_size", kIMoe}};
  s.module_params["mlp"] = {{"intermediate_size", kIMlp}, {"hidden_act", "silu"}};
  const auto types = read_layer_types(cfg.raw, cfg.num_hidden_layers, "mamba");
  const auto moe = read_moe_layers(cfg.raw, cfg.num_hidden_layers);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerSpec layer;
    const bool attn = types[l] == "attention";
    layer.mixer = {attn ? "attention" : "mamba2", p + "input_layernorm.weight", p + (attn ? "self_attn." : "mamba.")};
    layer.ffn = {moe[l] ? "moe" : "mlp", p + "post_attention_layernorm.weight", p + (moe[l] ? "block_sparse_moe." : "mlp."), 1.0f,
                 static_cast<float>(kFfnBeta)};
    s.layers.push_back(layer);
  }
  return s;
}

/// Random checkpoint tensors, kept as doubles for the reference.
struct Weights {
  std::map<std::string, std::vector<float>> t;
  std::vector<testing::FixtureTensor> tensors;
  std::mt19937 rng{7};
  const std::vector<float>& add(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
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
    if (l % 2 == 0) {  // Mamba-2
      const std::string m = p + "mamba.";
      w.add(m + "in_proj.weight", {kI + kConv + kNH, kH}, -hs, hs);
      w.add(m + "conv1d.weight", {kConv, 1, kK}, -0.5f, 0.5f);
      w.add(m + "conv1d.bias", {kConv}, -0.1f, 0.1f);
      w.add(m + "dt_bias", {kNH}, -2.0f, 0.0f);
      w.add(m + "A_log", {kNH}, 0.0f, 1.5f);
      w.add(m + "D", {kNH}, 0.5f, 1.5f);
      w.add(m + "norm.weight", {kI}, 0.8f, 1.2f);
      w.add(m + "out_proj.weight", {kH, kI}, -0.1f, 0.1f);
    } else {  // attention
      const std::string a = p + "self_attn.";
      w.add(a + "q_proj.weight", {kQH * kD, kH}, -hs, hs);
      w.add(a + "k_proj.weight", {kKVH * kD, kH}, -hs, hs);
      w.add(a + "v_proj.weight", {kKVH * kD, kH}, -hs, hs);
      w.add(a + "o_proj.weight", {kH, kQH * kD}, -0.1f, 0.1f);
    }
    if (l % 2 == 1) {  // MoE
      const std::string e = p + "block_sparse_moe.";
      w.add(e + "gate.weight", {kE, kH}, -hs, hs);
      for (int x = 0; x < kE; ++x) {
        const std::string q = e + "experts." + std::to_string(x) + ".";
        w.add(q + "w1.weight", {kIMoe, kH}, -hs, hs);
        w.add(q + "w2.weight", {kH, kIMoe}, -0.2f, 0.2f);
        w.add(q + "w3.weight", {kIMoe, kH}, -hs, hs);
      }
    } else {
      const std::string m = p + "mlp.";
      w.add(m + "gate_proj.weight", {kIMlp, kH}, -hs, hs);
      w.add(m + "up_proj.weight", {kIMlp, kH}, -hs, hs);
      w.add(m + "down_proj.weight", {kH, kIMlp}, -0.2f, 0.2f);
    }
  }
  testing::write_safetensors(dir / "model.safetensors", w.tensors);
}

// ---- The reference: one sequence, every position, double precision. ----

Vec matvec(const std::vector<float>& W, int rows, int cols, const Vec& x) {
  Vec y(static_cast<size_t>(rows), 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[r] += static_cast<double>(W[static_cast<size_t>(r) * cols + c]) * x[c];
  return y;
}
Vec rms_norm(const Vec& x, const std::vector<float>& w, size_t off = 0, size_t n = 0) {
  if (n == 0) n = x.size();
  double ss = 0;
  for (size_t i = off; i < off + n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + kEps);
  Vec y(x);
  for (size_t i = off; i < off + n; ++i) y[i] = x[i] * inv * w[i];
  return y;
}
double silu(double x) { return x / (1.0 + std::exp(-x)); }
double softplus(double x) { return std::log1p(std::exp(x)); }

/// Mamba-2 over a whole sequence: xs [T] normed inputs -> outputs [T].
std::vector<Vec> ref_mamba2(const Weights& w, const std::string& m, const std::vector<Vec>& xs) {
  const size_t T = xs.size();
  std::vector<Vec> proj(T), out(T);
  for (size_t t = 0; t < T; ++t) proj[t] = matvec(w[m + "in_proj.weight"], kI + kConv + kNH, kH, xs[t]);
  std::vector<double> state(static_cast<size_t>(kNH) * kP * kN, 0.0);
  for (size_t t = 0; t < T; ++t) {
    Vec xc(kConv);
    for (int c = 0; c < kConv; ++c) {
      double acc = w[m + "conv1d.bias"][c];
      for (int k = 0; k < kK; ++k) {
        const long src = static_cast<long>(t) - (kK - 1) + k;
        if (src >= 0) acc += static_cast<double>(w[m + "conv1d.weight"][c * kK + k]) * proj[src][kI + c];
      }
      xc[c] = silu(acc);
    }
    Vec y(kI);
    for (int h = 0; h < kNH; ++h) {
      const int g = h / (kNH / kG);
      const double dt = softplus(proj[t][kI + kConv + h] + w[m + "dt_bias"][h]);
      const double A = -std::exp(static_cast<double>(w[m + "A_log"][h]));
      for (int p = 0; p < kP; ++p) {
        const double x = xc[h * kP + p];
        double acc = 0;
        for (int n = 0; n < kN; ++n) {
          double& s = state[(static_cast<size_t>(h) * kP + p) * kN + n];
          s = s * std::exp(dt * A) + dt * xc[kI + g * kN + n] * x;
          acc += xc[kI + kG * kN + g * kN + n] * s;
        }
        y[h * kP + p] = acc + w[m + "D"][h] * x;
      }
    }
    Vec gated(kI);
    for (int i = 0; i < kI; ++i) gated[i] = y[i] * silu(proj[t][i]);
    for (int g = 0; g < kG; ++g) gated = rms_norm(gated, w[m + "norm.weight"], static_cast<size_t>(g) * (kI / kG), kI / kG);
    out[t] = matvec(w[m + "out_proj.weight"], kH, kI, gated);
  }
  return out;
}

std::vector<Vec> ref_attention(const Weights& w, const std::string& a, const std::vector<Vec>& xs) {
  const size_t T = xs.size();
  std::vector<Vec> q(T), k(T), v(T), out(T);
  auto rope = [](Vec& x, int heads, size_t pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < kD / 2; ++i) {
        const double ang = static_cast<double>(pos) / std::pow(kTheta, 2.0 * i / kD);
        double& x1 = x[h * kD + i];
        double& x2 = x[h * kD + i + kD / 2];
        const double a1 = x1, a2 = x2;
        x1 = a1 * std::cos(ang) - a2 * std::sin(ang);
        x2 = a2 * std::cos(ang) + a1 * std::sin(ang);
      }
  };
  for (size_t t = 0; t < T; ++t) {
    q[t] = matvec(w[a + "q_proj.weight"], kQH * kD, kH, xs[t]);
    k[t] = matvec(w[a + "k_proj.weight"], kKVH * kD, kH, xs[t]);
    v[t] = matvec(w[a + "v_proj.weight"], kKVH * kD, kH, xs[t]);
    rope(q[t], kQH, t), rope(k[t], kKVH, t);
  }
  for (size_t t = 0; t < T; ++t) {
    Vec o(kQH * kD, 0.0);
    for (int h = 0; h < kQH; ++h) {
      const int kh = h / (kQH / kKVH);
      std::vector<double> s(t + 1);
      double mx = -1e300, sum = 0;
      for (size_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int i = 0; i < kD; ++i) d += q[t][h * kD + i] * k[j][kh * kD + i];
        s[j] = d / std::sqrt(static_cast<double>(kD));
        mx = std::max(mx, s[j]);
      }
      for (size_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (size_t j = 0; j <= t; ++j)
        for (int i = 0; i < kD; ++i) o[h * kD + i] += s[j] / sum * v[j][kh * kD + i];
    }
    out[t] = matvec(w[a + "o_proj.weight"], kH, kQH * kD, o);
  }
  return out;
}

Vec ref_moe(const Weights& w, const std::string& e, const Vec& x) {
  Vec logits = matvec(w[e + "gate.weight"], kE, kH, x);
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
    const std::string q = e + "experts." + std::to_string(ids[j]) + ".";
    const Vec g = matvec(w[q + "w1.weight"], kIMoe, kH, x), u = matvec(w[q + "w3.weight"], kIMoe, kH, x);
    Vec a(kIMoe);
    for (int i = 0; i < kIMoe; ++i) a[i] = silu(g[i]) * u[i];
    const Vec y = matvec(w[q + "w2.weight"], kH, kIMoe, a);
    for (int i = 0; i < kH; ++i) out[i] += p[ids[j]] / tw * y[i];
  }
  return out;
}

Vec ref_mlp(const Weights& w, const std::string& m, const Vec& x) {
  const Vec g = matvec(w[m + "gate_proj.weight"], kIMlp, kH, x), u = matvec(w[m + "up_proj.weight"], kIMlp, kH, x);
  Vec a(kIMlp);
  for (int i = 0; i < kIMlp; ++i) a[i] = silu(g[i]) * u[i];
  return matvec(w[m + "down_proj.weight"], kH, kIMlp, a);
}

/// Logits [T][V] of every position of `ids`.
std::vector<Vec> ref_logits(const Weights& w, const std::vector<int32_t>& ids) {
  const size_t T = ids.size();
  std::vector<Vec> h(T);
  for (size_t t = 0; t < T; ++t) {
    h[t].resize(kH);
    for (int i = 0; i < kH; ++i) h[t][i] = kEmbMult * w["model.embed_tokens.weight"][static_cast<size_t>(ids[t]) * kH + i];
  }
  for (int l = 0; l < kL; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Vec> xs(T);
    for (size_t t = 0; t < T; ++t) xs[t] = rms_norm(h[t], w[p + "input_layernorm.weight"]);
    const auto mix = l % 2 == 0 ? ref_mamba2(w, p + "mamba.", xs) : ref_attention(w, p + "self_attn.", xs);
    for (size_t t = 0; t < T; ++t) {
      for (int i = 0; i < kH; ++i) h[t][i] += mix[t][i];
      const Vec x = rms_norm(h[t], w[p + "post_attention_layernorm.weight"]);
      const Vec f = l % 2 == 1 ? ref_moe(w, p + "block_sparse_moe.", x) : ref_mlp(w, p + "mlp.", x);
      for (int i = 0; i < kH; ++i) h[t][i] += kFfnBeta * f[i];
    }
  }
  std::vector<Vec> logits(T);
  for (size_t t = 0; t < T; ++t) {
    logits[t] = matvec(w["lm_head.weight"], kV, kH, rms_norm(h[t], w["model.norm.weight"]));
    for (double& x : logits[t]) x /= kLogitsScale;
  }
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
    const bool prefilling = s.done == 0 || n[i] > 1;  // 1-token continuations run as decode rows
    sched.push_back({s.state_block, s.done, n[i], prefilling});
    tokens.emplace_back(s.ids.begin() + s.done, s.ids.begin() + s.done + n[i]);
    tables.push_back(s.kv_blocks);
  }
  BatchBuilderOptions opt;
  opt.meta.chunk_size = m.chunk_size();
  opt.kv_block_size = m.kv_block_size();
  opt.linear_attention = m.has_linear_attention();
  ForwardBatch batch = build_forward_batch(sched, tokens, tables, opt);
  std::vector<std::vector<std::vector<float>>> out(seqs.size());
  // Every token row's logits, then split back per sequence through seq_first_token.
  for (int t = 0; t < batch.num_tokens(); ++t) batch.logits_indices.push_back(t);
  std::vector<float> logits(static_cast<size_t>(batch.num_tokens()) * kV);
  m.forward(batch, cache, logits.data());
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int j = 0; j < n[i]; ++j) {
      const int row = batch.seq_first_token[i] + j;
      out[i].emplace_back(logits.begin() + static_cast<int64_t>(row) * kV, logits.begin() + static_cast<int64_t>(row + 1) * kV);
    }
    seqs[i]->done += n[i];
  }
  return out;
}

void expect_close(const std::vector<float>& got, const Vec& want, const std::string& what) {
  double worst = 0;
  for (int i = 0; i < kV; ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
  EXPECT_LT(worst, 2e-4) << what;
}

class HybridDecoder : public ::testing::Test {
 protected:
  void SetUp() override {
    write_checkpoint(dir_.path(), w_);
    cfg_ = ModelConfig::load(dir_.path());
    spec_ = hybrid_spec(cfg_);
  }
  testing::TempDir dir_{"hybrid-decoder"};
  Weights w_;
  ModelConfig cfg_;
  DecoderSpec spec_;
};

std::vector<int32_t> prompt(int n, int seed) {
  std::mt19937 r(static_cast<unsigned>(seed));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(r() % kV);
  return ids;
}

TEST_F(HybridDecoder, LayoutFollowsTheModules) {
  auto m = load_decoder(cfg_, spec_, LoadFormat::Auto);
  // Two Mamba-2 layers: conv (4 - 1) x 160 and state 4 x 32 x 8 each, in one page; two attention layers of
  // 2 x 4 KV heads x 16 x 4 bytes per token: (2 x (480 + 1024)) x 4 / 1024 = 11 tokens fit, rounded down to a
  // power of two (so that a prefix-cache block is the larger of it and the chunk): 8.
  EXPECT_EQ(m->num_state_layers(), 1);
  EXPECT_EQ(m->state_shape().conv_elems, 2 * 3 * kConv);
  EXPECT_EQ(m->state_shape().ssm_elems, 2 * kNH * kP * kN);
  EXPECT_EQ(m->kv_block_size(), 8);
  EXPECT_EQ(m->chunk_size(), 8);
}

TEST_F(HybridDecoder, MatchesPerLayerReferenceOverPrefillChunksAndDecodes) {
  auto m = load_decoder(cfg_, spec_, LoadFormat::Auto);
  const int bs = m->kv_block_size();
  StateCache cache(m->num_state_layers(), m->state_shape(), 16);
  Seq a{prompt(30, 1), 1, {3, 4, 5, 9}}, b{prompt(26, 2), 2, {6, 7, 8, 10}};
  ASSERT_GE(static_cast<int>(a.kv_blocks.size()) * bs, 30);
  const auto want_a = ref_logits(w_, a.ids), want_b = ref_logits(w_, b.ids);
  std::vector<std::vector<float>> got_a, got_b;
  auto take = [](std::vector<std::vector<float>>& dst, const std::vector<std::vector<float>>& src) { dst.insert(dst.end(), src.begin(), src.end()); };
  // a: one 13-token chunk alone (chunk boundaries of 8 cut inside), then 7 with b's first 19, then decodes
  // side by side (b still prefilling for a while), then both decode to the end.
  auto r = step(*m, cache, {&a}, {13});
  take(got_a, r[0]);
  r = step(*m, cache, {&a, &b}, {7, 19});
  take(got_a, r[0]), take(got_b, r[1]);
  while (a.done < 30 || b.done < 26) {
    std::vector<Seq*> s;
    std::vector<int> n;
    std::vector<std::vector<std::vector<float>>*> dst;
    if (a.done < 30) s.push_back(&a), n.push_back(1), dst.push_back(&got_a);
    if (b.done < 26) s.push_back(&b), n.push_back(std::min(b.done < 22 ? 3 : 1, 26 - b.done)), dst.push_back(&got_b);
    r = step(*m, cache, s, n);
    for (size_t k = 0; k < s.size(); ++k) take(*dst[k], r[k]);
  }
  ASSERT_EQ(got_a.size(), 30u);
  ASSERT_EQ(got_b.size(), 26u);
  for (size_t t = 0; t < 30; ++t) expect_close(got_a[t], want_a[t], "sequence a, position " + std::to_string(t));
  for (size_t t = 0; t < 26; ++t) expect_close(got_b[t], want_b[t], "sequence b, position " + std::to_string(t));
}

TEST_F(HybridDecoder, TensorParallelTwoRanksBitIdenticalToOne) {
  auto one = load_decoder(cfg_, spec_, LoadFormat::Auto);
  auto group = std::make_shared<dist::InProcessGroup>(2);
  std::vector<std::unique_ptr<CausalLM>> shards;
  for (int r = 0; r < 2; ++r) shards.push_back(load_decoder(cfg_, spec_, LoadFormat::Auto, {r, 2, &group->communicator(r)}));
  TensorParallelLM two(std::move(shards), group, nullptr);
  ASSERT_EQ(two.kv_block_size(), one->kv_block_size());
  StateCache c1(one->num_state_layers(), one->state_shape(), 8), c2(two.num_state_layers(), two.state_shape(), 8);
  Seq a1{prompt(20, 3), 1, {2, 3, 4}}, a2 = a1;
  for (int n : {12, 5, 1, 1, 1}) {
    const auto x = step(*one, c1, {&a1}, {n}), y = step(two, c2, {&a2}, {n});
    for (size_t t = 0; t < x[0].size(); ++t) ASSERT_EQ(x[0][t], y[0][t]) << "token " << t << " of a " << n << "-token step";
  }
}

// The GPU reference mode (ModelConfig::round_gemm_inputs_bf16, off by default): loaded without it the decoder is the
// default one bit for bit; with it the logits move by about bf16's rounding (every GEMM input rounded) and no more,
// and TP 2 stays bit-identical to TP 1 (the gathered paths round the same inputs).
TEST_F(HybridDecoder, RoundGemmInputsBf16IsOffByDefaultAndRoundsEverywhere) {
  EXPECT_FALSE(cfg_.round_gemm_inputs_bf16);
  ModelConfig rc = cfg_;
  rc.round_gemm_inputs_bf16 = true;
  auto plain = load_decoder(cfg_, spec_, LoadFormat::Auto), rounded = load_decoder(rc, spec_, LoadFormat::Auto);
  auto group = std::make_shared<dist::InProcessGroup>(2);
  std::vector<std::unique_ptr<CausalLM>> shards;
  for (int r = 0; r < 2; ++r)
    shards.push_back(load_decoder(rc, spec_, LoadFormat::Auto, {r, 2, &group->communicator(r)}));
  TensorParallelLM two(std::move(shards), group, nullptr);
  StateCache cp(plain->num_state_layers(), plain->state_shape(), 8);
  StateCache cr(rounded->num_state_layers(), rounded->state_shape(), 8);
  StateCache c2(two.num_state_layers(), two.state_shape(), 8);
  Seq ap{prompt(20, 3), 1, {2, 3, 4}}, ar = ap, a2 = ap;
  double num = 0, den = 0;
  for (int n : {12, 5, 1, 1, 1}) {
    const auto p = step(*plain, cp, {&ap}, {n}), r = step(*rounded, cr, {&ar}, {n}), t = step(two, c2, {&a2}, {n});
    for (size_t k = 0; k < p[0].size(); ++k) {
      ASSERT_EQ(r[0][k], t[0][k]) << "TP 2: token " << k << " of a " << n << "-token step";
      for (int i = 0; i < kV; ++i) {
        const double d = double(r[0][k][i]) - p[0][k][i];
        num += d * d, den += double(p[0][k][i]) * p[0][k][i];
      }
    }
  }
  const double rel = std::sqrt(num / den);
  EXPECT_GT(rel, 1e-4) << "the mode must round";
  EXPECT_LT(rel, 2e-2) << "bf16 rounding of the inputs moves the logits by about 2^-9";
  std::printf("round_gemm_inputs_bf16: logits rel err %.3g against fp32 activations\n", rel);
}

TEST_F(HybridDecoder, UnknownModuleKindIsAClearError) {
  spec_.layers[1].ffn.kind = "gelu_mlp";
  try {
    load_decoder(cfg_, spec_, LoadFormat::Auto);
    ADD_FAILURE() << "unknown kind accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("layer type \"gelu_mlp\" is not registered"));
  }
}

}  // namespace
}  // namespace ssmserve
