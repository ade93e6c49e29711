// Owns the sparse MoE FFN on the CPU: weights (the rank's expert rows) and the forward (cpu::sparse_moe, or its
// tensor-parallel form with TP = 1's arithmetic).
#include "model/ffns/moe_ffn.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "model/decoder/params.h"
#include "model/ffns/mlp_ffn.h"

namespace ssmserve {
namespace {

class MoeFfn final : public CpuModule {
 public:
  cpu::MoeRouting routing;
  int64_t hidden = 0, intermediate = 0;  // intermediate: the whole I
  Weight gate;                           ///< [E, hidden] (replicated)
  std::vector<cpu::ExpertWeights> experts;
  dist::TpRank tp;
  std::unique_ptr<CpuModule> shared;  ///< the shared expert (a dense MLP), or null
  std::vector<float> shared_gate;     ///< [hidden] the shared expert's sigmoid gate (replicated), or empty

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    if (tp.world > 1) forward_gathered(x, T, out, step.scratch);
    else cpu::sparse_moe(x, T, hidden, gate, experts, routing, out);
    if (shared) {  // out += s_t * shared_expert(x), s_t = sigmoid(x_t . w_g) with a gate, else 1
      float* y = step.scratch.f32(7, T * hidden);
      shared->forward(x, T, y, step);
      for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * hidden;
        float st = 1.0f;
        if (!shared_gate.empty()) {  // one fp32 dot in column order: the same for any batch
          float d = 0.0f;
          for (int64_t c = 0; c < hidden; ++c) d += xt[c] * shared_gate[c];
          st = 1.0f / (1.0f + std::exp(-d));
        }
        float* o = out + t * hidden;
        const float* yt = y + t * hidden;
        for (int64_t c = 0; c < hidden; ++c) o[c] += st * yt[c];
      }
    }
  }

 private:
  // cpu::sparse_moe on a tensor-parallel rank with TP = 1's arithmetic: the replicated router picks the same experts
  // on every rank; per expert (ascending), each rank computes its I / tp rows of w1 / w3, the ranks all-gather
  // silu(w1 x) * (w3 x) into the whole I, and each computes its output rows of w2 over the whole I and adds them,
  // weighted, into its output columns exactly as sparse_moe does; the columns are all-gathered last.
  void forward_gathered(const float* x, int64_t T, float* out, Scratch& s) const {
    const int E = static_cast<int>(experts.size()), K = routing.top_k;
    const int64_t Hd = hidden, IF = intermediate, W = tp.world;
    const int64_t per = (Hd + W - 1) / W, oc = dist::output_shard(Hd, tp.comm->rank(), tp.world).size();
    std::vector<float> logits(static_cast<size_t>(T * E)), wts(static_cast<size_t>(T * K));
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    cpu::linear(x, T, gate, nullptr, logits.data());
    cpu::moe_route(logits.data(), T, E, routing, ids.data(), wts.data());
    std::vector<float>& part = s.vec(0);
    part.assign(static_cast<size_t>(T * per), 0.0f);
    std::vector<int64_t> tok;
    std::vector<float> tw;
    for (int e = 0; e < E; ++e) {
      tok.clear(), tw.clear();
      for (int64_t t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k)
          if (ids[t * K + k] == e) tok.push_back(t), tw.push_back(wts[t * K + k]);
      if (tok.empty()) continue;  // the same on every rank: no collective
      const cpu::ExpertWeights& w = experts[e];
      const int64_t n = static_cast<int64_t>(tok.size()), I = w.w1.rows;
      float* xe = s.f32(1, n * Hd);
      float* g = s.f32(2, n * I);
      float* u = s.f32(3, n * I);
      float* gf = s.f32(4, n * IF);
      float* ye = s.f32(5, n * std::max<int64_t>(oc, 1));
      for (int64_t i = 0; i < n; ++i) std::copy_n(x + tok[i] * Hd, Hd, xe + i * Hd);
      // The activation and the weighted adds are the kernels' own (their instruction-set variant's arithmetic).
      cpu::linear(xe, n, w.w1, nullptr, g);
      if (w.gated()) cpu::linear(xe, n, w.w3, nullptr, u);
      cpu::expert_activation(w.gated(), g, u, n * I);
      dist::all_gather_columns(g, n, I, I, *tp.comm, gf, IF, s.vec(6));
      if (oc == 0) continue;
      cpu::linear(gf, n, IF, w.w2, nullptr, ye, oc);
      for (int64_t i = 0; i < n; ++i) cpu::moe_add_weighted(part.data() + tok[i] * per, ye + i * oc, tw[i], oc);
    }
    dist::all_gather_output_columns(part.data(), T, Hd, *tp.comm, out, Hd, s.vec(6));
  }
};

}  // namespace

namespace {

/// Expert e's [rows, cols] matrix of a stacked [E, rows, cols] tensor (a view).
Weight expert_view(const Weight& stacked, int64_t e, int64_t rows, int64_t cols) {
  Weight v = stacked;
  v.cpu_panels.reset();
  v.rows = rows, v.cols = cols;
  v.data = static_cast<const std::byte*>(stacked.data) + e * rows * cols * static_cast<int64_t>(dtype_size(stacked.dtype));
  return v;
}

/// The experts of stacked tensors gate_up [E, 2I, hidden] (gate rows then up rows) and down [E, hidden, I] (views).
std::vector<cpu::ExpertWeights> split_stacked_experts(const Weight& gate_up, const Weight& down, int64_t E, int64_t I, int64_t Hd) {
  std::vector<cpu::ExpertWeights> out;
  for (int64_t e = 0; e < E; ++e) {
    cpu::ExpertWeights x;
    const Weight gu = expert_view(gate_up, e, 2 * I, Hd);
    x.w1 = dist::slice_rows(gu, {dist::Range{0, I}});
    x.w3 = dist::slice_rows(gu, {dist::Range{I, 2 * I}});
    x.w2 = expert_view(down, e, Hd, I);
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

MoeConfig MoeConfig::from_json(const nlohmann::json& j) {
  MoeConfig c;
  c.num_experts = param_int(j, "num_local_experts", 8);
  c.top_k = param_int(j, "num_experts_per_tok", 2);
  SSM_CHECK(c.top_k <= c.num_experts, "config.json: num_experts_per_tok {} exceeds num_local_experts {}", c.top_k, c.num_experts);
  SSM_CHECK(c.num_experts <= 4096, "config.json: num_local_experts must be <= 4096 (got {})", c.num_experts);
  const std::string act = param_string(j, "hidden_act", "silu");
  SSM_CHECK(act == "silu" || act == "relu2", "config.json: hidden_act \"{}\" is not supported for MoE experts (silu, relu2)",
            text_excerpt(act));
  c.gated = act == "silu";
  c.intermediate_size = param_int(j, "intermediate_size", -1);
  const std::string scoring = param_string(j, "scoring_func", "softmax");
  SSM_CHECK(scoring == "softmax" || scoring == "sigmoid", "config.json: scoring_func \"{}\" is not supported (softmax, sigmoid)",
            text_excerpt(scoring));
  c.scoring = scoring == "sigmoid" ? cpu::MoeRouting::Scoring::Sigmoid : cpu::MoeRouting::Scoring::Softmax;
  c.renormalize = param_bool(j, "norm_topk_prob", true);
  c.routed_scaling_factor = param_float(j, {"routed_scaling_factor"}, 1.0f);
  c.n_group = param_int(j, "n_group", 1);
  c.topk_group = param_int(j, "topk_group", 1);
  SSM_CHECK(c.num_experts % c.n_group == 0 && c.topk_group <= c.n_group && (c.n_group == 1 || c.num_experts / c.n_group >= 2) &&
                c.top_k <= c.topk_group * (c.num_experts / c.n_group),
            "config.json: n_group {} / topk_group {} do not fit {} experts with num_experts_per_tok {}", c.n_group, c.topk_group,
            c.num_experts, c.top_k);
  c.layout = param_string(j, "moe_layout", "mixtral");
  SSM_CHECK(c.layout == "mixtral" || c.layout == "granite" || c.layout == "nemotron" || c.layout == "jamba" || c.layout == "qwen",
            "decoder: moe_layout \"{}\" is not known (mixtral, granite, nemotron, jamba, qwen)", text_excerpt(c.layout));
  SSM_CHECK(c.gated == (c.layout != "nemotron"), "config.json: {} experts must be {}", c.layout, c.gated ? "relu2" : "SiLU-gated");
  if (j.contains("shared_intermediate_size") && !j["shared_intermediate_size"].is_null() && j["shared_intermediate_size"] != 0)
    c.shared_intermediate_size = param_int(j, "shared_intermediate_size", 0);  // 0: no shared expert
  c.shared_gated = param_string(j, "shared_hidden_act", act) == "silu";
  c.shared_prefix = param_string(j, "shared_prefix", c.layout == "qwen" ? "shared_expert." : "shared_experts.");
  c.shared_expert_gate = param_bool(j, "shared_expert_gate", false);
  SSM_CHECK(!c.shared_expert_gate || c.shared_intermediate_size > 0,
            "config.json: shared_expert_gate needs a shared expert (shared_intermediate_size > 0)");
  return c;
}

cpu::MoeRouting MoeConfig::routing() const {
  cpu::MoeRouting r;
  r.scoring = scoring, r.top_k = top_k, r.renormalize = renormalize, r.routed_scaling_factor = routed_scaling_factor;
  r.n_group = n_group, r.topk_group = topk_group;
  return r;
}

nlohmann::json shared_mlp_params(const MoeConfig& c) {
  return {{"intermediate_size", c.shared_intermediate_size}, {"hidden_act", c.shared_gated ? "silu" : "relu2"},
          {"mlp_layout", c.layout == "granite" ? "input_linear" : "gate_up_proj"}};
}

MoeWeights read_moe_weights(WeightSource& src, const std::string& p, int64_t Hd, const MoeConfig& c) {
  const int64_t I = c.intermediate_size, E = c.num_experts;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), i_scale = 1.0f / std::sqrt(static_cast<float>(I));
  MoeWeights w;
  if (c.shared_expert_gate) w.shared_gate = src.vector(p + "shared_expert_gate.weight", {1, Hd}, DummyInit::uniform(in_scale));
  if (c.layout == "granite") {
    const std::string q = p + "block_sparse_moe.";
    w.gate = src.matrix(q + "router.layer.weight", {E, Hd}, DummyInit::uniform(in_scale));
    const Weight in = src.matrix(q + "input_linear.weight", {E, 2 * I, Hd}, DummyInit::uniform(in_scale));
    const Weight outw = src.matrix(q + "output_linear.weight", {E, Hd, I}, DummyInit::uniform(i_scale));
    w.experts = split_stacked_experts(in, outw, E, I, Hd);
    return w;
  }
  const bool jamba = c.layout == "jamba", nemotron = c.layout == "nemotron", qwen = c.layout == "qwen";
  w.gate = src.matrix(p + (jamba ? "router.weight" : "gate.weight"), {E, Hd}, DummyInit::uniform(in_scale));
  if (nemotron) w.correction_bias = src.vector(p + "gate.e_score_correction_bias", {E}, DummyInit::constant(0.0f));
  if (qwen && !src.has(p + "experts.0.gate_proj.weight") && src.has(p + "experts.gate_up_proj")) {  // transformers 5
    const Weight gu = src.matrix(p + "experts.gate_up_proj", {E, 2 * I, Hd}, DummyInit::uniform(in_scale));
    const Weight down = src.matrix(p + "experts.down_proj", {E, Hd, I}, DummyInit::uniform(i_scale));
    w.experts = split_stacked_experts(gu, down, E, I, Hd);
    return w;
  }
  const char* n1 = nemotron ? "up_proj" : jamba || qwen ? "gate_proj" : "w1";
  const char* n2 = nemotron || jamba || qwen ? "down_proj" : "w2";
  const char* n3 = jamba || qwen ? "up_proj" : "w3";
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = fmt::format("{}experts.{}.", p, e);
    cpu::ExpertWeights x;
    x.w1 = src.matrix(q + n1 + ".weight", {I, Hd}, DummyInit::uniform(in_scale));
    x.w2 = src.matrix(q + n2 + ".weight", {Hd, I}, DummyInit::uniform(i_scale));
    if (c.gated) x.w3 = src.matrix(q + n3 + ".weight", {I, Hd}, DummyInit::uniform(in_scale));
    w.experts.push_back(std::move(x));
  }
  return w;
}

std::unique_ptr<CpuModule> make_moe_ffn(const ModuleArgs& a) {
  const MoeConfig c = MoeConfig::from_json(a.params);
  auto m = std::make_unique<MoeFfn>();
  m->routing = c.routing();
  m->hidden = a.cfg.hidden_size;
  m->intermediate = c.intermediate_size;
  m->tp = a.tp;
  const int64_t Hd = m->hidden;
  const dist::Range i = dist::even_shard(c.intermediate_size, a.tp.rank, a.tp.world, a.label + " intermediate_size (tensor-parallel experts)");
  const dist::Range o = dist::output_shard(Hd, a.tp.rank, a.tp.world);
  MoeWeights w = read_moe_weights(a.src, a.prefix, Hd, c);
  m->gate = std::move(w.gate);
  m->routing.correction_bias = std::move(w.correction_bias);
  cpu::pack_for_linear(m->gate);  // the router reads fp32 x also in the GPU reference mode (round_gemm_inputs_bf16)
  for (cpu::ExpertWeights& x : w.experts) {
    x.w1 = dist::slice_rows(x.w1, {i});
    x.w2 = dist::slice_rows(x.w2, {o});  // output rows
    if (x.gated()) x.w3 = dist::slice_rows(x.w3, {i});
    for (Weight* proj : {&x.w1, &x.w2, &x.w3}) {
      if (proj->rows > 0) cpu::pack_for_linear(*proj);
      proj->round_input_bf16 = a.cfg.round_gemm_inputs_bf16;  // the GPU's bf16 experts: x and the activations
    }
    m->experts.push_back(std::move(x));
  }
  if (c.shared_intermediate_size > 0) {
    const nlohmann::json sp = shared_mlp_params(c);
    m->shared = make_mlp_ffn(ModuleArgs{a.cfg, sp, a.src, a.prefix + c.shared_prefix, a.layer, a.tp, a.label});
    m->shared_gate = std::move(w.shared_gate);
  }
  return m;
}

}  // namespace ssmserve
