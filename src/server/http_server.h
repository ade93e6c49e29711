// Owns the OpenAI-compatible HTTP server (cpp-httplib, one thread per connection from a large pool): routes,
// request validation against the model, SSE streaming, client-disconnect aborts and graceful draining.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "server/async_engine.h"
#include "chat/chat_template.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace ssmserve::server {

class HttpServer;

/// Server settings (vLLM's `serve` flag names).
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                     ///< 0 = any free port (see OpenAIServer::bind)
  std::string served_model_name;       ///< the id clients send as "model"
  int max_model_len = 0;               ///< prompt + max_tokens limit (resolved by the caller, > 0)
  int http_threads = 256;              ///< connections served at once (each streaming client holds one)
  size_t max_body_bytes = 32u << 20;   ///< larger request bodies (Content-Length or chunked) get 413
  double read_timeout_s = 60.0;        ///< a request's headers + body must arrive within it (else 408, closed)
  /// vLLM's --trust-request-chat-template: a chat request's own `chat_template` is rendered (a template costs CPU
  /// and memory up to the Jinja engine's bounds, so only when the operator trusts its clients); else such a
  /// request is a 400.
  bool trust_request_chat_template = false;
  /// vLLM's --max-logprobs: most logprobs / prompt_logprobs / top_logprobs a request may ask for (larger: 400).
  int max_logprobs = kMaxLogprobs;
};

/// The HTTP front end: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET /v1/models,
/// /health, /metrics, /version. Every failure becomes an OpenAI error body; nothing a client sends throws out.
class OpenAIServer {
 public:
  OpenAIServer(AsyncEngine& engine, Metrics& metrics, ChatTemplate chat_template, ServerOptions opt);
  ~OpenAIServer();
  /// Binds host:port; returns the bound port. Throws Error when it cannot bind.
  int bind();
  /// Serves until stop(); returns then.
  void listen();
  /// Graceful stop: every new request gets 503 (Retry-After, OpenAI error body); in-flight ones may finish for
  /// up to `timeout_s` seconds; then the ones still running are aborted (streams end with an error event and
  /// `data: [DONE]`, non-streaming ones get 503), and the listener and connections are closed. Safe to call from
  /// any thread.
  void drain_and_stop(double timeout_s);
  int num_inflight() const { return inflight_->load(); }

 private:
  void install_routes();
  /// Framing, method and drain checks before httplib reads a body (pre-routing). Throws ApiError.
  void precheck(const httplib::Request& req, httplib::Response& res) const;
  /// Reads a POST body through httplib's content reader, at most opt_.max_body_bytes (413 beyond).
  template <class Reader>
  std::string read_body(const httplib::Request& req, const Reader& reader) const;
  /// The prompt text of a chat request: its own chat_template or the server's, with add_generation_prompt /
  /// continue_final_message. Throws ApiError 400 when the template fails.
  std::string render_chat(const ChatRequest& cr) const;
  /// Answers a generation request (completions or chat) whose body is `body`.
  void generate(bool chat, const std::string& body, httplib::Response& res);
  AsyncEngine& engine_;
  Metrics& metrics_;
  ChatTemplate chat_template_;
  ServerOptions opt_;
  std::unique_ptr<HttpServer> svr_;
  std::shared_ptr<std::atomic<int>> inflight_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<bool> draining_{false};
  std::atomic<bool> force_stop_{false};  ///< drain timeout passed: running requests end now
};

}  // namespace ssmserve::server
