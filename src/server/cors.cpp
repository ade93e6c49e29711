// Owns the CORS rules (see cors.h).
#include "server/cors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace ssmserve::server {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool contains(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// A header value must not break the response head (CR / LF): a request's own value echoed back is checked here (the
/// HTTP parser refuses such requests before; this keeps the rule local).
bool header_safe(const std::string& v) { return v.find_first_of("\r\n") == std::string::npos; }

/// A configured entry is written into response heads: no control characters at all.
bool printable(const std::string& v) {
  return std::none_of(v.begin(), v.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

/// The example value of each flag's error message.
std::string example_of(const std::string& flag) {
  if (flag == "--allowed-methods") return R"('["GET", "POST"]')";
  if (flag == "--allowed-headers") return R"('["Authorization", "Content-Type"]')";
  return R"('["https://app.example", "http://localhost:3000"]')";
}

}  // namespace

std::vector<std::string> parse_cors_list(const std::string& value, const std::string& flag) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(value);
  } catch (const nlohmann::json::exception&) {
    throw Error(fmt::format("{} must be a JSON list of strings (e.g. {}), got '{}'", flag, example_of(flag),
                            value.substr(0, 200)));
  }
  SSM_CHECK(j.is_array(), "{} must be a JSON list of strings (e.g. {}), got {}", flag, example_of(flag),
            j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 200));
  std::vector<std::string> out;
  for (const auto& e : j) {
    SSM_CHECK(e.is_string(), "{} must list strings; {} is not one", flag,
              e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 200));
    const std::string s = e.get<std::string>();
    SSM_CHECK(!s.empty() && printable(s), "{} entries must be non-empty and hold no control characters", flag);
    out.push_back(s);
  }
  return out;
}

CorsPolicy::CorsPolicy(CorsOptions opt) : opt_(std::move(opt)) {
  all_origins_ = contains(opt_.allowed_origins, "*");
  all_headers_ = contains(opt_.allowed_headers, "*");
  methods_ = contains(opt_.allowed_methods, "*")
                 ? std::vector<std::string>{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY"}
                 : opt_.allowed_methods;
  // The CORS-safelisted request headers are always allowed (Fetch standard; Starlette lists them too).
  std::vector<std::string> named{"Accept", "Accept-Language", "Content-Language", "Content-Type"};
  for (const auto& h : opt_.allowed_headers)
    if (h != "*" && !contains(named, h)) named.push_back(h);
  std::sort(named.begin(), named.end());
  for (const auto& h : named) headers_lower_.push_back(lower(h));
  if (!all_headers_) allow_headers_value_ = join(named);
}

bool CorsPolicy::origin_allowed(const std::string& origin) const { return all_origins_ || contains(opt_.allowed_origins, origin); }

std::optional<HttpResponse> CorsPolicy::preflight(const HttpRequest& req) const {
  const auto origin = req.header("Origin");
  const auto method = req.header("Access-Control-Request-Method");
  if (req.method != "OPTIONS" || !origin || !method) return std::nullopt;
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  // A listed origin (or credentials) is answered with the origin itself.
  const bool explicit_origin = !all_origins_ || opt_.allow_credentials;
  std::vector<std::string> failures;
  r.headers.emplace_back(
      "Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers, Access-Control-Request-Private-Network");
  if (!explicit_origin) r.headers.emplace_back("Access-Control-Allow-Origin", "*");
  if (!origin_allowed(*origin)) failures.push_back("origin");
  else if (explicit_origin && header_safe(*origin)) r.headers.emplace_back("Access-Control-Allow-Origin", *origin);
  r.headers.emplace_back("Access-Control-Allow-Methods", join(methods_));
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  if (!contains(methods_, *method)) failures.push_back("method");
  const auto requested = req.header("Access-Control-Request-Headers");
  if (all_headers_) {
    // Any header: the requested list is mirrored back.
    if (requested && header_safe(*requested)) r.headers.emplace_back("Access-Control-Allow-Headers", *requested);
  } else {
    r.headers.emplace_back("Access-Control-Allow-Headers", allow_headers_value_);
    if (requested) {
      size_t from = 0;
      while (from <= requested->size()) {
        const size_t comma = std::min(requested->find(',', from), requested->size());
        const std::string h = lower(trim(requested->substr(from, comma - from)));
        if (!contains(headers_lower_, h)) {
          failures.push_back("headers");
          break;
        }
        from = comma + 1;
      }
    }
  }
  // Private Network Access: never allowed (vLLM does not set Starlette's allow_private_network).
  if (req.header("Access-Control-Request-Private-Network")) failures.push_back("private-network");
  if (opt_.allow_credentials) r.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  if (failures.empty()) {
    r.body = "OK";
  } else {
    r.status = 400;
    r.body = "Disallowed CORS " + join(failures);
  }
  return r;
}

void CorsPolicy::add_response_headers(const HttpRequest& req, std::vector<std::pair<std::string, std::string>>& headers) const {
  const auto origin = req.header("Origin");
  if (origin && req.method == "OPTIONS" && req.header("Access-Control-Request-Method")) return;  // a preflight
  // Every other response varies with Origin, with or without one. The origin itself instead of "*": for listed
  // origins, and for any origin when credentials are allowed (browsers refuse "*" on a credentialed request).
  headers.emplace_back("Vary", "Origin");
  if (!origin) return;
  const bool echo = header_safe(*origin) && (all_origins_ ? opt_.allow_credentials : origin_allowed(*origin));
  if (echo) headers.emplace_back("Access-Control-Allow-Origin", *origin);
  else if (all_origins_) headers.emplace_back("Access-Control-Allow-Origin", "*");
  if (opt_.allow_credentials) headers.emplace_back("Access-Control-Allow-Credentials", "true");
}

}  // namespace ssmserve::server
