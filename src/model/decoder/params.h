// Owns the typed readers of module hyperparameters from config.json (or an architecture's mapped fields): each
// names the field in its error.
#pragma once
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace ssmserve {

/// j[field] as an integer in [1, 2^24); `fallback` when absent or null (fallback <= 0: required). Throws Error
/// naming the field when it is missing (and required), not an integer or out of range.
int param_int(const nlohmann::json& j, const char* field, int fallback);
/// The first of `names` present as a finite number, else `fallback`. Throws Error naming a non-numeric field.
float param_float(const nlohmann::json& j, std::initializer_list<const char*> names, float fallback);
/// A config.json number `v` (plain, or transformers 5.x's {"__float__": "..."}) of field `field`. Throws Error
/// "config.json: field ... must be a number" otherwise.
double config_float(const nlohmann::json& v, const std::string& field);
/// j[field] as a boolean, `fallback` when absent or null. Throws Error naming the field when it is not a boolean.
bool param_bool(const nlohmann::json& j, const char* field, bool fallback);
/// j[field] as a string, `fallback` when absent or null. Throws Error naming the field when it is not a string.
std::string param_string(const nlohmann::json& j, const char* field, const std::string& fallback);
/// rope_theta from `rope_parameters.rope_theta` or `rope_theta` (default `fallback`); only rope_type "default".
/// Throws Error naming the field on another rope type (in rope_parameters or transformers 4.x's rope_scaling, either
/// spelt rope_type or type), a rope object that is not a JSON object, or a non-positive theta.
double param_rope_theta(const nlohmann::json& j, double fallback);

}  // namespace ssmserve
