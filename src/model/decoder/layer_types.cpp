// Owns the parsing of per-layer block types in their transformers spellings (see layer_types.h).
#include "model/decoder/layer_types.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "config/hf_json.h"
#include "core/error.h"

namespace ssmserve {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

const std::map<std::string, std::string>& spellings() {
  static const std::map<std::string, std::string> m = {
      {"mamba", "mamba"},         {"mamba2", "mamba"},     {"m", "mamba"},
      {"attention", "attention"}, {"full_attention", "attention"}, {"attn", "attention"}, {"hybrid", "attention"},
      {"linear_attention", "linear_attention"}, {"linear", "linear_attention"},
      {"mlp", "mlp"},             {"dense", "mlp"},        {"moe", "moe"},
  };
  return m;
}

int int_field(const nlohmann::json& j, const char* field, int lo, int fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  SSM_CHECK(j[field].is_number_integer() && j[field].get<int64_t>() >= lo && j[field].get<int64_t>() < (1 << 20),
            "config.json: field \"{}\" must be an integer >= {} (got {})", field, lo, json_excerpt(j[field]));
  return j[field].get<int>();
}

bool has(const nlohmann::json& j, const char* field) { return j.contains(field) && !j[field].is_null(); }

}  // namespace

std::vector<std::string> canonical_layer_types(const nlohmann::json& list, int num_layers, const char* field) {
  SSM_CHECK(list.is_array() && static_cast<int>(list.size()) == num_layers,
            "config.json: \"{}\" must list {} layer types (num_hidden_layers)", field, num_layers);
  std::vector<std::string> out;
  for (const auto& t : list) {
    SSM_CHECK(t.is_string(), "config.json: \"{}\" entries must be strings (got {})", field, json_excerpt(t));
    auto it = spellings().find(lower(t.get<std::string>()));
    SSM_CHECK(it != spellings().end(), "config.json: \"{}\" entry {} is not a known layer type (mamba, attention, "
              "linear_attention, mlp, moe)", field, json_excerpt(t));
    out.push_back(it->second);
  }
  return out;
}

std::vector<std::string> read_layer_types(const nlohmann::json& j, int L, const std::string& fallback) {
  if (has(j, "layer_types")) return canonical_layer_types(j["layer_types"], L, "layer_types");
  if (has(j, "layers_block_type")) return canonical_layer_types(j["layers_block_type"], L, "layers_block_type");
  if (has(j, "hybrid_override_pattern")) {
    const auto& p = j["hybrid_override_pattern"];
    SSM_CHECK(p.is_string(), "config.json: \"hybrid_override_pattern\" must be a string such as \"M-M*-ME\"");
    std::vector<std::string> out;
    for (char c : p.get<std::string>()) {
      switch (c) {
        case 'M': out.push_back("mamba"); break;
        case '*': out.push_back("attention"); break;
        case '-': out.push_back("mlp"); break;
        case 'E': out.push_back("moe"); break;
        default:
          fail("config.json: \"hybrid_override_pattern\" character '{}' is not one of M (mamba), * (attention), "
               "- (MLP), E (MoE)", std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c) : "?");
      }
    }
    SSM_CHECK(static_cast<int>(out.size()) == L,
              "config.json: \"hybrid_override_pattern\" has {} characters, expected {} (num_hidden_layers)", out.size(), L);
    return out;
  }
  if (has(j, "attn_type_list")) {
    const auto& lt = j["attn_type_list"];
    SSM_CHECK(lt.is_array() && static_cast<int>(lt.size()) == L, "config.json: \"attn_type_list\" must list {} entries", L);
    std::vector<std::string> out;
    for (const auto& t : lt) {
      SSM_CHECK(t == 0 || t == 1, "config.json: attn_type_list entries must be 0 (linear) or 1 (softmax) (got {})", json_excerpt(t));
      out.push_back(t == 0 ? "linear_attention" : "attention");
    }
    return out;
  }
  std::vector<std::string> out(static_cast<size_t>(L), fallback);
  if (has(j, "attn_layer_indices")) {
    const auto& idx = j["attn_layer_indices"];
    SSM_CHECK(idx.is_array(), "config.json: \"attn_layer_indices\" must be a list of layer indices");
    for (const auto& i : idx) {
      SSM_CHECK(i.is_number_integer() && i.get<int64_t>() >= 0 && i.get<int64_t>() < L,
                "config.json: \"attn_layer_indices\" entry {} is not a layer index in [0, {})", json_excerpt(i), L);
      out[static_cast<size_t>(i.get<int>())] = "attention";
    }
    return out;
  }
  if (has(j, "attn_layer_period")) {
    const int period = int_field(j, "attn_layer_period", 1, 1), offset = int_field(j, "attn_layer_offset", 0, 0);
    SSM_CHECK(offset < period, "config.json: attn_layer_offset {} must be below attn_layer_period {}", offset, period);
    for (int l = 0; l < L; ++l)
      if (l % period == offset) out[static_cast<size_t>(l)] = "attention";
  }
  return out;
}

std::vector<bool> read_moe_layers(const nlohmann::json& j, int L) {
  const int experts = int_field(j, "num_experts", 0, 1), period = int_field(j, "expert_layer_period", 1, 1),
            offset = int_field(j, "expert_layer_offset", 0, 0);
  SSM_CHECK(offset < period, "config.json: expert_layer_offset {} must be below expert_layer_period {}", offset, period);
  std::vector<bool> out(static_cast<size_t>(L), false);
  for (int l = 0; l < L; ++l) out[static_cast<size_t>(l)] = experts > 1 && l % period == offset;
  return out;
}

}  // namespace ssmserve
