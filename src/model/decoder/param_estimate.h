// Owns the parameter count of a DecoderSpec computed from its modules' hyperparameters alone (no weights read): what
// a dummy load (--load-format dummy) will allocate, so one that cannot fit is refused before it starts.
#pragma once
#include "model/decoder/decoder_spec.h"

namespace ssmserve {

/// Parameters of the model `spec` describes (embedding, LM head unless tied, every sublayer's norm and module), from
/// each module kind's hyperparameters (Mamba-1 / Mamba-2 / lightning / attention / MLP / MoE readers). Throws Error as
/// those readers do on a malformed field.
double estimate_param_count(const ModelConfig& cfg, const DecoderSpec& spec);

}  // namespace ssmserve
