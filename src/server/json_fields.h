// Owns the small JSON field readers of the request translators (responses_api.cpp, messages_api.cpp): presence and
// typed string fields, with a 400 naming the field; their blank-text test; a chat usage's cached prompt tokens.
#pragma once
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <string>

#include "server/api_error.h"

namespace ssmserve::server {

/// Whether object `b` has field `k` and it is not null.
inline bool given(const nlohmann::ordered_json& b, const char* k) {
  const auto it = b.find(k);
  return it != b.end() && !it->is_null();
}

/// obj[key] as a string; ApiError 400 naming `where.key` when it is missing or not a string.
inline const std::string& string_field(const nlohmann::ordered_json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) bad_request(where + "." + key, fmt::format("{}.{} must be a string", where, key));
  return it->get_ref<const std::string&>();
}

/// A chat usage object's prompt_tokens_details.cached_tokens (0 when absent).
inline long long cached_prompt_tokens(const nlohmann::ordered_json& usage) {
  const auto d = usage.find("prompt_tokens_details");
  return d != usage.end() && d->is_object() ? d->value("cached_tokens", 0LL) : 0LL;
}

/// Whether `s` is empty or only ASCII whitespace (the separators a tool-call format writes between calls).
inline bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

}  // namespace ssmserve::server
