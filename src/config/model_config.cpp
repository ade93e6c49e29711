// Owns loading and validating ModelConfig / MambaConfig from a Hugging Face config.json (+ generation_config.json).
#include "config/model_config.h"

#include <algorithm>
#include <map>

#include <climits>
#include <cmath>
#include <string_view>

#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::json;

/// Typed, validated access to the fields of one parsed JSON object; every error names `what` and the field.
struct Fields {
  const json& j;
  std::string what;  ///< e.g. "models/x/config.json"

  static std::string show(const json& v) { return json_excerpt(v); }
  const json* find(const char* key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  const json& need(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) fail("{}: required field \"{}\" is missing", what, key);
    return *v;
  }
  int positive_int(const char* key, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > INT_MAX)
      fail("{}: field \"{}\" must be a positive integer (got {})", what, key, show(v));
    return static_cast<int>(v.get<int64_t>());
  }
  int positive_int(const char* key) const { return positive_int(key, need(key)); }
  int positive_int_or(const char* key, int dflt) const {
    const json* v = find(key);
    return v ? positive_int(key, *v) : dflt;
  }
  /// A token id: a non-negative integer, or -1 when absent/null.
  int token_id(const char* key, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT_MAX)
      fail("{}: field \"{}\" must be a non-negative token id (got {})", what, key, show(v));
    return static_cast<int>(v.get<int64_t>());
  }
  int token_id_or_none(const char* key) const {
    const json* v = find(key);
    return v ? token_id(key, *v) : -1;
  }
  /// An int or a list of ints (eos_token_id).
  std::vector<int> token_ids(const char* key) const {
    const json* v = find(key);
    std::vector<int> out;
    if (v == nullptr) return out;
    if (v->is_array()) {
      for (const json& e : *v) out.push_back(token_id(key, e));
    } else {
      out.push_back(token_id(key, *v));
    }
    return out;
  }
  bool boolean_or(const char* key, bool dflt) const {
    const json* v = find(key);
    if (v == nullptr) return dflt;
    if (!v->is_boolean()) fail("{}: field \"{}\" must be true or false (got {})", what, key, show(*v));
    return v->get<bool>();
  }
  std::string string_or(const char* key, const std::string& dflt) const {
    const json* v = find(key);
    if (v == nullptr) return dflt;
    if (!v->is_string()) fail("{}: field \"{}\" must be a string (got {})", what, key, show(*v));
    return v->get<std::string>();
  }
  double number(const char* key, const json& v) const {
    try {
      return json_float(v, key);
    } catch (const Error& e) {
      fail("{}: {}", what, e.what());
    }
  }
};

/// Throws naming `what` and `field` when an id (other than -1 = absent) is outside [0, vocab_size).
void check_in_vocab(const std::string& what, const char* field, const std::vector<int>& ids, int vocab_size) {
  for (const int id : ids)
    SSM_CHECK(id == -1 || (id >= 0 && id < vocab_size),
              "{}: field \"{}\" is {}, outside the vocabulary [0, {}) (vocab_size in config.json)", what, field, id,
              vocab_size);
}

std::string config_label(const std::filesystem::path& dir) {
  return dir.empty() ? std::string("config.json") : (dir / "config.json").string();
}

}  // namespace

MambaConfig MambaConfig::from_json(const json& cfg, int hidden_size) {
  return from_json_labeled(cfg, hidden_size, "config.json");
}

MambaConfig MambaConfig::from_json_labeled(const json& cfg, int hidden_size, const std::string& what) {
  SSM_CHECK(cfg.is_object(), "{}: must be a JSON object", what);
  SSM_CHECK(hidden_size > 0, "{}: hidden_size must be positive (got {})", what, hidden_size);
  const Fields f{cfg, what};
  MambaConfig m;
  m.d_state = f.positive_int("state_size");
  m.d_conv = f.positive_int("conv_kernel");
  if (f.find("intermediate_size") != nullptr) {
    m.d_inner = f.positive_int("intermediate_size");
  } else {
    const int expand = f.positive_int_or("expand", 2);
    SSM_CHECK(!__builtin_mul_overflow(expand, hidden_size, &m.d_inner),
              "{}: expand {} x hidden_size {} overflows", what, expand, hidden_size);
  }
  const json* rank = f.find("time_step_rank");
  if (rank == nullptr || (rank->is_string() && rank->get<std::string>() == "auto")) {
    m.dt_rank = (hidden_size + 15) / 16;
  } else if (rank->is_number_integer()) {
    m.dt_rank = f.positive_int("time_step_rank", *rank);
  } else {
    fail("{}: field \"time_step_rank\" must be a positive integer or \"auto\" (got {})", what, Fields::show(*rank));
  }
  // HF's MambaMixer applies ACT2FN[hidden_act] after the conv and to the gate; ssmserve's kernels implement SiLU.
  const std::string act = f.string_or("hidden_act", "silu");
  SSM_CHECK(act == "silu" || act == "swish", "{}: field \"hidden_act\" is \"{}\", but ssmserve's Mamba supports "
            "only \"silu\"", what, text_excerpt(act));
  m.use_bias = f.boolean_or("use_bias", false);
  m.use_conv_bias = f.boolean_or("use_conv_bias", true);
  m.residual_in_fp32 = f.boolean_or("residual_in_fp32", true);
  m.inner_layernorms = f.boolean_or("inner_layernorms", false);
  if (const json* e = f.find("inner_layernorm_eps")) {
    const double eps = json_float(*e, "inner_layernorm_eps");
    SSM_CHECK(eps > 0 && eps < 1, "{}: field \"inner_layernorm_eps\" must be in (0, 1) (got {})", what, eps);
    m.inner_layernorm_eps = static_cast<float>(eps);
  }
  return m;
}

namespace {

json text_config_view(const json& cfg, const std::string& what) {
  auto it = cfg.find("text_config");
  if (it == cfg.end() || it->is_null() || cfg.contains("hidden_size")) return cfg;
  SSM_CHECK(it->is_object(), "{}: field \"text_config\" must be an object (got {})", what, Fields::show(*it));
  json flat = *it;
  for (const char* key : {"architectures", "model_type", "tie_word_embeddings"})
    if (cfg.contains(key)) flat[key] = cfg[key];
  for (auto kv = cfg.begin(); kv != cfg.end(); ++kv)  // wrapper-only fields (token ids, dtype) where text_config lacks them
    if (!flat.contains(kv.key()) && kv.key() != "text_config" && kv.key() != "vision_config") flat[kv.key()] = kv.value();
  return flat;
}

}  // namespace

ModelConfig ModelConfig::from_json(const json& cfg, const std::filesystem::path& dir) {
  const std::string what = config_label(dir);
  SSM_CHECK(cfg.is_object(), "{}: must be a JSON object (got {})", what, Fields::show(cfg));
  // A multimodal wrapper (Qwen3.5's *ForConditionalGeneration) keeps the language model's fields in text_config:
  // the text decoder reads them, with the wrapper's architectures and tie_word_embeddings (vLLM's get_text_config).
  const json flat = text_config_view(cfg, what);
  if (const auto tc = cfg.find("text_config"); tc != cfg.end() && tc->is_object() && tc->contains("quantization_config") &&
                                               cfg.contains("quantization_config"))
    SSM_CHECK((*tc)["quantization_config"] == cfg["quantization_config"], "{}: quantization_config and "
              "text_config.quantization_config differ; a checkpoint has one quantization (give it once)", what);
  const Fields f{flat, what};
  ModelConfig c;
  c.dir = dir;
  c.raw = flat;
  if (const json* a = f.find("architectures")) {
    SSM_CHECK(a->is_array() && !a->empty() && (*a)[0].is_string() && !(*a)[0].get<std::string>().empty(),
              "{}: field \"architectures\" must be a non-empty list of class names (got {})", what, Fields::show(*a));
    c.architecture = (*a)[0].get<std::string>();
  }
  c.model_type = f.string_or("model_type", "");
  SSM_CHECK(!c.architecture.empty() || !c.model_type.empty(),
            "{}: required field \"architectures\" (or \"model_type\") is missing", what);
  if (c.architecture.empty()) {  // as transformers' AutoModelForCausalLM maps a config's model_type to its class
    static const std::map<std::string, std::string> by_model_type = {
        {"mamba", "MambaForCausalLM"}, {"mamba2", "Mamba2ForCausalLM"}, {"minimax", "MiniMaxForCausalLM"},
        {"granitemoehybrid", "GraniteMoeHybridForCausalLM"}, {"bamba", "BambaForCausalLM"},
        {"nemotron_h", "NemotronHForCausalLM"}, {"jamba", "JambaForCausalLM"}, {"falcon_h1", "FalconH1ForCausalLM"},
        {"qwen3_5", "Qwen3_5ForConditionalGeneration"}, {"qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"},
        {"qwen3_5_text", "Qwen3_5ForCausalLM"}, {"qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"}, {"qwen3_next", "Qwen3NextForCausalLM"}};
    auto it = by_model_type.find(c.model_type);
    SSM_CHECK(it != by_model_type.end(), "{}: field \"architectures\" is missing and model_type \"{}\" names no supported "
              "architecture (give \"architectures\")", what, text_excerpt(c.model_type));
    c.architecture = it->second;
  }
  // A quantized checkpoint: FP8 weights (fp8, compressed-tensors float-quantized, modelopt FP8; model/fp8_weights.h)
  // and GPTQ / AWQ integer weights (model/int_weights.h) load, dequantized as read; the others (bitsandbytes, int
  // compressed-tensors, ...) have no loader, so they would fail later on a tensor's dtype or a "missing" .weight, or
  // load scales as weights: named here.
  if (const json* q = f.find("quantization_config"); q != nullptr && !q->is_null()) {
    c.int_quant = parse_int_quantization_config(*q, what);
    if (!c.int_quant) c.fp8 = parse_quantization_config(*q, what);
  }
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  // Nemotron-H configs written by transformers 5.x drop num_hidden_layers (deprecated there): the length of the
  // per-layer type list is the layer count. A list that is there but malformed is named (not "num_hidden_layers is
  // missing", which sends the user to a field transformers no longer writes).
  if (f.find("num_hidden_layers") == nullptr) {
    for (const char* key : {"layers_block_type", "layer_types", "hybrid_override_pattern"}) {
      const json* v = f.find(key);
      if (v == nullptr || v->is_null()) continue;
      const bool pattern = std::string_view(key) == "hybrid_override_pattern";
      const size_t n = pattern ? (v->is_string() ? v->get_ref<const std::string&>().size() : 0) : (v->is_array() ? v->size() : 0);
      SSM_CHECK(n > 0, "{}: field \"{}\" must be a non-empty {} (with num_hidden_layers absent it gives the layer count; "
                "got {})", what, key, pattern ? "string such as \"M-M*-ME\"" : "list of layer types", json_excerpt(*v));
      c.num_hidden_layers = static_cast<int>(std::min<size_t>(n, 1 << 20));
      break;
    }
  }
  if (c.num_hidden_layers == 0) c.num_hidden_layers = f.positive_int("num_hidden_layers");
  // Far above any published model (hundreds of layers), and low enough that per-layer lists stay small before the
  // memory estimate refuses a model too large.
  SSM_CHECK(c.num_hidden_layers <= 4096, "{}: field \"num_hidden_layers\" must be <= 4096 (got {})", what, c.num_hidden_layers);

  for (const char* key : {"layer_norm_epsilon", "rms_norm_eps", "norm_epsilon", "layer_norm_eps"}) {
    if (const json* v = f.find(key)) {
      const double eps = f.number(key, *v);
      SSM_CHECK(std::isfinite(eps), "{}: field \"{}\" must be a finite number in (0, 1) (got {})", what, key,
                std::isnan(eps) ? "NaN" : eps > 0 ? "Infinity" : "-Infinity");
      SSM_CHECK(eps > 0 && eps < 1, "{}: field \"{}\" must be in (0, 1) (got {})", what, key, Fields::show(*v));
      c.layer_norm_epsilon = static_cast<float>(eps);
      break;
    }
  }
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", true);
  c.bos_token_id = f.token_id_or_none("bos_token_id");
  c.pad_token_id = f.token_id_or_none("pad_token_id");
  c.eos_token_ids = f.token_ids("eos_token_id");
  check_in_vocab(what, "bos_token_id", {c.bos_token_id}, c.vocab_size);
  check_in_vocab(what, "pad_token_id", {c.pad_token_id}, c.vocab_size);
  check_in_vocab(what, "eos_token_id", c.eos_token_ids, c.vocab_size);
  c.max_model_len = f.positive_int_or("max_position_embeddings", 0);
  c.torch_dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));

  const bool is_mamba1 = c.model_type == "mamba" || c.architecture == "MambaForCausalLM";
  if (is_mamba1) c.mamba = MambaConfig::from_json_labeled(cfg, c.hidden_size, what);
  return c;
}

ModelConfig ModelConfig::load(const std::filesystem::path& dir) {
  std::error_code ec;
  SSM_CHECK(std::filesystem::is_directory(dir, ec), "model folder {} does not exist or is not a directory",
            dir.string());
  const auto cfg_path = dir / "config.json";
  SSM_CHECK(path_entry_exists(cfg_path), "{}: file not found (every model folder needs a Hugging Face config.json)",
            cfg_path.string());
  ModelConfig c = from_json(parse_hf_json(read_text_file(cfg_path, kMaxConfigFileBytes), cfg_path.string()), dir);

  const auto gen_path = dir / "generation_config.json";
  if (path_entry_exists(gen_path)) {
    const json gen = parse_hf_json(read_text_file(gen_path, kMaxConfigFileBytes), gen_path.string());
    SSM_CHECK(gen.is_object(), "{}: must be a JSON object (got {})", gen_path.string(), Fields::show(gen));
    const Fields g{gen, gen_path.string()};
    if (g.find("eos_token_id") != nullptr) {
      c.eos_token_ids = g.token_ids("eos_token_id");
      check_in_vocab(gen_path.string(), "eos_token_id", c.eos_token_ids, c.vocab_size);
    }
  }
  // NVIDIA Model Optimizer's checkpoints written before it filled config.json's quantization_config keep it in
  // hf_quant_config.json {"producer": ..., "quantization": {"quant_algo": "FP8", ...}} (vLLM reads it too).
  const auto hf_quant_path = dir / "hf_quant_config.json";
  if (!c.fp8 && !c.int_quant && path_entry_exists(hf_quant_path)) {
    const json hq = parse_hf_json(read_text_file(hf_quant_path, kMaxConfigFileBytes), hf_quant_path.string());
    const auto q = hq.is_object() ? hq.find("quantization") : hq.end();
    SSM_CHECK(q != hq.end() && q->is_object(), "{}: must be an object with an object \"quantization\"", hf_quant_path.string());
    json as_config = *q;
    as_config["quant_method"] = "modelopt";
    c.fp8 = parse_quantization_config(as_config, hf_quant_path.string());
  }
  return c;
}

}  // namespace ssmserve
