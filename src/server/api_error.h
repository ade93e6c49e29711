// Owns ApiError: an HTTP error with an OpenAI-style body ({"error": {"message", "type", "param", "code"}}).
#pragma once
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace ssmserve::server {

/// An error the server answers with `status` and the OpenAI error body. `type` follows the OpenAI / vLLM names
/// (BadRequestError 400, NotFoundError 404, ServiceUnavailableError 503, InternalServerError 500); `param` names
/// the request field at fault (empty = null).
struct ApiError : std::runtime_error {
  int status;
  std::string type;
  std::string param;
  ApiError(int status_, std::string type_, std::string message, std::string param_ = {})
      : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)) {}

  /// {"error": {"message", "type", "param", "code"}} (code = the HTTP status, as vLLM sends it).
  nlohmann::json body() const {
    return {{"error",
             {{"message", what()}, {"type", type}, {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
              {"code", status}}}};
  }
};

/// 400 BadRequestError naming `param`.
[[noreturn]] inline void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, "BadRequestError", message, param);
}

}  // namespace ssmserve::server
