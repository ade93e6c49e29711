// Owns the parsed Hugging Face model configuration (config.json + generation_config.json) and its validation.
#pragma once
#include <nlohmann/json.hpp>

#include "config/hf_json.h"  // parse_hf_json, read_text_file, json_float (declared there)
#include "config/quantization_config.h"
#include "core/dtype.h"

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve {

/// Mamba-1 mixer hyperparameters (HF `MambaConfig`; names as in the Mamba paper / vLLM).
struct MambaConfig {
  int d_inner = 0;      ///< intermediate_size (= expand * hidden_size)
  int d_state = 0;      ///< state_size, N
  int d_conv = 0;       ///< conv_kernel, K
  int dt_rank = 0;      ///< time_step_rank, R ("auto" -> ceil(hidden_size / 16))
  bool use_bias = false;       ///< in_proj / out_proj bias
  bool use_conv_bias = true;   ///< conv1d bias
  bool residual_in_fp32 = true;
  /// Jamba's RMSNorms (with weights, epsilon inner_layernorm_eps) over dt_low, B and C after x_proj
  /// (`inner_layernorms`: an ssmserve field an architecture sets; transformers' JambaMambaMixer always has them).
  bool inner_layernorms = false;
  float inner_layernorm_eps = 1e-6f;

  /// Reads the Mamba fields from a parsed config.json. Throws Error naming a missing or invalid field.
  static MambaConfig from_json(const nlohmann::json& cfg, int hidden_size);

  /// Same as from_json, with `what` (e.g. the config.json path) naming the source in error messages.
  static MambaConfig from_json_labeled(const nlohmann::json& cfg, int hidden_size, const std::string& what);
};

/// Model-level configuration shared by every architecture, plus the architecture-specific section.
struct ModelConfig {
  std::filesystem::path dir;       ///< checkpoint folder
  std::string architecture;        ///< architectures[0], e.g. "MambaForCausalLM"
  std::string model_type;          ///< e.g. "mamba"
  nlohmann::json raw;              ///< config.json as parsed (infinities normalized to JSON numbers/strings)
  int vocab_size = 0;              ///< rows of the embedding / LM head (may exceed the tokenizer's vocabulary)
  int hidden_size = 0;
  int num_hidden_layers = 0;
  float layer_norm_epsilon = 1e-5f;
  bool tie_word_embeddings = true;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  ///< from generation_config.json if present, else config.json
  int pad_token_id = -1;
  int max_model_len = 0;           ///< 0 = unbounded (recurrent models have no positional limit)
  std::string torch_dtype;         ///< "bfloat16" / "float16" / "float32" ("dtype" or "torch_dtype"; empty if absent)
  std::optional<MambaConfig> mamba;
  /// config.json's quantization_config, when the checkpoint's weights are FP8 (config/quantization_config.h).
  std::optional<Fp8Quantization> fp8;
  /// config.json's quantization_config, when the checkpoint's weights are GPTQ / AWQ integers (config/quantization_config.h).
  std::optional<IntQuantization> int_quant;
  /// Not from config.json: a CPU reference mode for GPU tests (off by default; nothing else changes when off). The CPU
  /// decoder then rounds each GEMM input (activation) to bf16 where the GPU does with bf16 weights: every projection
  /// of the mixers and dense MLPs, the MoE experts' x and activations, the LM head; not the MoE router (fp32 on the
  /// GPU). Weights stay as loaded (Weight::round_input_bf16 marks the matrices, cpu::linear rounds).
  bool round_gemm_inputs_bf16 = false;
  /// Not from config.json: the weights' dtype asked for (vLLM's --dtype, EngineConfig::dtype; set by load_model).
  /// nullopt = auto, the backend's default (GPU: BF16; CPU: the checkpoint's weights as stored). A device backend
  /// applies it to its weights (the GPU: BF16 or F32); the CPU decoder computes in fp32 whatever it says.
  std::optional<DType> dtype;
  /// Not from config.json: no CUDA graphs (vLLM's --enforce-eager, EngineConfig::enforce_eager; set by load_model). A
  /// device backend that captures graphs launches every step eagerly instead (the same results); the CPU ignores it.
  bool enforce_eager = false;

  /// Loads `dir`/config.json (and generation_config.json when present), validating every field used.
  /// Throws Error naming the file and field on invalid JSON, a missing or mistyped field, or a value out of range.
  static ModelConfig load(const std::filesystem::path& dir);

  /// Builds a config from already-parsed config.json content (no generation_config.json). Same errors.
  static ModelConfig from_json(const nlohmann::json& cfg, const std::filesystem::path& dir = {});
};

}  // namespace ssmserve
