// Owns the Mamba-2 architecture's mapping onto the decoder stack (see mamba2.h).
#include "model/archs/mamba2.h"

#include <fmt/format.h>

namespace ssmserve {

DecoderSpec mamba2_spec(const ModelConfig& cfg) {
  const Mamba2Config m = Mamba2Config::from_json(cfg);  // validates before any weight is read
  DecoderSpec s;
  s.label = "Mamba-2";
  s.embedding = "backbone.embeddings.weight";
  s.final_norm = "backbone.norm_f.weight";
  s.tie_word_embeddings = cfg.tie_word_embeddings;
  s.norm_eps = cfg.layer_norm_epsilon;
  s.chunk_size = m.chunk_size;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    LayerSpec layer;
    layer.mixer = {"mamba2", fmt::format("backbone.layers.{}.norm.weight", l), fmt::format("backbone.layers.{}.mixer.", l)};
    s.layers.push_back(layer);
  }
  return s;
}

}  // namespace ssmserve
