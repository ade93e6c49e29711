// Owns the JSON and SSE bodies every route of the OpenAI-compatible server answers with (http_server.cpp,
// generation_producer.cpp): a JSON response, an OpenAI error response, one SSE event.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "server/api_error.h"
#include "server/http_transport.h"

namespace ssmserve::server {

/// `j` as compact JSON text, invalid UTF-8 in its strings replaced (U+FFFD) rather than thrown on.
inline std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

/// A JSON response with `status`.
inline HttpResponse json_response(const nlohmann::ordered_json& j, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = dump(j);
  return r;
}

/// The OpenAI error response of `e` (503 adds Retry-After).
inline HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.body(), e.status);
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

/// The SSE text of one event.
inline std::string sse(const nlohmann::ordered_json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

}  // namespace ssmserve::server
