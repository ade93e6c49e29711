// Owns DecoderSpec: a model as data. A decoder is embedding -> layers -> final RMSNorm -> LM head; each layer is a
// mixer sublayer and an FFN sublayer (either may be absent), each sublayer an RMSNorm, a module from the registry
// (model/decoder/module.h) and a residual rule. An architecture is a function from config.json to a DecoderSpec
// (src/model/archs/*.cpp); DecoderLM (decoder_lm.h) runs any spec on the CPU.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/model_config.h"

namespace ssmserve {

/// One sublayer: h <- alpha * r + beta * module(rms_norm(h, norm)), where r = h (pre-norm, the usual residual) or
/// r = rms_norm(h) (MiniMax's residual_is_normed). alpha = beta = 1 with r = h is the plain h += module(norm(h)).
struct SublayerSpec {
  std::string kind;    ///< module registry kind ("mamba1", "mamba2", "lightning", "attention", "mlp", "moe"); empty: none
  std::string norm;    ///< the pre-norm's weight name [hidden]
  std::string prefix;  ///< the module's weight-name prefix, e.g. "model.layers.3.self_attn."
  float alpha = 1.0f;  ///< residual scale
  float beta = 1.0f;   ///< module-output scale (Granite's residual_multiplier, MiniMax's *_beta_factor)
  bool residual_is_normed = false;
  /// A second mixer beside the layer's first (Falcon-H1's attention beside its Mamba-2): it reads the first mixer's
  /// normed input (its `norm` is unused) and adds beta * module(...) to the same residual, h = h + b1 m1(n) + b2 m2(n).
  bool parallel = false;
  bool present() const { return !kind.empty(); }
  /// True for the plain pre-norm residual h += module(norm(h)).
  bool plain_residual() const { return alpha == 1.0f && beta == 1.0f && !residual_is_normed; }
};

/// One decoder layer: a mixer sublayer, optionally a second mixer in parallel with it, and an FFN sublayer.
struct LayerSpec {
  SublayerSpec mixer;
  SublayerSpec parallel_mixer;  ///< parallel = true; empty for every architecture but Falcon-H1
  SublayerSpec ffn;
  /// The sublayers in execution order (absent ones included; check present()).
  std::array<const SublayerSpec*, 3> sublayers() const { return {&mixer, &parallel_mixer, &ffn}; }
};

/// A whole model as data (per-layer structure, weight names, muP-style scalars).
struct DecoderSpec {
  std::string label;                  ///< architecture's short name for messages ("Mamba", "Mamba-2", "MiniMax")
  std::vector<LayerSpec> layers;      ///< [num_hidden_layers]
  std::string embedding;              ///< [vocab, hidden]
  std::string final_norm;             ///< [hidden]
  std::string lm_head = "lm_head.weight";
  bool tie_word_embeddings = true;    ///< the LM head is the embedding when the checkpoint has no lm_head
  float norm_eps = 1e-5f;             ///< every RMSNorm of the stack
  float embedding_multiplier = 1.0f;  ///< hidden = embedding[id] * multiplier (Granite)
  float logits_scaling = 1.0f;        ///< logits = lm_head(...) / logits_scaling (Granite)
  /// Every decoder RMSNorm weight (the sublayers' pre-norms and the final norm) is used as offset + w: 1 for the
  /// zero-centred norms of Qwen3.5 / Qwen3-Next (transformers' `x_normed * (1 + w)`), 0 otherwise.
  float norm_weight_offset = 0.0f;
  /// Checkpoint tensors under these name prefixes belong to parts the text decoder does not run (a vision tower
  /// `model.visual.`, an MTP head `mtp.`): not reported as unused.
  std::vector<std::string> ignored_tensor_prefixes;
  /// Hyperparameters per module kind, as that module reads them (field names of the module's own family); a kind
  /// without an entry reads config.json. An architecture whose config spells them differently maps them here.
  std::map<std::string, nlohmann::json> module_params;
  /// Mamba-2 chunk_size: the metadata builder's chunk length (256 when no mixer chunks its prefill).
  int chunk_size = 256;
  /// Estimated bytes of all parameters at 2 bytes each; a dummy load (--load-format dummy) larger than 80% of the
  /// physical memory is refused up front. 0: not checked.
  double dummy_bytes = 0;

  /// The hyperparameters of `kind` (module_params or config.json).
  const nlohmann::json& params(const std::string& kind, const ModelConfig& cfg) const {
    auto it = module_params.find(kind);
    return it == module_params.end() ? cfg.raw : it->second;
  }
  /// Number of layers whose mixer or FFN is `kind`.
  int count(const std::string& kind) const;
};

class WeightSource;
/// The decoder norm `name` [hidden] of `spec` (offset + w; DummyInit constant 1 for dummy weights), read by both
/// backends. Throws Error as WeightSource::vector.
std::vector<float> read_decoder_norm(WeightSource& src, const DecoderSpec& spec, const std::string& name, int64_t hidden);

/// An architecture: config.json -> DecoderSpec. Throws Error naming the field on an invalid config.
using ArchitectureSpecFn = DecoderSpec (*)(const ModelConfig& cfg);

/// Throws Error unless `spec` has one layer per num_hidden_layers and `known(kind)` accepts every kind it names
/// (a backend's registry lookup, which throws naming the kinds it has): before any weight is read.
[[noreturn]] void spec_layer_count_error(const ModelConfig& cfg, const DecoderSpec& spec);
/// Throws Error unless every parallel mixer follows a first mixer and both have plain residuals (alpha 1, r = h).
void check_parallel_sublayers(const DecoderSpec& spec);
template <class KnownFn>
void check_spec(const ModelConfig& cfg, const DecoderSpec& spec, KnownFn known) {
  if (static_cast<int>(spec.layers.size()) != cfg.num_hidden_layers) spec_layer_count_error(cfg, spec);
  check_parallel_sublayers(spec);
  for (const LayerSpec& l : spec.layers)
    for (const SublayerSpec* s : l.sublayers())
      if (s->present()) known(s->kind);
}

/// The spec of cfg.architecture from the architecture registry (model/registry.cpp), for every backend. Throws
/// Error naming config.json and the supported architectures when it is not registered, or as the mapping does.
DecoderSpec architecture_spec(const ModelConfig& cfg);

}  // namespace ssmserve
