// Owns the small JSON accessors the request parsers share (protocol.cpp, structured_request.cpp): a field that is
// present and not null, and a value's JSON type name for error messages.
#pragma once
#include <nlohmann/json.hpp>

namespace ssmserve::server {

/// The JSON type of `v` as an error message names it: null, boolean, string, array, object, number (a float) or
/// integer.
inline const char* json_type_name(const nlohmann::ordered_json& v) {
  using t = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case t::null: return "null";
    case t::boolean: return "boolean";
    case t::string: return "string";
    case t::array: return "array";
    case t::object: return "object";
    case t::number_float: return "number";
    default: return "integer";
  }
}

/// The value of `key` in object `body` when present and not null (vLLM: an explicit null is the default), else
/// nullptr. `body` must be an object.
inline const nlohmann::ordered_json* present_field(const nlohmann::ordered_json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace ssmserve::server
