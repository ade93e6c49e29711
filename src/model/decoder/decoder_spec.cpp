// Owns the DecoderSpec helpers (see decoder_spec.h).
#include "model/decoder/decoder_spec.h"

#include "core/error.h"
#include "model/weight_source.h"

namespace ssmserve {

void check_parallel_sublayers(const DecoderSpec& spec) {
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LayerSpec& ls = spec.layers[l];
    const SublayerSpec& p = ls.parallel_mixer;
    if (!p.present()) continue;
    SSM_CHECK(p.parallel && ls.mixer.present() && p.alpha == 1.0f && !p.residual_is_normed && ls.mixer.alpha == 1.0f &&
                  !ls.mixer.residual_is_normed,
              "{}: layer {}'s parallel mixer needs a first mixer and plain (alpha 1, r = h) residuals", spec.label, l);
  }
}

void spec_layer_count_error(const ModelConfig& cfg, const DecoderSpec& spec) {
  fail("{}: {} layer specs for num_hidden_layers {}", spec.label, spec.layers.size(), cfg.num_hidden_layers);
}

std::vector<float> read_decoder_norm(WeightSource& src, const DecoderSpec& spec, const std::string& name, int64_t hidden) {
  std::vector<float> w = src.vector(name, {hidden}, DummyInit::constant(1.0f));
  if (spec.norm_weight_offset != 0.0f)
    for (float& x : w) x += spec.norm_weight_offset;
  return w;
}

int DecoderSpec::count(const std::string& kind) const {
  int n = 0;
  for (const LayerSpec& l : layers)
    for (const SublayerSpec* s : l.sublayers()) n += s->kind == kind;
  return n;
}

}  // namespace ssmserve
