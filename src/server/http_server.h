// Owns the OpenAI-compatible HTTP server over the event-driven transport (http_transport.h): routes, request
// validation against the model, SSE streaming with backpressure, client-disconnect aborts and graceful draining.
#pragma once
#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "server/async_engine.h"
#include "chat/chat_template.h"
#include "engine/generation_defaults.h"
#include "server/metrics.h"
#include "server/cors.h"
#include "server/http_transport.h"
#include "server/protocol.h"
#include "server/chat_renderer.h"

namespace ssmserve::server {

class HttpServer;

/// Server settings (vLLM's `serve` flag names).
struct ServerOptions {
  /// vLLM's --host: every IPv4 interface by default, as vLLM binds; 127.0.0.1 keeps the server to this machine.
  std::string host = "0.0.0.0";
  int port = 8000;                     ///< 0 = any free port (see OpenAIServer::bind)
  std::string served_model_name;       ///< the id clients send as "model" (responses name it)
  /// vLLM's further --served-model-name values: ids a request's "model" may also be (/v1/models lists them all).
  std::vector<std::string> served_model_aliases;
  /// /v1/models' "root": the model as the command line gave it (vLLM's model path; a Hugging Face id stays the id);
  /// empty: the engine's model folder.
  std::string model_root;
  /// vLLM's --api-key (and VLLM_API_KEY): when any is set, every /v1 route needs "Authorization: Bearer <one of
  /// them>" (else 401 {"error": "Unauthorized"}); other routes (/health, /metrics, /tokenize, ...) and OPTIONS do not.
  std::vector<std::string> api_keys;
  /// vLLM's --disable-uvicorn-access-log: no `client - "METHOD path HTTP/x" status` line per response (info level).
  bool disable_access_log = false;
  int max_model_len = 0;               ///< prompt + max_tokens limit (resolved by the caller, > 0)
  int http_threads = 4;                ///< handler threads (parsing, tokenizing, chat templates)
  int io_threads = 2;                  ///< threads running every connection's I/O
  int max_connections = 16384;         ///< open connections (more: 503 and closed)
  size_t max_body_bytes = 32u << 20;   ///< larger request bodies (Content-Length or chunked) get 413
  double read_timeout_s = 60.0;        ///< a request's headers + body must arrive within it (else 408, closed)
  double header_timeout_s = 10.0;      ///< a request's line + headers must arrive within it (else 408, closed)
  double keep_alive_timeout_s = 5.0;   ///< idle connections are closed after it
  double write_timeout_s = 60.0;       ///< a client that reads nothing of its response for this long is dropped
  /// vLLM's --trust-request-chat-template: a chat request's own `chat_template` is rendered (a template costs CPU
  /// and memory up to the Jinja engine's bounds, so only when the operator trusts its clients); else such a
  /// request is a 400.
  bool trust_request_chat_template = false;
  /// vLLM's --enable-request-id-headers: every response carries X-Request-Id (the request's own, else a fresh id).
  bool enable_request_id_headers = false;
  /// vLLM's --seed (default 0, as vLLM's ModelConfig.seed): requests without their own seed get
  /// derived_request_seed(seed, k) for the k-th of them, so a server's sampled outputs repeat from run to run for the
  /// same sequence of requests; nullopt: unseeded requests draw from std::random_device.
  std::optional<uint64_t> seed = 0;
  /// vLLM's --default-chat-template-kwargs: template variables every chat request gets unless its own
  /// chat_template_kwargs set them (e.g. {"enable_thinking": false}); an object.
  nlohmann::ordered_json default_chat_template_kwargs = nlohmann::ordered_json::object();
  /// vLLM's --chat-template-content-format: how chat templates get message content (Auto: detected per template).
  ChatContentFormat chat_template_content_format = ChatContentFormat::Auto;
  /// vLLM's --max-logprobs: most logprobs / prompt_logprobs / top_logprobs a request may ask for (larger: 400).
  int max_logprobs = kMaxLogprobs;
  /// vLLM's --return-tokens-as-token-ids: logprobs name tokens "token_id:<id>" unless a request says otherwise.
  bool return_tokens_as_token_ids = false;
  /// vLLM's --enable-auto-tool-choice and --tool-call-parser: chat requests with tool_choice "auto" (the default
  /// with tools) get the calls the model writes parsed into `tool_calls` (make_tool_parser names the formats);
  /// without both, such a request is a 400, as vLLM.
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  /// vLLM's default sampling params (--generation-config, --override-generation-config): what a request's absent
  /// temperature / top_p / top_k / min_p / repetition_penalty become, and chat's max_tokens default and the cap on
  /// every request's max_tokens (GenerationDefaults::max_tokens_limit). Empty: vLLM's neutral defaults.
  GenerationDefaults generation_defaults;
  /// vLLM's --allowed-origins / --allowed-methods / --allowed-headers / --allow-credentials (cors.h): preflights
  /// answered, Access-Control-Allow-* headers on every response to a request with an Origin.
  CorsOptions cors;
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
  class GenerationProducer;
  /// Drain, method and body-framing checks on the headers, before a body is read; a response refuses.
  std::optional<HttpResponse> precheck(const HttpRequest& req) const;
  /// Routes a complete request (worker thread); every failure becomes an OpenAI error response.
  void handle(const std::shared_ptr<Exchange>& ex);
  /// The prompt text of a chat request: its own chat_template or the server's, with add_generation_prompt /
  /// continue_final_message. Throws ApiError 400 when the template fails.
  std::string render_chat(const ChatRequest& cr) const;
  /// A request's "model": absent, "" or one of the served names passes; else ApiError 404 (vLLM's message).
  void check_model(const std::optional<std::string>& model) const;
  /// Whether `req` may proceed under ServerOptions::api_keys (vLLM's AuthenticationMiddleware rule).
  bool authorized(const HttpRequest& req) const;
  HttpResponse tokenize(const std::string& body) const;
  HttpResponse detokenize(const std::string& body) const;
  /// Answers a generation request (completions or chat) whose body is `body`: validates, submits to the engine
  /// and hands the exchange a producer (whole JSON or SSE). `b`: the body parsed (null: parsed here from `body`).
  /// renderer: a chat request translated from POST /v1/responses or /v1/messages, answered in that API's shape.
  /// Throws ApiError.
  void generate(bool chat, const std::string& body, const std::shared_ptr<Exchange>& ex, const nlohmann::ordered_json* b = nullptr,
                std::shared_ptr<ChatRenderer> renderer = nullptr);
  /// POST /v1/responses (responses_api.h): the request translated into a chat request, then generate(). Throws
  /// ApiError naming the Responses field.
  void responses(const std::string& body, const std::shared_ptr<Exchange>& ex);
  /// POST /v1/messages (messages_api.h, Anthropic's Messages API): likewise. Throws ApiError naming the Messages field.
  void messages(const std::string& body, const std::shared_ptr<Exchange>& ex);
  /// POST /v1/messages/count_tokens (Anthropic's): {"input_tokens"} of the Messages request's rendered prompt, as
  /// /v1/messages would count it. Throws ApiError naming the Messages field.
  HttpResponse count_message_tokens(const std::string& body) const;
  AsyncEngine& engine_;
  Metrics& metrics_;
  ChatTemplate chat_template_;
  ServerOptions opt_;
  CorsPolicy cors_;
  std::unique_ptr<HttpTransport> transport_;
  std::shared_ptr<std::atomic<int>> inflight_ = std::make_shared<std::atomic<int>>(0);
  std::atomic<uint64_t> unseeded_requests_{0};  ///< requests given a seed derived from ServerOptions::seed so far
  std::atomic<bool> draining_{false};
  std::atomic<bool> force_stop_{false};  ///< drain timeout passed: running requests end now
};

}  // namespace ssmserve::server
