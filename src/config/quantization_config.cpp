// Owns parse_quantization_config (see quantization_config.h).
#include "config/quantization_config.h"

#include <algorithm>
#include <cctype>
#include <regex>

#include <fmt/format.h>

#include "config/hf_json.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::json;

/// q[key] when present and not null, else nullptr.
const json* field(const json& q, const char* key) {
  const auto it = q.find(key);
  return it == q.end() || it->is_null() ? nullptr : &*it;
}

/// A [rows, columns] block size of positive integers, or throws naming `name`.
std::pair<int, int> block_size(const json& b, const std::string& what, const std::string& name) {
  const bool ok = b.is_array() && b.size() == 2 && std::all_of(b.begin(), b.end(), [](const json& v) {
                    return v.is_number_integer() && v.get<long long>() >= 1 && v.get<long long>() <= (1 << 20);
                  });
  SSM_CHECK(ok, "{}: {} must be [rows, columns] of integers in [1, 1048576] (got {})", what, name, json_excerpt(b));
  return {b[0].get<int>(), b[1].get<int>()};
}

/// A compressed-tensors config group's "weights" scheme (`at` names the group), or throws naming it.
const json* group_weights(const json& g, const std::string& at, const std::string& what) {
  SSM_CHECK(g.is_object(), "{}: {} must be an object", what, at);
  const json* w = field(g, "weights");
  SSM_CHECK(w != nullptr && w->is_object(), "{}: {}.weights must be an object", what, at);
  return w;
}

/// quant_method "fp8": e4m3 weights, dynamic or static activation scales (neither applied), weight_block_size or one
/// scale per matrix.
Fp8Quantization parse_fp8(const json& q, const std::string& what) {
  if (const json* fmt = field(q, "fmt"))
    SSM_CHECK(fmt->is_string() && fmt->get<std::string>() == "e4m3",
              "{}: quantization_config.fmt {} is not supported (only \"e4m3\")", what, json_excerpt(*fmt));
  if (const json* a = field(q, "activation_scheme"))  // either way activations stay unquantized (input_scale unread)
    SSM_CHECK(a->is_string() && (a->get<std::string>() == "dynamic" || a->get<std::string>() == "static"),
              "{}: quantization_config.activation_scheme {} is not supported (\"dynamic\" or \"static\")", what,
              json_excerpt(*a));
  Fp8Quantization out;
  out.alt_scale_suffix = "_scale";
  if (const json* b = field(q, "weight_block_size"))
    std::tie(out.block_n, out.block_k) = block_size(*b, what, "quantization_config.weight_block_size");
  return out;
}

/// quant_method "compressed-tensors", format "float-quantized": every config group's weights 8-bit symmetric floats
/// with one strategy (tensor, channel or block); input activations, if quantized, 8-bit floats (not applied).
Fp8Quantization parse_compressed_tensors(const json& q, const std::string& what) {
  const json* format = field(q, "format");
  SSM_CHECK(format != nullptr && format->is_string() && format->get<std::string>() == "float-quantized",
            "{}: quantization_config.format {} is not supported (compressed-tensors checkpoints load in the "
            "\"float-quantized\" format, FP8 weights, and the \"pack-quantized\" one, int weights)", what,
            format ? json_excerpt(*format) : std::string("(missing)"));
  const json* groups = field(q, "config_groups");
  SSM_CHECK(groups != nullptr && groups->is_object() && !groups->empty(),
            "{}: quantization_config.config_groups must be a non-empty object of quantization schemes", what);
  Fp8Quantization out{"compressed-tensors", 0, 0, "_scale"};
  std::string strategy;
  for (const auto& [gname, g] : groups->items()) {
    const std::string at = "quantization_config.config_groups." + gname;
    const json* w = group_weights(g, at, what);
    const json* bits = field(*w, "num_bits");
    const json* type = field(*w, "type");
    SSM_CHECK(bits && bits->is_number_integer() && bits->get<int>() == 8 && type && type->is_string() &&
                  type->get<std::string>() == "float",
              "{}: {}.weights {{num_bits: {}, type: {}}} is not supported (only 8-bit \"float\" weights: FP8)", what, at,
              bits ? json_excerpt(*bits) : "?", type ? json_excerpt(*type) : "?");
    if (const json* sym = field(*w, "symmetric"))
      SSM_CHECK(sym->is_boolean() && sym->get<bool>(), "{}: {}.weights.symmetric must be true (FP8 weights have no zero point)", what, at);
    const json* st = field(*w, "strategy");
    SSM_CHECK(st && st->is_string(), "{}: {}.weights.strategy must be a string", what, at);
    const std::string s = st->get<std::string>();
    SSM_CHECK(s == "tensor" || s == "channel" || s == "block",
              "{}: {}.weights.strategy \"{}\" is not supported (tensor, channel or block)", what, at, text_excerpt(s));
    SSM_CHECK(strategy.empty() || strategy == s, "{}: config groups with different weight strategies (\"{}\" and \"{}\") "
              "are not supported", what, strategy, s);
    strategy = s;
    if (s == "channel") out.block_n = 1, out.block_k = 0;
    if (s == "block") {
      const json* b = field(*w, "block_structure");
      SSM_CHECK(b != nullptr, "{}: {}.weights.block_structure is required with strategy \"block\"", what, at);
      const auto [bn, bk] = block_size(*b, what, at + ".weights.block_structure");
      SSM_CHECK(out.block_n == 0 || (out.block_n == bn && out.block_k == bk),
                "{}: config groups with different block structures are not supported", what);
      out.block_n = bn, out.block_k = bk;
    }
    if (const json* a = field(g, "input_activations")) {
      const json* abits = a->is_object() ? field(*a, "num_bits") : nullptr;
      const json* atype = a->is_object() ? field(*a, "type") : nullptr;
      SSM_CHECK(abits && abits->is_number_integer() && abits->get<int>() == 8 && atype && atype->is_string() &&
                    atype->get<std::string>() == "float",
                "{}: {}.input_activations must be 8-bit floats or null (got {})", what, at, json_excerpt(*a));
    }
  }
  return out;
}

/// quant_method "modelopt", quant_algo "FP8": one weight_scale per matrix.
Fp8Quantization parse_modelopt(const json& q, const std::string& what) {
  const json* algo = field(q, "quant_algo");
  SSM_CHECK(algo != nullptr && algo->is_string() && algo->get<std::string>() == "FP8",
            "{}: quantization_config.quant_algo {} is not supported (modelopt checkpoints load with quant_algo \"FP8\")",
            what, algo ? json_excerpt(*algo) : std::string("(missing)"));
  return Fp8Quantization{"modelopt", 0, 0, "_scale"};
}

/// A positive integer field, or `fallback` when absent; throws naming it otherwise.
int int_field(const json& q, const char* key, int fallback, const std::string& what) {
  const json* v = field(q, key);
  if (v == nullptr) return fallback;
  SSM_CHECK(v->is_number_integer() && v->get<long long>() >= -1 && v->get<long long>() <= (1 << 24),
            "{}: quantization_config.{} must be an integer (got {})", what, key, json_excerpt(*v));
  return v->get<int>();
}

bool bool_field(const json& q, const char* key, bool fallback, const std::string& what) {
  const json* v = field(q, key);
  if (v == nullptr) return fallback;
  SSM_CHECK(v->is_boolean(), "{}: quantization_config.{} must be true or false (got {})", what, key, json_excerpt(*v));
  return v->get<bool>();
}

/// quantization_config.group_size: a positive integer, or -1 (one group over all input rows: 0 here).
int group_size_field(const json& q, const std::string& what) {
  const int g = int_field(q, "group_size", 128, what);
  SSM_CHECK(g == -1 || g >= 1, "{}: quantization_config.group_size must be a positive integer or -1 (got {})", what, g);
  return g == -1 ? 0 : g;
}

/// compressed-tensors "pack-quantized": every config group's weights the same int scheme (4 or 8 bits, group or
/// channel strategy, symmetric or not, act order or not); input activations unquantized (weight-only: WNA16).
IntQuantization parse_pack_quantized(const json& q, const std::string& what) {
  const json* groups = field(q, "config_groups");
  SSM_CHECK(groups != nullptr && groups->is_object() && !groups->empty(),
            "{}: quantization_config.config_groups must be a non-empty object of quantization schemes", what);
  IntQuantization out;
  out.method = "compressed-tensors";
  out.layout = IntQuantization::Layout::PackQuantized;
  out.zero_stored_minus_one = false;
  std::optional<std::string> scheme;
  for (const auto& [gname, g] : groups->items()) {
    const std::string at = "quantization_config.config_groups." + gname;
    const json* w = group_weights(g, at, what);
    const json* bits = field(*w, "num_bits");
    const json* type = field(*w, "type");
    SSM_CHECK(bits && bits->is_number_integer() && (bits->get<int>() == 4 || bits->get<int>() == 8) && type &&
                  type->is_string() && type->get<std::string>() == "int",
              "{}: {}.weights {{num_bits: {}, type: {}}} is not supported in the pack-quantized format (4- or 8-bit \"int\")",
              what, at, bits ? json_excerpt(*bits) : "?", type ? json_excerpt(*type) : "?");
    const json* st = field(*w, "strategy");
    SSM_CHECK(st && st->is_string() && (st->get<std::string>() == "group" || st->get<std::string>() == "channel"),
              "{}: {}.weights.strategy {} is not supported for int weights (group or channel)", what, at,
              st ? json_excerpt(*st) : std::string("(missing)"));
    int group = 0;
    if (st->get<std::string>() == "group") {
      const json* gs = field(*w, "group_size");
      SSM_CHECK(gs && gs->is_number_integer() && gs->get<long long>() >= 1 && gs->get<long long>() <= (1 << 24),
                "{}: {}.weights.group_size must be a positive integer with strategy \"group\"", what, at);
      group = gs->get<int>();
    }
    const bool sym = bool_field(*w, "symmetric", true, what);
    bool act_order = false;
    if (const json* a = field(*w, "actorder")) {
      SSM_CHECK(a->is_string() || a->is_boolean(), "{}: {}.weights.actorder must be a string or null", what, at);
      act_order = a->is_string() ? a->get<std::string>() == "group" : a->get<bool>();
    }
    if (const json* act = field(g, "input_activations"))
      fail("{}: {}.input_activations {} is not supported: int weights load weight-only (WNA16 schemes; W4A8 / W8A8 quantize "
           "activations too)", what, at, json_excerpt(*act));
    const std::string key = fmt::format("{}/{}/{}/{}", bits->get<int>(), group, sym, act_order);
    SSM_CHECK(!scheme || *scheme == key, "{}: config groups with different int weight schemes are not supported", what);
    scheme = key;
    out.bits = bits->get<int>(), out.group_size = group, out.has_zeros = !sym, out.desc_act = act_order;
  }
  return out;
}

}  // namespace

IntQuantization IntQuantization::for_module(const std::string& name) const {
  IntQuantization q = *this;
  q.dynamic.clear();
  const DynamicRule* found = nullptr;
  for (const DynamicRule& r : dynamic) {
    if (r.exclude || !std::regex_search(name, std::regex(r.pattern), std::regex_constants::match_continuous)) continue;
    SSM_CHECK(found == nullptr, "quantization_config.dynamic: module \"{}\" matches both \"{}\" and \"{}\"; ssmserve "
              "needs at most one override per module", name, found->pattern, r.pattern);
    found = &r;
  }
  if (found) {
    if (found->bits) q.bits = *found->bits;
    if (found->group_size) q.group_size = *found->group_size;
    if (found->desc_act) q.desc_act = *found->desc_act;
  }
  return q;
}

std::optional<IntQuantization> parse_int_quantization_config(const json& q, const std::string& what) {
  if (!q.is_object()) return std::nullopt;
  const json* m = field(q, "quant_method");
  if (m == nullptr || !m->is_string()) return std::nullopt;
  std::string method = m->get<std::string>();  // vLLM lower-cases it
  for (char& c : method) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  IntQuantization out;
  if (method == "gptq") {
    out.bits = int_field(q, "bits", 4, what);
    SSM_CHECK(out.bits == 2 || out.bits == 4 || out.bits == 8,
              "{}: quantization_config.bits {} is not supported for GPTQ (2, 4 or 8; 3-bit codes cross words)", what, out.bits);
    out.group_size = group_size_field(q, what);
    out.desc_act = bool_field(q, "desc_act", false, what);
    std::string format = "gptq";
    if (const json* f = field(q, "checkpoint_format")) {
      SSM_CHECK(f->is_string(), "{}: quantization_config.checkpoint_format must be a string (got {})", what, json_excerpt(*f));
      format = f->get<std::string>();
    }
    SSM_CHECK(format == "gptq" || format == "gptq_v2",
              "{}: quantization_config.checkpoint_format \"{}\" is not supported (gptq or gptq_v2; repack Marlin / BitBLAS "
              "checkpoints to gptq)", what, text_excerpt(format));
    out.zero_stored_minus_one = format == "gptq";
    if (const json* pd = field(q, "pack_dtype"))  // GPTQModel: the word the codes are packed in
      SSM_CHECK(pd->is_string() && pd->get<std::string>() == "int32",
                "{}: quantization_config.pack_dtype {} is not supported (int32 words only)", what, json_excerpt(*pd));
    if (const json* dyn = field(q, "dynamic")) {
      SSM_CHECK(dyn->is_object(), "{}: quantization_config.dynamic must be an object of module regexes", what);
      for (const auto& [key, v] : dyn->items()) {
        IntQuantization::DynamicRule rule;
        rule.exclude = key.rfind("-:", 0) == 0;
        rule.pattern = key.rfind("-:", 0) == 0 || key.rfind("+:", 0) == 0 ? key.substr(2) : key;
        const std::string at = "quantization_config.dynamic[\"" + text_excerpt(key) + "\"]";
        SSM_CHECK(v.is_object(), "{}: {} must be an object", what, at);
        try {
          (void)std::regex(rule.pattern);
        } catch (const std::regex_error& e) {
          fail("{}: {}: the regex does not compile ({})", what, at, e.what());
        }
        if (!rule.exclude) {
          if (field(v, "bits")) {
            rule.bits = int_field(v, "bits", 4, what);
            SSM_CHECK(*rule.bits == 2 || *rule.bits == 4 || *rule.bits == 8, "{}: {}.bits {} is not supported for GPTQ (2, 4 "
                      "or 8)", what, at, *rule.bits);
          }
          if (field(v, "group_size")) rule.group_size = group_size_field(v, what);
          if (field(v, "desc_act")) rule.desc_act = bool_field(v, "desc_act", false, what);
          for (const auto& [k2, v2] : v.items())
            SSM_CHECK(k2 == "bits" || k2 == "group_size" || k2 == "desc_act" || k2 == "sym",
                      "{}: {}.{} is not supported (bits, group_size, desc_act, sym)", what, at, text_excerpt(k2));
        }
        out.dynamic.push_back(std::move(rule));
      }
    }
    return out;
  }
  if (method == "awq") {
    out.method = "awq";
    out.bits = int_field(q, "bits", int_field(q, "w_bit", 4, what), what);
    SSM_CHECK(out.bits == 4, "{}: quantization_config.bits {} is not supported for AWQ (4 only)", what, out.bits);
    if (field(q, "group_size")) {
      out.group_size = group_size_field(q, what);
    } else {  // AutoAWQ's older spelling
      const int g = int_field(q, "q_group_size", 128, what);
      SSM_CHECK(g == -1 || g >= 1, "{}: quantization_config.q_group_size must be a positive integer or -1 (got {})", what, g);
      out.group_size = g == -1 ? 0 : g;
    }
    out.has_zeros = bool_field(q, "zero_point", true, what);
    std::string version = "gemm";
    if (const json* v = field(q, "version")) {
      SSM_CHECK(v->is_string(), "{}: quantization_config.version must be a string (got {})", what, json_excerpt(*v));
      version = v->get<std::string>();
      for (char& c : version) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    SSM_CHECK(version == "gemm", "{}: quantization_config.version \"{}\" is not supported (AWQ's GEMM layout only; the "
              "GEMV, Marlin and exllama layouts pack differently)", what, text_excerpt(version));
    out.layout = IntQuantization::Layout::Awq;
    out.zero_stored_minus_one = false;
    return out;
  }
  const json* format = field(q, "format");
  if (method == "compressed-tensors" && format != nullptr && format->is_string() && format->get<std::string>() == "pack-quantized")
    return parse_pack_quantized(q, what);
  return std::nullopt;
}

Fp8Quantization parse_quantization_config(const json& q, const std::string& what) {
  SSM_CHECK(q.is_object(), "{}: field \"quantization_config\" must be an object (got {})", what, json_excerpt(q));
  const json* m = field(q, "quant_method");
  SSM_CHECK(m != nullptr && m->is_string(), "{}: quantization_config has no string \"quant_method\" (got {})", what,
            m ? json_excerpt(*m) : std::string("none"));
  std::string method = m->get<std::string>();  // vLLM lower-cases it
  for (char& c : method) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (method == "fp8") return parse_fp8(q, what);
  if (method == "compressed-tensors") return parse_compressed_tensors(q, what);
  if (method == "modelopt") return parse_modelopt(q, what);
  fail("{}: field \"quantization_config\" (quant_method \"{}\") is not supported: ssmserve loads unquantized F32 / BF16 / "
       "F16 checkpoints, FP8 ones (quant_method \"fp8\", \"compressed-tensors\" float-quantized, \"modelopt\" FP8) and "
       "integer ones (\"gptq\", \"awq\", \"compressed-tensors\" pack-quantized)", what, text_excerpt(method));
}

}  // namespace ssmserve
