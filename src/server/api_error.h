// Owns ApiError: an HTTP error with an OpenAI-style body ({"error": {"message", "type", "param", "code"}}).
#pragma once
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace ssmserve::server {

/// The OpenAI API's error "type" for an HTTP status: "invalid_request_error" for every 4xx (bad body, unknown
/// model or route, wrong method, body too large), "server_error" for every 5xx (engine failure, overload,
/// shutdown).
inline const char* openai_error_type(int status) { return status >= 500 ? "server_error" : "invalid_request_error"; }

/// An error the server answers with `status` and the OpenAI error body; `param` names the request field at fault
/// (empty = null). The body's type follows openai_error_type(status).
struct ApiError : std::runtime_error {
  int status;
  std::string param;
  ApiError(int status_, std::string message, std::string param_ = {})
      : std::runtime_error(std::move(message)), status(status_), param(std::move(param_)) {}

  /// {"error": {"message", "type", "param", "code"}} (code = the HTTP status, as vLLM sends it).
  nlohmann::ordered_json body() const {
    return {{"error",
             {{"message", what()}, {"type", openai_error_type(status)},
              {"param", param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param)}, {"code", status}}}};
  }
};

/// 400 invalid_request_error naming `param`.
[[noreturn]] inline void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

}  // namespace ssmserve::server
