// Owns the CPU module registry: one line per layer type (docs/architecture.md, "Adding a mixer / an FFN").
#include <array>

#include "core/error.h"
#include "model/decoder/module.h"
#include "model/ffns/mlp_ffn.h"
#include "model/ffns/moe_ffn.h"
#include "model/mixers/attention_mixer.h"
#include "model/mixers/gated_delta_mixer.h"
#include "model/mixers/lightning_mixer.h"
#include "model/mixers/mamba1_mixer.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve {
namespace {

const std::array<ModuleType, 7> kModules = {{
    // Mixers (state per request: conv window + SSM / linear-attention state, or KV pages).
    {"mamba1", &make_mamba1_mixer, nullptr},
    {"mamba2", &make_mamba2_mixer, &mamba2_stack_decode},
    {"lightning", &make_lightning_mixer, nullptr},
    {"gated_delta", &make_gated_delta_mixer, nullptr},
    {"attention", &make_attention_mixer, nullptr},
    // FFNs (stateless).
    {"mlp", &make_mlp_ffn, nullptr},
    {"moe", &make_moe_ffn, nullptr},
}};

}  // namespace

std::span<const ModuleType> cpu_module_types() { return kModules; }

const ModuleType& cpu_module_type(std::string_view kind) {
  std::string known;
  for (const ModuleType& t : kModules) {
    if (t.kind == kind) return t;
    known += (known.empty() ? "" : ", ") + std::string(t.kind);
  }
  fail("decoder: layer type \"{}\" is not registered (known: {})", kind, known);
}

}  // namespace ssmserve
