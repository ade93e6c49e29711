// Owns the lightning-attention mixer on the CPU: weights (with the rank's heads) and the forward over a packed batch
// (decode rows through the one-token state update, prefill rows through the blocked prefill on their state blocks).
#include "model/mixers/lightning_mixer.h"

#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/lightning.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "model/decoder/params.h"
#include "model/mixers/prefill_segments.h"

namespace ssmserve {

std::vector<float> lightning_slopes(int num_heads, int layer, int num_layers) {
  const double base = 1.0 / std::pow(2.0, 8.0 / num_heads);
  const double factor = 1.0 - layer / (num_layers - 1 + 1e-5) + 1e-5;
  std::vector<float> s(static_cast<size_t>(num_heads));
  for (int h = 0; h < num_heads; ++h) s[h] = static_cast<float>(static_cast<float>(std::pow(base, h + 1)) * factor);
  return s;
}

namespace {

class LightningMixer final : public CpuModule {
 public:
  int num_heads = 0, heads = 0, head_dim = 0, block_size = 256;  // all heads, this rank's heads
  int64_t hidden = 0;
  Weight qkv_proj;            ///< [3 h D, hidden] (this rank's heads)
  Weight output_gate;         ///< [h D, hidden]
  Weight out_proj;            ///< [output rows, H D]
  std::vector<float> norm;    ///< [H D] (all heads)
  std::vector<float> slopes;  ///< [h]
  dist::TpRank tp;

  ModuleStateSpec state_spec() const override {
    ModuleStateSpec s;
    s.ssm_elems = static_cast<int64_t>(heads) * head_dim * head_dim;
    s.full_state_elems = static_cast<int64_t>(num_heads) * head_dim * head_dim;
    return s;
  }

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    const LinearAttentionMetadata& md = step.batch.linear_meta;
    const int64_t HD = static_cast<int64_t>(heads) * head_dim, W = 3 * HD;
    Scratch& s = step.scratch;
    float* proj = s.f32(0, T * W);
    float* o = s.f32(1, T * HD);
    float* gate = s.f32(2, T * HD);
    // 1. qkv = SiLU(qkv_proj x): [T, H, 3D].
    cpu::linear(x, T, qkv_proj, nullptr, proj);
    for (int64_t i = 0; i < T * W; ++i) proj[i] = cpu::silu(proj[i]);
    // 2. Lightning attention on this layer's state in each block.
    cpu::LightningParams p;
    p.num_heads = heads, p.head_dim = head_dim, p.block_size = block_size, p.slopes = slopes.data();
    p.states = step.state.ssm;
    const int nd = md.num_decodes;
    if (nd > 0) cpu::lightning_decode(proj, W, o, HD, p, step.batch.meta.decode_rows());
    const MambaBatchMetadata& mm = step.batch.meta;  // the same prefill rows, in the same order
    if (md.num_prefills > 0 && !mm.has_state_stores())
      cpu::lightning_prefill(proj, W, o, HD, p, std::span(md.query_start_loc).subspan(nd), std::span(md.num_computed_tokens).subspan(nd),
                             std::span(md.state_indices_tensor).subspan(nd));
    if (md.num_prefills > 0 && mm.has_state_stores()) {  // "all" mode: the block state at each boundary is stored
      const int32_t P0 = md.query_start_loc[nd];
      const int64_t elems = state_spec().ssm_elems;
      run_prefill_pieces(split_prefill_rows(mm), step.state.ssm, elems, s.vec(kPieceStateScratchSlot),
                         [&](const PrefillSegment& g, const StateView& v) {
                           const int32_t qsl[2] = {P0 + g.begin, P0 + g.end};
                           cpu::LightningParams pl = p;
                           pl.states = v;
                           cpu::lightning_prefill(proj, W, o, HD, pl, qsl, std::span(&g.num_computed, 1), std::span(&g.state_block, 1));
                         });
    }
    // 3. RMSNorm over all heads, sigmoid gate from x, out_proj.
    cpu::linear(x, T, output_gate, nullptr, gate);
    if (tp.world > 1) {
      // TP = 1's arithmetic (dist/gathered_linear.h): gather every head's output and gate, norm over all heads
      // (weight replicated), gate, then out_proj split by output rows.
      const int64_t HF = static_cast<int64_t>(num_heads) * head_dim;
      float* of = s.f32(3, T * HF);
      float* gf = s.f32(4, T * HF);
      dist::all_gather_columns(o, T, HD, HD, *tp.comm, of, HF, s.vec(5));
      dist::all_gather_columns(gate, T, HD, HD, *tp.comm, gf, HF, s.vec(5));
      cpu::rms_norm(of, norm.data(), 1e-6f, T, HF, of);
      for (int64_t i = 0; i < T * HF; ++i) of[i] *= 1.0f / (1.0f + std::exp(-gf[i]));
      dist::output_split_linear(of, T, HF, out_proj, nullptr, hidden, *tp.comm, out, hidden, s.vec(5));
      return;
    }
    cpu::rms_norm(o, norm.data(), 1e-6f, T, HD, o);
    for (int64_t i = 0; i < T * HD; ++i) o[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
    cpu::linear(o, T, out_proj, nullptr, out);
  }
};

}  // namespace

LightningConfig LightningConfig::from_json(const nlohmann::json& j, const ModelConfig& cfg) {
  LightningConfig c;
  c.num_heads = param_int(j, "num_attention_heads", -1);
  c.head_dim = param_int(j, "head_dim", cfg.hidden_size % c.num_heads == 0 ? cfg.hidden_size / c.num_heads : -1);
  c.block_size = param_int(j, "block_size", 256);
  SSM_CHECK(c.num_heads <= 4096 && c.head_dim <= 1024, "config.json: num_attention_heads must be <= 4096 and head_dim <= 1024 "
            "(got {} and {})", c.num_heads, c.head_dim);
  SSM_CHECK(c.block_size <= 4096, "config.json: block_size must be <= 4096 (got {})", c.block_size);
  return c;
}

LightningWeights read_lightning_weights(WeightSource& src, const std::string& p, int64_t Hd, const LightningConfig& c) {
  const int64_t HD = int64_t{c.num_heads} * c.head_dim;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), hd_scale = 1.0f / std::sqrt(static_cast<float>(HD));
  LightningWeights w;
  w.qkv_proj = src.matrix(p + "qkv_proj.weight", {3 * HD, Hd}, DummyInit::uniform(in_scale));
  w.output_gate = src.matrix(p + "output_gate.weight", {HD, Hd}, DummyInit::uniform(in_scale));
  w.out_proj = src.matrix(p + "out_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale));
  w.norm = src.vector(p + "norm.weight", {HD}, DummyInit::constant(1.0f));
  // transformers 5.x may save its decay buffers, rounded to bf16: known and recomputed from the config in fp32, so
  // they do not count as unused tensors.
  for (const char* buf : {"slope_rate", "query_decay", "key_decay", "diagonal_decay"}) (void)src.has(p + buf);
  return w;
}

std::unique_ptr<CpuModule> make_lightning_mixer(const ModuleArgs& a) {
  const LightningConfig c = LightningConfig::from_json(a.params, a.cfg);
  auto m = std::make_unique<LightningMixer>();
  m->hidden = a.cfg.hidden_size;
  m->num_heads = c.num_heads, m->head_dim = c.head_dim, m->block_size = c.block_size;
  m->tp = a.tp;
  const dist::Range h = dist::even_shard(m->num_heads, a.tp.rank, a.tp.world, a.label + " num_attention_heads");
  m->heads = static_cast<int>(h.size());
  const int64_t Hd = a.cfg.hidden_size, D = m->head_dim;
  const dist::Range hd{h.begin * D, h.end * D}, o = dist::output_shard(Hd, a.tp.rank, a.tp.world);
  LightningWeights w = read_lightning_weights(a.src, a.prefix, Hd, c);
  // qkv_proj rows are [H, 3D] (q | k | v per head): a rank's heads are one contiguous row range.
  m->qkv_proj = dist::slice_rows(w.qkv_proj, {{3 * hd.begin, 3 * hd.end}});
  m->output_gate = dist::slice_rows(w.output_gate, {hd});
  m->out_proj = dist::slice_rows(w.out_proj, {o});
  m->norm = std::move(w.norm);
  m->slopes = dist::slice_rows(lightning_slopes(m->num_heads, a.layer, a.cfg.num_hidden_layers), 1, {h});
  for (Weight* x : {&m->qkv_proj, &m->output_gate, &m->out_proj}) {
    cpu::pack_for_linear(*x);
    x->round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  }
  return m;
}

}  // namespace ssmserve
