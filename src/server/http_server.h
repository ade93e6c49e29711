// Owns the OpenAI-compatible HTTP server (cpp-httplib, one thread per connection from a large pool): routes,
// request validation against the model, SSE streaming, client-disconnect aborts and graceful draining.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "server/async_engine.h"
#include "server/chat_template.h"
#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace ssmserve::server {

/// Server settings (vLLM's `serve` flag names).
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                     ///< 0 = any free port (see OpenAIServer::bind)
  std::string served_model_name;       ///< the id clients send as "model"
  int max_model_len = 0;               ///< prompt + max_tokens limit (resolved by the caller, > 0)
  int http_threads = 256;              ///< connections served at once (each streaming client holds one)
  size_t max_body_bytes = 32u << 20;   ///< larger request bodies get 413
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
  /// Graceful stop: new generation requests get 503, in-flight ones may finish for up to `timeout_s` seconds,
  /// then the listener and open connections are closed. Safe to call from any thread.
  void drain_and_stop(double timeout_s);
  int num_inflight() const { return inflight_->load(); }

 private:
  void install_routes();
  AsyncEngine& engine_;
  Metrics& metrics_;
  ChatTemplate chat_template_;
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> svr_;
  std::shared_ptr<std::atomic<int>> inflight_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<bool> draining_{false};
};

}  // namespace ssmserve::server
