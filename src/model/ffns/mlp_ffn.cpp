// Owns the dense MLP FFN on the CPU (see mlp_ffn.h).
#include "model/ffns/mlp_ffn.h"

#include <cmath>

#include "config/hf_json.h"
#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/linear.h"
#include "model/weight.h"
#include "model/decoder/params.h"

namespace ssmserve {
namespace {

class MlpFfn final : public CpuModule {
 public:
  bool gated = true;  // silu-gated, else relu^2
  int64_t hidden = 0, intermediate = 0;  // the whole I
  Weight gate_proj, up_proj, down_proj;  ///< [I / tp, hidden] x2, [output rows, I]
  std::vector<float> gate_bias, up_bias, down_bias;
  dist::TpRank tp;

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    Scratch& s = step.scratch;
    const int64_t I = up_proj.rows;
    float* u = s.f32(0, T * I);
    cpu::linear(x, T, up_proj, up_bias.empty() ? nullptr : up_bias.data(), u);
    if (gated) {
      float* g = s.f32(1, T * I);
      cpu::linear(x, T, gate_proj, gate_bias.empty() ? nullptr : gate_bias.data(), g);
      for (int64_t i = 0; i < T * I; ++i) u[i] = cpu::silu(g[i]) * u[i];
    } else {
      for (int64_t i = 0; i < T * I; ++i) u[i] = u[i] > 0.0f ? u[i] * u[i] : 0.0f;
    }
    const float* bias = down_bias.empty() ? nullptr : down_bias.data();
    if (tp.world > 1) {  // down split by output rows over the all-gathered activations (dist/gathered_linear.h)
      float* full = s.f32(2, T * intermediate);
      dist::all_gather_columns(u, T, I, I, *tp.comm, full, intermediate, s.vec(3));
      dist::output_split_linear(full, T, intermediate, down_proj, bias, hidden, *tp.comm, out, hidden, s.vec(3));
    } else {
      cpu::linear(u, T, down_proj, bias, out);
    }
  }
};

}  // namespace

MlpConfig MlpConfig::from_json(const nlohmann::json& j) {
  MlpConfig c;
  const std::string act = param_string(j, "hidden_act", "silu");
  SSM_CHECK(act == "silu" || act == "relu2", "config.json: hidden_act \"{}\" is not supported for the MLP (silu, relu2)",
            text_excerpt(act));
  c.gated = act == "silu";
  c.intermediate_size = param_int(j, "intermediate_size", -1);
  c.bias = param_bool(j, "mlp_bias", false);
  c.layout = param_string(j, "mlp_layout", "gate_up_proj");
  SSM_CHECK(c.layout == "gate_up_proj" || c.layout == "input_linear",
            "decoder: mlp_layout \"{}\" is not known (gate_up_proj, input_linear)", text_excerpt(c.layout));
  SSM_CHECK(c.layout == "gate_up_proj" || (c.gated && !c.bias), "decoder: the input_linear MLP layout is SiLU-gated without bias");
  c.gate_multiplier = param_float(j, {"mlp_gate_multiplier"}, 1.0f);
  c.down_multiplier = param_float(j, {"mlp_down_multiplier"}, 1.0f);
  SSM_CHECK(!c.bias || (c.gate_multiplier == 1.0f && c.down_multiplier == 1.0f), "config.json: mlp_multipliers with mlp_bias are not supported");
  return c;
}

MlpWeights read_mlp_weights(WeightSource& src, const std::string& p, int64_t Hd, const MlpConfig& c) {
  const int64_t I = c.intermediate_size;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), i_scale = 1.0f / std::sqrt(static_cast<float>(I));
  MlpWeights w;
  if (c.layout == "input_linear") {  // Granite: input_linear [2I, hidden] = [gate; up], output_linear [hidden, I]
    const Weight in = src.matrix(p + "input_linear.weight", {2 * I, Hd}, DummyInit::uniform(in_scale));
    w.gate_proj = dist::slice_rows(in, {dist::Range{0, I}});
    w.up_proj = dist::slice_rows(in, {dist::Range{I, 2 * I}});
    w.down_proj = src.matrix(p + "output_linear.weight", {Hd, I}, DummyInit::uniform(i_scale));
    return w;
  }
  const float gm = c.gate_multiplier, dm = c.down_multiplier;
  w.up_proj = src.matrix(p + "up_proj.weight", {I, Hd}, DummyInit::uniform(in_scale));
  if (c.bias) w.up_bias = src.vector(p + "up_proj.bias", {I}, DummyInit::constant(0.0f));
  if (c.gated) {
    w.gate_proj = scale_rows(src.matrix(p + "gate_proj.weight", {I, Hd}, DummyInit::uniform(in_scale)), [&](int64_t) { return gm; });
    if (c.bias) w.gate_bias = src.vector(p + "gate_proj.bias", {I}, DummyInit::constant(0.0f));
  }
  w.down_proj = scale_rows(src.matrix(p + "down_proj.weight", {Hd, I}, DummyInit::uniform(i_scale)), [&](int64_t) { return dm; });
  if (c.bias) w.down_bias = src.vector(p + "down_proj.bias", {Hd}, DummyInit::constant(0.0f));
  return w;
}

std::unique_ptr<CpuModule> make_mlp_ffn(const ModuleArgs& a) {
  const MlpConfig c = MlpConfig::from_json(a.params);
  auto m = std::make_unique<MlpFfn>();
  m->gated = c.gated;
  m->hidden = a.cfg.hidden_size;
  m->intermediate = c.intermediate_size;
  m->tp = a.tp;
  const int64_t Hd = m->hidden, I = m->intermediate;
  const dist::Range i = dist::even_shard(I, a.tp.rank, a.tp.world, a.label + " MLP intermediate_size");
  const dist::Range o = dist::output_shard(Hd, a.tp.rank, a.tp.world);
  MlpWeights w = read_mlp_weights(a.src, a.prefix, Hd, c);
  m->up_proj = dist::slice_rows(w.up_proj, {i});
  if (!w.up_bias.empty()) m->up_bias = dist::slice_rows(w.up_bias, 1, {i});
  if (m->gated) {
    m->gate_proj = dist::slice_rows(w.gate_proj, {i});
    if (!w.gate_bias.empty()) m->gate_bias = dist::slice_rows(w.gate_bias, 1, {i});
    cpu::pack_for_linear(m->gate_proj);
  }
  m->down_proj = dist::slice_rows(w.down_proj, {o});
  if (!w.down_bias.empty()) m->down_bias = dist::slice_rows(w.down_bias, 1, {o});
  cpu::pack_for_linear(m->up_proj);
  cpu::pack_for_linear(m->down_proj);
  for (Weight* x : {&m->gate_proj, &m->up_proj, &m->down_proj}) x->round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  return m;
}

}  // namespace ssmserve
