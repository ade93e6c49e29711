// Owns the Mamba-2 architecture's mapping onto the decoder stack (see mamba2.h).
#include "model/archs/mamba2.h"

#include "model/archs/mamba.h"

namespace ssmserve {

DecoderSpec mamba2_spec(const ModelConfig& cfg) {
  const Mamba2Config m = Mamba2Config::from_json(cfg);  // validates before any weight is read
  DecoderSpec s = mamba_backbone_spec(cfg, "Mamba-2", "mamba2");
  s.chunk_size = m.chunk_size;
  return s;
}

}  // namespace ssmserve
