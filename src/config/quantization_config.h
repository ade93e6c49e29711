// Owns reading config.json's quantization_config: the FP8 weight formats ssmserve loads (their weights dequantized
// as read, model/fp8_weights.h) and the clear error for every other method.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace ssmserve {

/// How an FP8 checkpoint stores its matrices: each quantized matrix X.weight as F8_E4M3 [..., N, K] beside its scales
/// X.weight<scale_suffix> [..., ceil(N / block_n), ceil(K / block_k)] (F32 / BF16 / F16), W = fp8 x scale. Matrices
/// the quantizer skipped (norms, routers, embeddings, LM head) stay BF16 / F32 and load as usual. The formats:
/// - quant_method "fp8" (transformers' FineGrainedFP8, vLLM's "fp8": Qwen3 / Qwen3.5 / Qwen3.6 / Qwen3-Next FP8
///   releases, DeepSeek-V3): {"fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128] or null},
///   scales X.weight_scale_inv (null block size: one per matrix);
/// - quant_method "compressed-tensors" with format "float-quantized" (llm-compressor's FP8 / FP8_DYNAMIC /
///   FP8_BLOCK schemes: RedHat's and many community FP8 releases): weights {"num_bits": 8, "type": "float",
///   "strategy": "tensor" | "channel" | "block"}, scales X.weight_scale ([1], [N, 1] or the block grid);
/// - quant_method "modelopt" with quant_algo "FP8" (NVIDIA Model Optimizer: NVIDIA's Nemotron FP8 releases; or its
///   hf_quant_config.json, ModelConfig::load): one X.weight_scale per matrix.
/// Weight-only (W8A16): activations and the KV cache are not quantized, whatever the checkpoint was calibrated for
/// (static X.input_scale, k_scale / v_scale are not read; dynamic per-token FP8 activations are not applied), so the
/// results are those of the dequantized weights in bf16 / fp32: transformers' own for a dequantized "fp8" checkpoint,
/// vLLM's weight-only FP8 path (GPUs without FP8 tensor cores). vLLM's W8A8 kernels on Hopper, and transformers on a
/// compressed-tensors checkpoint with input_activations, also round activations to FP8, which moves logprobs by
/// ~0.1 on the tiny test models.
struct Fp8Quantization {
  std::string method = "fp8";               ///< quant_method as written
  int block_n = 0;                          ///< output rows per scale (0: all N rows)
  int block_k = 0;                          ///< input columns per scale (0: all K columns)
  std::string scale_suffix = "_scale_inv";  ///< X.weight + this names X's scales
  /// Another name the format's writers use (quant_method "fp8": vLLM serializes per-tensor scales as
  /// X.weight_scale, transformers always as X.weight_scale_inv); read when the first is absent. Empty: none.
  std::string alt_scale_suffix;
};

/// How a GPTQ or AWQ checkpoint stores its matrices (weight-only integer quantization with per-group scales and zero
/// points; model/int_weights.h dequantizes them as they load). A Linear X [N out, K in] is X.qweight (I32, `bits`-bit
/// codes packed 32 / bits per word) beside X.scales (F16 / BF16 / F32 [groups, N]), X.qzeros (I32 [groups, N packed])
/// and, in GPTQ, X.g_idx (I32 [K]: each input row's group); W[n, k] = scale[g, n] x (q[k, n] - zero[g, n]).
/// - quant_method "gptq" (AutoGPTQ / GPTQModel / optimum; vLLM's gptq and gptq_marlin): qweight [K / pack, N] packed
///   along K, qzeros [groups, N / pack] packed along N, each code at bits x (index % pack) of its word; the
///   checkpoint_format "gptq" (v1) stores zero - 1 (read back + 1, as exllama and vLLM do), "gptq_v2" the zero; g_idx
///   (desc_act) groups rows in any order, else row k is in group k / group_size.
/// - quant_method "awq" (AutoAWQ's GEMM version; vLLM's awq and awq_marlin): 4-bit, qweight [K, N / 8] and qzeros
///   [groups, N / 8] both packed along N in AWQ's order (column 8j + c at nibble {0, 4, 1, 5, 2, 6, 3, 7}[c]).
/// - quant_method "compressed-tensors", format "pack-quantized" (llm-compressor's W4A16 / W8A16 int schemes; vLLM's
///   compressed-tensors WNA16): X.weight_packed I32 [N, K / pack] packed along K, each code stored as the signed value
///   + 2^(bits - 1); X.weight_scale [N, groups]; asymmetric schemes X.weight_zero_point I32 [N / pack, groups] packed
///   along N the same way; act order X.weight_g_idx; X.weight_shape I64 [N, K]. W = scale x (code - zero), the zero
///   2^(bits - 1) when symmetric.
/// Weight-only: the activations stay unquantized; the matrices are dequantized to F32 / BF16 as read.
struct IntQuantization {
  /// Where the codes, scales and zeros are and how they are packed.
  enum class Layout {
    Gptq,          ///< qweight [K / pack, N], scales [groups, N], qzeros [groups, N / pack], g_idx
    Awq,           ///< qweight [K, N / pack] and qzeros [groups, N / pack] in AWQ's order, scales [groups, N]
    PackQuantized  ///< weight_packed [N, K / pack], weight_scale [N, groups], weight_zero_point [N / pack, groups]
  };
  std::string method = "gptq";  ///< quant_method: "gptq", "awq" or "compressed-tensors"
  Layout layout = Layout::Gptq;
  int bits = 4;                 ///< 2, 4 or 8 (GPTQ); 4 (AWQ); 4 or 8 (pack-quantized)
  int group_size = 128;         ///< input rows per group; 0 = all K rows (GPTQ's -1)
  bool desc_act = false;        ///< GPTQ act-order (g_idx holds each row's group)
  bool zero_stored_minus_one = true;  ///< GPTQ v1's zeros (stored zero - 1)
  bool has_zeros = true;        ///< AWQ zero_point false: no qzeros, zero 2^(bits - 1)
  /// GPTQModel's per-module overrides (quantization_config.dynamic: {"+:regex" or "regex": {"bits": 8, ...},
  /// "-:regex": {}}): a module whose name matches a positive rule's regex from its start (Python's re.match) takes
  /// that rule's bits / group_size / desc_act; "-:" rules name modules left unquantized (stored as X.weight, read as
  /// such). At most one positive rule may match a module (config.json's key order is not kept).
  struct DynamicRule {
    std::string pattern;              ///< the regex, its "+:" / "-:" prefix removed
    bool exclude = false;             ///< a "-:" rule
    std::optional<int> bits, group_size;
    std::optional<bool> desc_act;
  };
  std::vector<DynamicRule> dynamic;

  /// This format with the overrides of the positive `dynamic` rule matching module `name` (e.g.
  /// "model.layers.3.mlp.down_proj"). Throws Error naming the rules when several match, or a regex that does not
  /// compile.
  IntQuantization for_module(const std::string& name) const;
};

/// Parses a quantization_config object (`what` names config.json in errors). Returns the FP8 format it describes;
/// throws Error naming the field for any other quant_method or an unsupported option (another fp8 format, int
/// weights, asymmetric or group scales, ...). GPTQ / AWQ configs are parse_int_quantization_config's.
Fp8Quantization parse_quantization_config(const nlohmann::json& q, const std::string& what);

/// The GPTQ / AWQ / compressed-tensors pack-quantized format a quantization_config describes, or nullopt when it is
/// another one (then parse_quantization_config reads it). Throws Error naming the field for an unsupported option (3-bit codes, AWQ's
/// GEMV / Marlin layouts, a group size that is not a positive integer or -1, ...).
std::optional<IntQuantization> parse_int_quantization_config(const nlohmann::json& q, const std::string& what);

}  // namespace ssmserve
