// Owns the server's cross-origin resource sharing (CORS) rules: vLLM's --allowed-origins, --allowed-methods,
// --allowed-headers and --allow-credentials, answered as the Starlette CORSMiddleware that vLLM installs answers
// them (Starlette 1.10, what a fresh vLLM install resolves to; the Fetch standard's preflight and response headers).
// Nothing here knows about routes or the engine.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/http_transport.h"

namespace ssmserve::server {

/// vLLM's CORS flags, with its defaults: any origin, any method, any header, no credentials.
struct CorsOptions {
  std::vector<std::string> allowed_origins{"*"};  ///< --allowed-origins: origins ("https://host:port") or "*"
  std::vector<std::string> allowed_methods{"*"};  ///< --allowed-methods: methods ("GET", "POST") or "*"
  std::vector<std::string> allowed_headers{"*"};  ///< --allowed-headers: request header names or "*"
  bool allow_credentials = false;                 ///< --allow-credentials: cookies / Authorization across origins
};

/// Parses a vLLM CORS flag's value, a JSON list of strings (`'["https://a.example", "https://b.example"]'`; vLLM
/// reads it with json.loads). Errors: Error naming `flag` when the value is not such a list, or an entry is empty
/// or holds a control character.
std::vector<std::string> parse_cors_list(const std::string& value, const std::string& flag);

/// The CORS rules of one server; thread-safe after construction (read-only).
class CorsPolicy {
 public:
  explicit CorsPolicy(CorsOptions opt);

  /// A preflight request (OPTIONS with Origin and Access-Control-Request-Method headers): its whole response, 200
  /// "OK" with the Access-Control-Allow-* headers when origin, method and requested headers are allowed, else 400
  /// "Disallowed CORS origin, method, headers, private-network" (those that are not; a Private Network Access
  /// request never is). Any other request: nullopt.
  std::optional<HttpResponse> preflight(const HttpRequest& req) const;

  /// The headers to add to the response to `req` (any request but a preflight): "Vary: Origin", and with an Origin
  /// header Access-Control-Allow-Origin ("*", or the origin itself when only listed origins are allowed or
  /// credentials are) and Access-Control-Allow-Credentials.
  void add_response_headers(const HttpRequest& req, std::vector<std::pair<std::string, std::string>>& headers) const;

 private:
  bool origin_allowed(const std::string& origin) const;

  CorsOptions opt_;
  bool all_origins_ = false, all_headers_ = false;
  std::vector<std::string> methods_;        // allowed methods ("*" expanded)
  std::vector<std::string> headers_lower_;  // allowed request headers, lower case, with the CORS-safelisted ones
  std::string allow_headers_value_;         // their Access-Control-Allow-Headers value (without "*")
};

}  // namespace ssmserve::server
