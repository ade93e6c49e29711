// Owns the module hyperparameter readers (see params.h).
#include "model/decoder/params.h"

#include <cmath>
#include <string_view>

#include "config/hf_json.h"
#include "core/error.h"

namespace ssmserve {

int param_int(const nlohmann::json& j, const char* field, int fallback) {
  if (!j.contains(field) || j[field].is_null()) {
    SSM_CHECK(fallback > 0, "config.json: field \"{}\" is missing", field);
    return fallback;
  }
  SSM_CHECK(j[field].is_number_integer() && j[field].get<int64_t>() > 0 && j[field].get<int64_t>() < (1 << 24),
            "config.json: field \"{}\" must be a positive integer (got {})", field, json_excerpt(j[field]));
  return j[field].get<int>();
}

double config_float(const nlohmann::json& v, const std::string& field) {
  try {
    return json_float(v, field);
  } catch (const Error& e) {
    fail("config.json: {}", e.what());
  }
}

float param_float(const nlohmann::json& j, std::initializer_list<const char*> names, float fallback) {
  for (const char* n : names)
    if (j.contains(n) && !j[n].is_null()) {
      const double v = config_float(j[n], n);
      SSM_CHECK(std::isfinite(v), "config.json: field \"{}\" must be a finite number", n);
      return static_cast<float>(v);
    }
  return fallback;
}

bool param_bool(const nlohmann::json& j, const char* field, bool fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  SSM_CHECK(j[field].is_boolean(), "config.json: field \"{}\" must be true or false", field);
  return j[field].get<bool>();
}

std::string param_string(const nlohmann::json& j, const char* field, const std::string& fallback) {
  if (!j.contains(field) || j[field].is_null()) return fallback;
  SSM_CHECK(j[field].is_string(), "config.json: field \"{}\" must be a string (got {})", field, json_excerpt(j[field]));
  return j[field].get<std::string>();
}

namespace {

/// Checks that rope object `field` (rope_parameters, or transformers 4.x's rope_scaling) asks for plain RoPE: its
/// rope_type (or the older spelling "type") absent, null or "default" ("mrope" too for rope_scaling: transformers
/// reads Qwen2-VL's {"type": "mrope"} as "default"). Returns the object, or nullptr when the field is absent or null.
const nlohmann::json* plain_rope_object(const nlohmann::json& j, const char* field) {
  if (!j.contains(field) || j[field].is_null()) return nullptr;
  const nlohmann::json& o = j[field];
  SSM_CHECK(o.is_object(), "config.json: field \"{}\" must be an object (got {})", field, json_excerpt(o));
  const bool scaling = std::string_view(field) == "rope_scaling";
  for (const char* key : {"rope_type", "type"}) {
    if (!o.contains(key) || o[key].is_null()) continue;
    const bool plain = o[key] == "default" || (scaling && o[key] == "mrope");
    SSM_CHECK(plain, "config.json: {}.{} {} is not supported (only \"default\"; RoPE scaling such as YaRN is not implemented)",
              field, key, json_excerpt(o[key]));
  }
  return &o;
}

}  // namespace

double param_rope_theta(const nlohmann::json& j, double fallback) {
  const nlohmann::json* rp = plain_rope_object(j, "rope_parameters");
  // transformers 4.x configs (Qwen3-Next, Bamba, Falcon-H1 as published) spell the scaling "rope_scaling"; transformers
  // 5.x folds it into rope_parameters. Ignoring a YaRN / linear / dynamic entry would silently change the model.
  (void)plain_rope_object(j, "rope_scaling");
  double theta = fallback;
  if (rp && rp->contains("rope_theta")) theta = config_float((*rp)["rope_theta"], "rope_parameters.rope_theta");
  else if (j.contains("rope_theta") && !j["rope_theta"].is_null()) theta = config_float(j["rope_theta"], "rope_theta");
  SSM_CHECK(std::isfinite(theta) && theta > 0, "config.json: rope_theta must be a positive number");
  return theta;
}

}  // namespace ssmserve
