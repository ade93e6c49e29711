// Owns the Mamba-1 forward pass over a packed batch (decode rows through the one-token state update, prefill
// rows through the varlen conv + selective scan) and its weight loading.
#include "model/archs/mamba.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "core/error.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/selective_scan.h"
#include "dist/shard.h"
#include "dist/gathered_linear.h"
#include "dist/vocab_parallel.h"
#include "model/lm_common.h"
#include "model/parallel_layers.h"

namespace ssmserve {

MambaWeights MambaWeights::load(const ModelConfig& cfg, WeightSource& src, const dist::TpRank& tp) {
  const MambaConfig& m = *cfg.mamba;
  const int64_t H = cfg.hidden_size, I = m.d_inner, N = m.d_state, K = m.d_conv, R = m.dt_rank, V = cfg.vocab_size;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(H)), inner_scale = 1.0f / std::sqrt(static_cast<float>(I));
  // This rank's channels c and vocab rows v (everything at tp.world == 1, where every slice is the whole tensor).
  const dist::Range c = dist::even_shard(I, tp.rank, tp.world, "Mamba-1 d_inner (intermediate_size)");
  const dist::Range v = dist::vocab_shard(V, tp.rank, tp.world);
  const std::vector<dist::Range> xz_rows = {c, {I + c.begin, I + c.end}};  // in_proj: x rows then z rows
  MambaWeights w;
  w.embedding = dist::slice_rows(src.matrix("backbone.embeddings.weight", {V, H}, DummyInit::uniform(0.1f)), {v});
  // Layers in parallel (model/parallel_layers.h: values do not depend on the order; the lowest failing layer's
  // error is rethrown).
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for_each_layer_parallel(cfg.num_hidden_layers, [&](int64_t l) {
    const std::string p = fmt::format("backbone.layers.{}.", l);
    MambaLayerWeights L;
    L.norm = src.vector(p + "norm.weight", {H}, DummyInit::constant(1.0f));
    L.in_proj = dist::slice_rows(src.matrix(p + "mixer.in_proj.weight", {2 * I, H}, DummyInit::uniform(in_scale)), xz_rows);
    if (m.use_bias) L.in_proj_bias = dist::slice_rows(src.vector(p + "mixer.in_proj.bias", {2 * I}, DummyInit::constant(0.0f)), 1, xz_rows);
    L.conv_weight = dist::slice_rows(src.vector(p + "mixer.conv1d.weight", {I, 1, K}, DummyInit::uniform(0.5f)), K, {c});
    if (m.use_conv_bias) L.conv_bias = dist::slice_rows(src.vector(p + "mixer.conv1d.bias", {I}, DummyInit::uniform(0.1f)), 1, {c});
    L.x_proj = src.matrix(p + "mixer.x_proj.weight", {R + 2 * N, I}, DummyInit::uniform(inner_scale));  // replicated
    L.dt_proj = dist::slice_rows(src.matrix(p + "mixer.dt_proj.weight", {I, R}, DummyInit::uniform(1.0f / std::sqrt(static_cast<float>(R)))), {c});
    L.dt_bias = dist::slice_rows(src.vector(p + "mixer.dt_proj.bias", {I}, DummyInit::constant(-4.0f)), 1, {c});
    L.A = dist::slice_rows(src.vector(p + "mixer.A_log", {I, N}, DummyInit::log_arange()), N, {c});
    for (float& a : L.A) a = -std::exp(a);
    L.D = dist::slice_rows(src.vector(p + "mixer.D", {I}, DummyInit::constant(1.0f)), 1, {c});
    // Output-split (dist/gathered_linear.h): this rank's output rows over the whole d_inner, with their bias.
    const dist::Range o = dist::output_shard(H, tp.rank, tp.world);
    L.out_proj = dist::slice_rows(src.matrix(p + "mixer.out_proj.weight", {H, I}, DummyInit::uniform(inner_scale)), {o});
    if (m.use_bias) L.out_proj_bias = dist::slice_rows(src.vector(p + "mixer.out_proj.bias", {H}, DummyInit::constant(0.0f)), 1, {o});
    for (Weight* proj : {&L.in_proj, &L.x_proj, &L.dt_proj, &L.out_proj}) cpu::pack_for_linear(*proj);
    w.layers[static_cast<size_t>(l)] = std::move(L);
  });
  w.norm_f = src.vector("backbone.norm_f.weight", {H}, DummyInit::constant(1.0f));
  if (cfg.tie_word_embeddings && !src.has("lm_head.weight")) w.lm_head = w.embedding;
  else w.lm_head = dist::slice_rows(src.matrix("lm_head.weight", {V, H}, DummyInit::uniform(0.1f)), {v});
  return w;
}

namespace {

/// The Mamba-1 model: weights plus per-forward scratch (one forward at a time).
class MambaModel final : public CausalLM {
 public:
  MambaModel(ModelConfig cfg, MambaWeights w, std::shared_ptr<const Checkpoint> ckpt, const dist::TpRank& tp)
      : cfg_(std::move(cfg)), m_(*cfg_.mamba), w_(std::move(w)), ckpt_(std::move(ckpt)), tp_(tp) {
    m_.d_inner /= tp.world;  // this rank's channels (load() checked the division)
  }

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return cfg_.num_hidden_layers; }
  StateShape state_shape() const override {
    return {static_cast<int64_t>(m_.d_conv - 1) * m_.d_inner, static_cast<int64_t>(m_.d_inner) * m_.d_state};
  }

  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;

 private:
  void mixer(int layer, const ForwardBatch& batch, StateCache& cache, int64_t T);

  ModelConfig cfg_;
  MambaConfig m_;  // d_inner is this rank's share
  MambaWeights w_;
  std::shared_ptr<const Checkpoint> ckpt_;  // keeps mapped weights alive
  dist::TpRank tp_;                         // world 1: no communication
  // Scratch, resized per forward. Shapes for T packed tokens:
  std::vector<float> hidden_;   // [T, H] residual stream (fp32)
  std::vector<float> normed_;   // [T, H]
  std::vector<float> xz_;       // [T, 2I]
  std::vector<float> xc_;       // [T, I] conv output x'
  std::vector<float> xdbl_;     // [T, R + 2N]
  std::vector<float> delta_;    // [T, I]
  std::vector<float> y_;        // [T, I]
  std::vector<float> out_;      // [T, H]
  std::vector<float> full_;     // [T, I * tp] all-gathered conv / scan output (tp > 1)
  std::vector<float> comm_;     // collective scratch
};

void MambaModel::forward(const ForwardBatch& batch, StateCache& cache, float* logits) {
  check_batch_against_cache(batch, cache, num_state_layers(), "Mamba");
  const int64_t T = batch.num_tokens(), H = cfg_.hidden_size;
  // 1. Embedding lookup. 2. Residual blocks: hidden += mixer(rms_norm(hidden)). 3. Final norm + LM head.
  hidden_.resize(T * H);
  if (tp_.world > 1) dist::embed_tokens_vocab_parallel(batch, w_.embedding, cfg_.vocab_size, *tp_.comm, hidden_.data());
  else embed_tokens(batch, w_.embedding, hidden_.data());
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) mixer(l, batch, cache, T);
  const float eps = cfg_.layer_norm_epsilon;
  if (tp_.world > 1)
    dist::final_norm_and_lm_head_vocab_parallel(batch, hidden_.data(), H, w_.norm_f.data(), eps, w_.lm_head, cfg_.vocab_size, *tp_.comm, logits);
  else final_norm_and_lm_head(batch, hidden_.data(), H, w_.norm_f.data(), eps, w_.lm_head, logits);
}

void MambaModel::mixer(int layer, const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const MambaLayerWeights& L = w_.layers[layer];
  const int64_t H = cfg_.hidden_size, I = m_.d_inner, N = m_.d_state, R = m_.dt_rank;
  const int64_t XD = R + 2 * N;
  const MambaBatchMetadata& md = batch.meta;
  const int64_t nd = md.num_decode_rows(), P0 = batch.prefill_token_offset();  // decode rows; prefill row offset
  const bool has_prefill = md.num_prefills > 0;
  normed_.resize(T * H), xz_.resize(T * 2 * I), xc_.resize(T * I), xdbl_.resize(T * XD), delta_.resize(T * I);
  y_.resize(T * I), out_.resize(T * H);
  // 1. Pre-norm and input projection: xz = in_proj(norm(h)), x = xz[:, :I], z = xz[:, I:].
  cpu::rms_norm(hidden_.data(), L.norm.data(), cfg_.layer_norm_epsilon, T, H, normed_.data());
  cpu::linear(normed_.data(), T, L.in_proj, L.in_proj_bias.empty() ? nullptr : L.in_proj_bias.data(), xz_.data());
  // 2. Causal conv1d + SiLU: decode rows [0, nd) update their window, prefill rows scan theirs.
  cpu::ConvParams conv{I, m_.d_conv, L.conv_weight.data(), L.conv_bias.empty() ? nullptr : L.conv_bias.data(),
                       cache.conv_state(layer), true};
  if (nd > 0) cpu::causal_conv1d_update(xz_.data(), 2 * I, xc_.data(), I, conv, md.state_indices_tensor_d);
  if (has_prefill)
    cpu::causal_conv1d_fwd(xz_.data() + P0 * 2 * I, 2 * I, xc_.data() + P0 * I, I, conv, md.query_start_loc_p,
                           md.state_indices_tensor_p, md.has_initial_states_p);
  // 3. x_proj -> [dt_low, B, C]; delta = dt_proj(dt_low) (bias and softplus inside the scan).
  const int64_t IF = I * tp_.world;  // the whole d_inner
  if (tp_.world > 1) {  // x_proj over the all-gathered conv output: TP = 1's arithmetic (dist/gathered_linear.h)
    full_.resize(T * IF);
    dist::all_gather_columns(xc_.data(), T, I, I, *tp_.comm, full_.data(), IF, comm_);
    cpu::linear(full_.data(), T, L.x_proj, nullptr, xdbl_.data());
  } else {
    cpu::linear(xc_.data(), T, L.x_proj, nullptr, xdbl_.data());
  }
  cpu::linear(xdbl_.data(), T, XD, L.dt_proj, nullptr, delta_.data(), I);
  // 4. Selective scan with D skip and SiLU(z) gate.
  cpu::ScanInputs in{{xc_.data(), I}, {delta_.data(), I}, {xdbl_.data() + R, XD}, {xdbl_.data() + R + N, XD}, {xz_.data() + I, 2 * I}};
  cpu::ScanParams sp{I, static_cast<int>(N), L.A.data(), L.D.data(), L.dt_bias.data(), true, cache.ssm_state(layer)};
  if (nd > 0) cpu::selective_state_update(in, sp, y_.data(), I, md.state_indices_tensor_d);
  if (has_prefill) {  // the same views shifted to the first prefill row; query_start_loc_p starts at 0 there
    cpu::ScanInputs inp{{in.u.data + P0 * I, I}, {in.delta.data + P0 * I, I}, {in.B.data + P0 * XD, XD},
                        {in.C.data + P0 * XD, XD}, {in.z.data + P0 * 2 * I, 2 * I}};
    cpu::selective_scan_fwd(inp, sp, y_.data() + P0 * I, I, md.query_start_loc_p, md.state_indices_tensor_p,
                            md.has_initial_states_p);
  }
  // 5. Output projection and residual add (fp32).
  const float* out_bias = L.out_proj_bias.empty() ? nullptr : L.out_proj_bias.data();
  if (tp_.world > 1) {  // output-split out_proj over the all-gathered scan output
    dist::all_gather_columns(y_.data(), T, I, I, *tp_.comm, full_.data(), IF, comm_);
    dist::output_split_linear(full_.data(), T, IF, L.out_proj, out_bias, H, *tp_.comm, out_.data(), H, comm_);
  } else {
    cpu::linear(y_.data(), T, L.out_proj, out_bias, out_.data());
  }
  for (int64_t i = 0; i < T * H; ++i) hidden_[i] += out_[i];
}

}  // namespace

std::unique_ptr<CausalLM> load_mamba(const ModelConfig& cfg, LoadFormat format, const dist::TpRank& tp) {
  SSM_CHECK(cfg.mamba.has_value(), "{}: not a Mamba config", (cfg.dir / "config.json").string());
  SSM_CHECK(cfg.mamba->d_state <= 256, "config.json: state_size {} > 256 is not supported", cfg.mamba->d_state);
  SSM_CHECK(cfg.mamba->d_conv >= 1 && cfg.mamba->d_conv <= cpu::kMaxConvWidth, "config.json: conv_kernel {} must be in [1, {}]", cfg.mamba->d_conv, cpu::kMaxConvWidth);
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::dummy();
  if (format != LoadFormat::Dummy) {
    ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(cfg.dir));
    src = WeightSource::from_checkpoint(ckpt);
  }
  SSM_CHECK(tp.world == 1 || tp.comm, "load_mamba: tensor-parallel size {} needs a communicator", tp.world);
  MambaWeights w = MambaWeights::load(cfg, src, tp);
  if (tp.rank == 0) src.warn_unused_tensors();
  return std::make_unique<MambaModel>(cfg, std::move(w), std::move(ckpt), tp);
}

}  // namespace ssmserve
