// Owns the dense MLP FFN on the CPU (see mlp_ffn.h).
#include "model/ffns/mlp_ffn.h"

#include <cmath>

#include "config/hf_json.h"
#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/linear.h"
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
      return;
    }
    cpu::linear(u, T, down_proj, bias, out);
  }
};

}  // namespace

std::unique_ptr<CpuModule> make_mlp_ffn(const ModuleArgs& a) {
  const nlohmann::json& j = a.params;
  auto m = std::make_unique<MlpFfn>();
  const std::string act = param_string(j, "hidden_act", "silu");
  SSM_CHECK(act == "silu" || act == "relu2", "config.json: hidden_act \"{}\" is not supported for the MLP (silu, relu2)",
            text_excerpt(act));
  m->gated = act == "silu";
  m->hidden = a.cfg.hidden_size;
  m->intermediate = param_int(j, "intermediate_size", -1);
  m->tp = a.tp;
  const bool bias = param_bool(j, "mlp_bias", false);
  const int64_t Hd = m->hidden, I = m->intermediate;
  const dist::Range i = dist::even_shard(I, a.tp.rank, a.tp.world, a.label + " MLP intermediate_size");
  const dist::Range o = dist::output_shard(Hd, a.tp.rank, a.tp.world);
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), i_scale = 1.0f / std::sqrt(static_cast<float>(I));
  const std::string& p = a.prefix;
  m->up_proj = dist::slice_rows(a.src.matrix(p + "up_proj.weight", {I, Hd}, DummyInit::uniform(in_scale)), {i});
  if (bias) m->up_bias = dist::slice_rows(a.src.vector(p + "up_proj.bias", {I}, DummyInit::constant(0.0f)), 1, {i});
  if (m->gated) {
    m->gate_proj = dist::slice_rows(a.src.matrix(p + "gate_proj.weight", {I, Hd}, DummyInit::uniform(in_scale)), {i});
    if (bias) m->gate_bias = dist::slice_rows(a.src.vector(p + "gate_proj.bias", {I}, DummyInit::constant(0.0f)), 1, {i});
    cpu::pack_for_linear(m->gate_proj);
  }
  m->down_proj = dist::slice_rows(a.src.matrix(p + "down_proj.weight", {Hd, I}, DummyInit::uniform(i_scale)), {o});
  if (bias) m->down_bias = dist::slice_rows(a.src.vector(p + "down_proj.bias", {Hd}, DummyInit::constant(0.0f)), 1, {o});
  cpu::pack_for_linear(m->up_proj);
  cpu::pack_for_linear(m->down_proj);
  return m;
}

}  // namespace ssmserve
