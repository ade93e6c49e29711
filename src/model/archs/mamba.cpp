// Owns the Mamba-1 architecture's mapping onto the decoder stack and the whole-model weight reader (see mamba.h).
#include "model/archs/mamba.h"

#include <fmt/format.h>

#include "core/error.h"
#include "dist/shard.h"
#include "model/parallel_layers.h"

namespace ssmserve {

DecoderSpec mamba_spec(const ModelConfig& cfg) {
  SSM_CHECK(cfg.mamba.has_value(), "{}: not a Mamba config", (cfg.dir / "config.json").string());
  DecoderSpec s;
  s.label = "Mamba";
  s.embedding = "backbone.embeddings.weight";
  s.final_norm = "backbone.norm_f.weight";
  s.tie_word_embeddings = cfg.tie_word_embeddings;
  s.norm_eps = cfg.layer_norm_epsilon;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerSpec layer;
    layer.mixer = {"mamba1", fmt::format("backbone.layers.{}.norm.weight", l), fmt::format("backbone.layers.{}.mixer.", l)};
    s.layers.push_back(layer);
  }
  return s;
}

MambaWeights MambaWeights::load(const ModelConfig& cfg, WeightSource& src, const dist::TpRank& tp) {
  const MambaConfig& m = *cfg.mamba;
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  const dist::Range v = dist::vocab_shard(V, tp.rank, tp.world);
  MambaWeights w;
  w.embedding = dist::slice_rows(src.matrix("backbone.embeddings.weight", {V, H}, DummyInit::uniform(0.1f)), {v});
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for_each_layer_parallel(cfg.num_hidden_layers, [&](int64_t l) {
    const std::string p = fmt::format("backbone.layers.{}.", l);
    std::vector<float> norm = src.vector(p + "norm.weight", {H}, DummyInit::constant(1.0f));
    MambaLayerWeights L = read_mamba1_layer(src, p + "mixer.", H, m, tp);
    L.norm = std::move(norm);
    w.layers[static_cast<size_t>(l)] = std::move(L);
  });
  w.norm_f = src.vector("backbone.norm_f.weight", {H}, DummyInit::constant(1.0f));
  if (cfg.tie_word_embeddings && !src.has("lm_head.weight")) w.lm_head = w.embedding;
  else w.lm_head = dist::slice_rows(src.matrix("lm_head.weight", {V, H}, DummyInit::uniform(0.1f)), {v});
  return w;
}

}  // namespace ssmserve
