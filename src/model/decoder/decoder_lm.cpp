// Owns DecoderLM: the CPU forward pass of any DecoderSpec over a packed batch, its weight loading and the placement
// of its modules' states in the block pool (see decoder_lm.h).
#include "model/decoder/decoder_lm.h"
#include "model/decoder/param_estimate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"
#include "dist/shard.h"
#include "model/vocab_parallel.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "model/decoder/decoder_shape.h"
#include "model/decoder/module.h"
#include "model/lm_common.h"
#include "model/parallel_layers.h"

namespace ssmserve {
namespace {

/// One sublayer as loaded.
struct Sublayer {
  SublayerSpec spec;
  std::vector<float> norm;  ///< [hidden]
  std::unique_ptr<CpuModule> module;
};

class DecoderLM final : public DecoderShape<CausalLM> {
 public:
  DecoderLM(ModelConfig cfg, DecoderSpec spec, Weight emb, Weight head, std::vector<float> norm_f, std::vector<Sublayer> subs,
            std::shared_ptr<const Checkpoint> ckpt, const dist::TpRank& tp)
      : DecoderShape(std::move(cfg), std::move(spec)), embedding_(std::move(emb)), lm_head_(std::move(head)),
        norm_f_(std::move(norm_f)), subs_(std::move(subs)), ckpt_(std::move(ckpt)), tp_(tp) {
    std::vector<ModuleStateSpec> specs;
    std::vector<std::string> kinds;
    for (const Sublayer& s : subs_) specs.push_back(s.module->state_spec()), kinds.push_back(s.spec.kind);
    set_layout(specs, kinds, tp_.world);
    find_stack_decode();
  }

  /// Every CPU mixer stores "all"-mode states inside its prefill rows (model/mixers/prefill_segments.h).
  bool stores_prefill_states() const override { return true; }
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;

 private:
  void find_stack_decode();

  Weight embedding_, lm_head_;
  std::vector<float> norm_f_;
  std::vector<Sublayer> subs_;  // [layers x (mixer, ffn)] in order, absent sublayers left out
  std::shared_ptr<const Checkpoint> ckpt_;  // keeps mapped weights alive
  dist::TpRank tp_;                         // world 1: no communication
  StackDecodeFn stack_decode_ = nullptr;
  std::vector<CpuModule*> stack_mods_;     // its arguments: every sublayer's module and pre-norm weight
  std::vector<const float*> stack_norms_;
  // Per-forward buffers for T packed tokens (one forward at a time):
  std::vector<float> hidden_, normed_, out_;  // [T, hidden] residual stream (fp32), sublayer input, module output
  std::vector<ModuleState> states_;           // per sublayer
  Scratch scratch_;
};

void DecoderLM::find_stack_decode() {
  if (subs_.empty()) return;
  const std::string& kind = subs_[0].spec.kind;
  for (const Sublayer& s : subs_)
    if (s.spec.kind != kind || !s.spec.plain_residual()) return;
  if (static_cast<int>(subs_.size()) != static_cast<int>(spec_.layers.size())) return;  // an FFN somewhere
  stack_decode_ = cpu_module_type(kind).stack_decode;
  for (const Sublayer& s : subs_) stack_mods_.push_back(s.module.get()), stack_norms_.push_back(s.norm.data());
}

void DecoderLM::forward(const ForwardBatch& batch, StateCache& cache, float* logits) {
  check_batch_against_cache(batch, cache, num_state_layers(), spec_.label);
  check_metadata(batch, cache);
  const int64_t T = batch.num_tokens(), H = cfg_.hidden_size;
  const float eps = spec_.norm_eps;
  hidden_.resize(T * H), normed_.resize(T * H), out_.resize(T * H);
  // 1. Embedding lookup (times the embedding multiplier).
  if (tp_.world > 1) dist::embed_tokens_vocab_parallel(batch, embedding_, cfg_.vocab_size, *tp_.comm, hidden_.data());
  else embed_tokens(batch, embedding_, hidden_.data());
  if (spec_.embedding_multiplier != 1.0f)
    for (float& h : hidden_) h *= spec_.embedding_multiplier;
  // 2. Sublayers: h <- alpha r + beta module(norm(h)), r = h or norm(h).
  states_.clear();
  for (size_t i = 0; i < subs_.size(); ++i)
    states_.push_back(layout_.views(i, cache.num_blocks(), [&](int l) { return cache.conv_state(l); },
                                    [&](int l) { return cache.ssm_state(l); }));
  bool done = false;
  if (stack_decode_) done = stack_decode_(stack_mods_, stack_norms_, eps, batch, states_, hidden_.data(), T, H, scratch_);
  for (size_t i = 0; i < subs_.size() && !done; ++i) {
    const Sublayer& s = subs_[i];
    // A parallel mixer reads the normed input of the mixer before it (computed before that mixer's residual add).
    if (!s.spec.parallel) cpu::rms_norm(hidden_.data(), s.norm.data(), eps, T, H, normed_.data());
    s.module->forward(normed_.data(), T, out_.data(), ModuleStep{batch, states_[i], scratch_});
    if (s.spec.plain_residual()) {
      for (int64_t j = 0; j < T * H; ++j) hidden_[j] += out_[j];
    } else {
      const float a = s.spec.alpha, b = s.spec.beta;
      const float* r = s.spec.residual_is_normed ? normed_.data() : hidden_.data();
      for (int64_t j = 0; j < T * H; ++j) hidden_[j] = r[j] * a + out_[j] * b;
    }
  }
  // 3. Final norm + LM head on the requested rows (divided by logits_scaling).
  if (tp_.world > 1)
    dist::final_norm_and_lm_head_vocab_parallel(batch, hidden_.data(), H, norm_f_.data(), eps, lm_head_, cfg_.vocab_size, *tp_.comm,
                                                logits);
  else final_norm_and_lm_head(batch, hidden_.data(), H, norm_f_.data(), eps, lm_head_, logits);
  if (logits && spec_.logits_scaling != 1.0f) {
    const int64_t n = static_cast<int64_t>(batch.logits_indices.size()) * cfg_.vocab_size;
    for (int64_t j = 0; j < n; ++j) logits[j] /= spec_.logits_scaling;
  }
}

void check_dummy_fits(const ModelConfig& cfg, const DecoderSpec& spec) {
  // The architectures without their own estimate get one from their modules: 4 bytes per parameter, the bf16
  // matrices plus the GEMM's repacked panels (cpu::pack_for_linear keeps both; measured 3.2-4 bytes per parameter).
  const double bytes = spec.dummy_bytes > 0 ? spec.dummy_bytes : 4 * estimate_param_count(cfg, spec);
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const double ram = pages > 0 && page > 0 ? static_cast<double>(pages) * page : 0.0;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  SSM_CHECK(ram == 0 || bytes <= 0.8 * ram,
            "{}: dummy {} weights need {:.1f} GiB (bf16 and the GEMM panels), more than 80% of the {:.1f} GiB of physical RAM",
            (cfg.dir / "config.json").string(), spec.label, bytes / kGiB, ram / kGiB);
}

}  // namespace

std::unique_ptr<CausalLM> load_decoder(const ModelConfig& cfg, const DecoderSpec& spec, LoadFormat format, const dist::TpRank& tp) {
  SSM_CHECK(tp.world == 1 || tp.comm, "{}: tensor-parallel size {} needs a communicator", spec.label, tp.world);
  check_spec(cfg, spec, [](const std::string& kind) { (void)cpu_module_type(kind); });
  if (format == LoadFormat::Dummy) check_dummy_fits(cfg, spec);
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::open(cfg, format == LoadFormat::Dummy, &ckpt);
  return load_decoder_from(cfg, spec, src, std::move(ckpt), tp);
}

std::unique_ptr<CausalLM> load_decoder_from(const ModelConfig& cfg, const DecoderSpec& spec, WeightSource& src,
                                            std::shared_ptr<const Checkpoint> ckpt, const dist::TpRank& tp) {
  check_spec(cfg, spec, [](const std::string& kind) { (void)cpu_module_type(kind); });
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  const dist::Range v = dist::vocab_shard(V, tp.rank, tp.world);
  Weight emb = dist::slice_rows(src.matrix(spec.embedding, {V, H}, DummyInit::uniform(0.1f)), {v});
  // The LM head streams from memory at every decode step: the packed panels read faster than the row-major kernel
  // at batch 1 (same bits: every element one FMA chain over k, kernels/cpu/linear.h). A tied head and the embedding
  // share one copy, the panels (the lookup reads its rows from them); an untied head keeps only its panels. Packed
  // before the layers load, so the moment both layouts exist comes before the model's peak.
  Weight head;
  if (spec.tie_word_embeddings && !src.has(spec.lm_head)) {
    cpu::pack_for_linear_only(emb);
    head = emb;
  } else {
    head = dist::slice_rows(src.matrix(spec.lm_head, {V, H}, DummyInit::uniform(0.1f)), {v});
    cpu::pack_for_linear_only(head);
  }
  head.round_input_bf16 = cfg.round_gemm_inputs_bf16;  // the GPU's LM head reads bf16 rows with bf16 weights
  // Layers in parallel (model/parallel_layers.h: values do not depend on the order; the lowest failing layer's error
  // is rethrown).
  const int L = cfg.num_hidden_layers;
  std::vector<std::array<Sublayer, 3>> layers(static_cast<size_t>(L));
  for_each_layer_parallel(L, [&](int64_t l) {
    const LayerSpec& ls = spec.layers[static_cast<size_t>(l)];
    int k = 0;
    for (const SublayerSpec* s : ls.sublayers()) {
      Sublayer& sub = layers[static_cast<size_t>(l)][k++];
      sub.spec = *s;
      if (!s->present()) continue;
      if (!s->parallel) sub.norm = read_decoder_norm(src, spec, s->norm, H);
      const ModuleArgs args{cfg, spec.params(s->kind, cfg), src, s->prefix, static_cast<int>(l), tp, spec.label};
      sub.module = cpu_module_type(s->kind).make(args);
    }
  });
  std::vector<Sublayer> subs;
  for (auto& pair : layers)
    for (Sublayer& s : pair)
      if (s.module) subs.push_back(std::move(s));
  std::vector<float> norm_f = read_decoder_norm(src, spec, spec.final_norm, H);
  for (const std::string& p : spec.ignored_tensor_prefixes) src.ignore_prefix(p);
  if (tp.rank == 0) src.warn_unused_tensors();
  return std::make_unique<DecoderLM>(cfg, spec, std::move(emb), std::move(head), std::move(norm_f), std::move(subs), std::move(ckpt), tp);
}

}  // namespace ssmserve
