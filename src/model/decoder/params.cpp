// Owns the module hyperparameter readers (see params.h).
#include "model/decoder/params.h"

#include <cmath>

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

float param_float(const nlohmann::json& j, std::initializer_list<const char*> names, float fallback) {
  for (const char* n : names)
    if (j.contains(n) && !j[n].is_null()) {
      const double v = json_float(j[n], n);
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

double param_rope_theta(const nlohmann::json& j, double fallback) {
  const bool has_rp = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  SSM_CHECK(!has_rp || j["rope_parameters"].is_object(), "config.json: field \"rope_parameters\" must be an object (got {})",
            json_excerpt(j["rope_parameters"]));
  const nlohmann::json* rp = has_rp ? &j["rope_parameters"] : nullptr;
  if (rp && rp->contains("rope_type") && !(*rp)["rope_type"].is_null())
    SSM_CHECK((*rp)["rope_type"] == "default", "config.json: rope_type {} is not supported (only \"default\")",
              json_excerpt((*rp)["rope_type"]));
  double theta = fallback;
  if (rp && rp->contains("rope_theta")) theta = json_float((*rp)["rope_theta"], "rope_parameters.rope_theta");
  else if (j.contains("rope_theta") && !j["rope_theta"].is_null()) theta = json_float(j["rope_theta"], "rope_theta");
  SSM_CHECK(std::isfinite(theta) && theta > 0, "config.json: rope_theta must be a positive number");
  return theta;
}

}  // namespace ssmserve
