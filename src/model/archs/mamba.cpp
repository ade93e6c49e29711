// Owns the Mamba-1 architecture's mapping onto the decoder stack (see mamba.h).
#include "model/archs/mamba.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ssmserve {

DecoderSpec mamba_backbone_spec(const ModelConfig& cfg, const char* label, const char* kind) {
  DecoderSpec s;
  s.label = label;
  s.embedding = "backbone.embeddings.weight";
  s.final_norm = "backbone.norm_f.weight";
  s.tie_word_embeddings = cfg.tie_word_embeddings;
  s.norm_eps = cfg.layer_norm_epsilon;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerSpec layer;
    layer.mixer = {kind, fmt::format("backbone.layers.{}.norm.weight", l), fmt::format("backbone.layers.{}.mixer.", l)};
    s.layers.push_back(layer);
  }
  return s;
}

DecoderSpec mamba_spec(const ModelConfig& cfg) {
  SSM_CHECK(cfg.mamba.has_value(), "{}: not a Mamba config", (cfg.dir / "config.json").string());
  return mamba_backbone_spec(cfg, "Mamba", "mamba1");
}

}  // namespace ssmserve
