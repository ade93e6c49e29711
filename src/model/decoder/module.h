// Owns the interface every CPU decoder module implements (a mixer: Mamba-1, Mamba-2, lightning attention, softmax
// attention, ...; or an FFN: MLP, MoE), what a module declares about the state it keeps per request, and the
// module registry (`kind` -> factory). A new layer type is one file implementing CpuModule plus one line in
// module_registry.cpp (docs/architecture.md, "Adding a mixer / an FFN").
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "cache/state_view.h"
#include "config/model_config.h"
#include "dist/communicator.h"
#include "model/forward_batch.h"
#include "model/weight_source.h"

namespace ssmserve {

/// What one module keeps per request in the block pool (vllm-ssm-design.md §1.2: each mixer reports its state
/// shapes; the engine owns the pool). Recurrent mixers fill conv / ssm (elements of the pool's conv and SSM dtypes,
/// this rank's shard); softmax attention fills the KV bytes per token. The *_full fields are the unsharded model's
/// (tensor parallelism), from which the KV block size is unified with the state page (§3.5).
struct ModuleStateSpec {
  int64_t conv_elems = 0;           ///< conv window, e.g. Mamba-1 [d_conv-1, d_inner]
  int64_t ssm_elems = 0;            ///< recurrent state, e.g. Mamba-1 [d_inner, d_state], lightning [H, D, D]
  int64_t full_state_elems = 0;     ///< conv + ssm elements of the unsharded layer
  int64_t kv_token_bytes = 0;       ///< softmax attention: K and V bytes per token (this rank's KV heads, fp32)
  int64_t full_kv_token_bytes = 0;  ///< the same for all KV heads
  bool recurrent() const { return conv_elems > 0 || ssm_elems > 0; }
  bool attention() const { return kv_token_bytes > 0; }
};

/// A module's views into the pool for one forward (filled by DecoderLM from the layout it computed).
struct ModuleState {
  StateView conv;   ///< block b's conv window at conv.block<T>(b)
  StateView ssm;    ///< block b's recurrent state
  KvCacheView kv;   ///< attention: this layer's K / V in every block
  int num_blocks = 0;
};

/// Scratch buffers shared by all modules of one model: layers run one after another, so every module may use any
/// slot for its temporaries within one forward call (never across calls).
class Scratch {
 public:
  static constexpr int kSlots = 16;
  /// Slot `slot` resized to n floats (contents unspecified).
  float* f32(int slot, int64_t n) {
    auto& v = bufs_.at(static_cast<size_t>(slot));
    v.resize(static_cast<size_t>(n));
    return v.data();
  }
  /// The vector of slot `slot` (for the collectives' growable scratch).
  std::vector<float>& vec(int slot) { return bufs_.at(static_cast<size_t>(slot)); }

 private:
  std::array<std::vector<float>, kSlots> bufs_;
};

/// One forward call as a module sees it.
struct ModuleStep {
  const ForwardBatch& batch;  ///< the packed batch and its metadata (decodes first)
  ModuleState state;          ///< this module's state views
  Scratch& scratch;
};

/// One decoder module on the CPU. forward maps the normed hidden rows to the module's output rows; the decoder
/// adds the residual (model/decoder/decoder_lm.h). Batch-invariant: a row's output never depends on other rows.
class CpuModule {
 public:
  virtual ~CpuModule() = default;
  /// What this module keeps per request (nothing for FFNs).
  virtual ModuleStateSpec state_spec() const { return {}; }
  /// x: [T, hidden] fp32 (the sublayer's normed input); out: [T, hidden] fp32. A tensor-parallel module is a
  /// collective: every rank calls it with the same batch and gets the same complete `out`.
  virtual void forward(const float* x, int64_t T, float* out, const ModuleStep& step) = 0;
};

/// Everything a module factory reads.
struct ModuleArgs {
  const ModelConfig& cfg;
  const nlohmann::json& params;  ///< this module kind's hyperparameters (config.json unless the architecture maps them)
  WeightSource& src;
  std::string prefix;            ///< weight-name prefix of the module's tensors, e.g. "backbone.layers.3.mixer."
  int layer = 0;                 ///< decoder layer index
  dist::TpRank tp;               ///< this rank (world 1: unsharded)
  std::string label;             ///< the architecture's short name, for messages ("MiniMax")
};

/// Builds one layer's module, reading its weights from args.src. Throws Error naming a missing / misshapen tensor
/// or an invalid hyperparameter.
using ModuleFactory = std::unique_ptr<CpuModule> (*)(const ModuleArgs& args);

/// Whole-stack decode fast path a mixer kind may offer (Mamba-2: every layer inside one OpenMP region). Called for
/// models whose layers are all this mixer with pre-norm residuals and no FFN; returns false, doing nothing, when it
/// does not take this batch. hidden: [T, H] fp32 residual stream; norms[l]: layer l's pre-norm weight [H].
using StackDecodeFn = bool (*)(std::span<CpuModule* const> layers, std::span<const float* const> norms, float eps,
                               const ForwardBatch& batch, std::span<const ModuleState> states, float* hidden, int64_t T,
                               int64_t H, Scratch& scratch);

/// A registry entry.
struct ModuleType {
  std::string_view kind;          ///< "mamba1", "mamba2", "lightning", "attention", "mlp", "moe"
  ModuleFactory make = nullptr;
  StackDecodeFn stack_decode = nullptr;  ///< optional
};

/// The registered module kinds (module_registry.cpp).
std::span<const ModuleType> cpu_module_types();
/// The entry of `kind`. Throws Error listing the known kinds when it is not registered.
const ModuleType& cpu_module_type(std::string_view kind);

}  // namespace ssmserve
