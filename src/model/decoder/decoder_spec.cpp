// Owns the DecoderSpec helpers (see decoder_spec.h).
#include "model/decoder/decoder_spec.h"

namespace ssmserve {

int DecoderSpec::count(const std::string& kind) const {
  int n = 0;
  for (const LayerSpec& l : layers) n += (l.mixer.kind == kind) + (l.ffn.kind == kind);
  return n;
}

}  // namespace ssmserve
