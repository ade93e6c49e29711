// Owns the DecoderSpec helpers (see decoder_spec.h).
#include "model/decoder/decoder_spec.h"

#include "core/error.h"

namespace ssmserve {

void spec_layer_count_error(const ModelConfig& cfg, const DecoderSpec& spec) {
  fail("{}: {} layer specs for num_hidden_layers {}", spec.label, spec.layers.size(), cfg.num_hidden_layers);
}

int DecoderSpec::count(const std::string& kind) const {
  int n = 0;
  for (const LayerSpec& l : layers) n += (l.mixer.kind == kind) + (l.ffn.kind == kind);
  return n;
}

}  // namespace ssmserve
