// Owns the HTTP routes of the OpenAI-compatible server (see http_server.h).
#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/version.h"
#include "server/http_connection.h"
#include "server/protocol.h"
#include "server/serving.h"

namespace ssmserve::server {

using nlohmann::json;

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(e.body()), "application/json");
}

long long unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Unique response / engine request ids: a random boot prefix and a counter.
std::string next_id(const char* prefix) {
  static const uint64_t boot = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}-{:016x}{:08x}", prefix, boot, counter.fetch_add(1));
}

/// Decrements the in-flight count when dropped, unless handed on (release()).
class InflightGuard {
 public:
  explicit InflightGuard(std::shared_ptr<std::atomic<int>> c) : c_(std::move(c)) { ++*c_; }
  ~InflightGuard() {
    if (c_) --*c_;
  }
  std::shared_ptr<std::atomic<int>> release() { return std::exchange(c_, nullptr); }

 private:
  std::shared_ptr<std::atomic<int>> c_;
};

/// The SSE text of one event.
std::string sse(const json& chunk) { return "data: " + dump(chunk) + "\n\n"; }

/// Writes what the engine produced for a streaming job since the last call as SSE chunks; ends the stream with
/// `data: [DONE]` once every choice finished, after an engine error (error event first), or when `stopping` (the
/// shutdown timeout passed: error event, [DONE]). Returns false when the client went away (checked while waiting,
/// so a disconnect during a long prefill is seen before the first token); the releaser then aborts.
bool provide(ResponseBuilder& builder, bool& opened, httplib::DataSink& sink, const std::atomic<bool>& stopping) {
  const GenerationJob& j = builder.job();
  auto write = [&sink](const std::string& s) { return sink.write(s.data(), s.size()); };
  // vLLM's continuous_usage_stats: every chunk also carries the usage so far (all choices).
  auto event = [&](json c) {
    if (j.continuous_usage) c["usage"] = builder.usage();
    return sse(c);
  };
  if (!opened) {
    for (const auto& c : builder.opening_chunks())
      if (!write(event(c))) return false;
  }
  opened = true;
  std::vector<OutputChannel::Item> items;
  std::string fatal;
  int fatal_status = 500;
  j.channel->pop_all(items, kPollInterval, &fatal, &fatal_status);
  for (const auto& it : items)
    for (const auto& c : builder.on_output(it.index, it.output))
      if (!write(event(c))) return false;
  if (builder.all_finished()) {
    std::string s;
    if (j.include_usage) s += sse(builder.usage_chunk());
    s += "data: [DONE]\n\n";
    if (!write(s)) return false;
    sink.done();
    return true;
  }
  if (!fatal.empty() || stopping) {
    const ApiError e = fatal.empty() ? ApiError(503, "the server is shutting down; the request was aborted")
                                     : ApiError(fatal_status, fatal);
    write(sse(e.body()) + "data: [DONE]\n\n");
    sink.done();
    return true;
  }
  if (items.empty()) {
    if (const Connection* conn = current_connection(); conn && conn->peer_closed()) return false;
  }
  return true;
}

/// Routes and their methods (HEAD is served by GET routes); other methods on them get 405 with Allow.
const std::vector<std::pair<std::string, std::string>>& known_routes() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {"/health", "GET"}, {"/version", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"},
      {"/tokenize", "POST"}, {"/detokenize", "POST"}, {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}};
  return r;
}

bool iequals(const std::string& a, const char* b) {
  return a.size() == std::strlen(b) && std::equal(a.begin(), a.end(), b, [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

/// A Content-Length value: 1-19 ASCII digits (no sign, spaces or lists), else nullopt.
std::optional<unsigned long long> parse_content_length(const std::string& v) {
  if (v.empty() || v.size() > 19) return std::nullopt;
  unsigned long long x = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    x = x * 10 + static_cast<unsigned>(c - '0');
  }
  return x;
}

}  // namespace

OpenAIServer::OpenAIServer(AsyncEngine& engine, Metrics& metrics, ChatTemplate chat_template, ServerOptions opt)
    : engine_(engine), metrics_(metrics), chat_template_(std::move(chat_template)), opt_(std::move(opt)),
      svr_(std::make_unique<HttpServer>(HttpTimeouts{opt_.read_timeout_s, 5.0})) {
  const int threads = opt_.http_threads;
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr_->set_payload_max_length(opt_.max_body_bytes);
  svr_->set_keep_alive_max_count(1000);
  install_routes();
}

OpenAIServer::~OpenAIServer() = default;

int OpenAIServer::bind() {
  int listen_fd = -1;
  svr_->set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));  // inherited by accepted sockets: no Nagle delay per SSE chunk
    listen_fd = sock;
  });
  int port = opt_.port;
  if (port == 0) {
    port = svr_->bind_to_any_port(opt_.host);
    SSM_CHECK(port > 0, "cannot bind {} to a free port", opt_.host);
  } else {
    SSM_CHECK(svr_->bind_to_port(opt_.host, port), "cannot listen on {}:{} (address in use or not available)", opt_.host, port);
  }
  // cpp-httplib listens with a backlog of 5; many clients connecting at once would wait for SYN retries.
  if (listen_fd >= 0) ::listen(listen_fd, 1024);
  opt_.port = port;
  return port;
}

void OpenAIServer::listen() { svr_->listen_after_bind(); }

void OpenAIServer::drain_and_stop(double timeout_s) {
  draining_ = true;  // from now on precheck() answers every request with 503
  svr_->set_closing(true);
  auto wait_until = [this](std::chrono::steady_clock::time_point deadline) {
    while (inflight_->load() > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(kPollInterval);
  };
  wait_until(std::chrono::steady_clock::now() +
             std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s)));
  if (inflight_->load() > 0) {
    spdlog::warn("shutdown: {} requests still running after {} s; aborting them", inflight_->load(), timeout_s);
    force_stop_ = true;  // streams end with an error event + [DONE], waiting handlers answer 503; all abort
    wait_until(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  }
  svr_->stop();
}

void OpenAIServer::precheck(const httplib::Request& req, httplib::Response& res) const {
  if (draining_ && req.path != "/metrics") throw ApiError(503, "the server is shutting down");
  // Message framing (RFC 9112 6.3): a request with both, or with several / malformed lengths, is a smuggling
  // vector; refuse it rather than guess which framing a proxy in front of us used.
  const size_t n_te = req.get_header_value_count("Transfer-Encoding"), n_cl = req.get_header_value_count("Content-Length");
  if (n_te > 0 && n_cl > 0) throw ApiError(400, "a request must not have both Transfer-Encoding and Content-Length");
  if (n_te > 1 || (n_te == 1 && !iequals(req.get_header_value("Transfer-Encoding"), "chunked")))
    throw ApiError(400, "only Transfer-Encoding: chunked is supported");
  if (n_cl > 1) throw ApiError(400, "a request must not have several Content-Length headers");
  std::optional<unsigned long long> length;
  if (n_cl == 1) {
    length = parse_content_length(req.get_header_value("Content-Length"));
    if (!length) throw ApiError(400, fmt::format("invalid Content-Length '{}'", req.get_header_value("Content-Length")));
    if (*length > opt_.max_body_bytes)
      throw ApiError(413, fmt::format("the request body has {} bytes; the limit is {} bytes", *length, opt_.max_body_bytes));
  }
  for (const auto& [path, method] : known_routes()) {
    if (path != req.path) continue;
    if (req.method == method || (method == "GET" && req.method == "HEAD")) break;
    res.set_header("Allow", method == "GET" ? "GET, HEAD" : method);
    throw ApiError(405, fmt::format("Method Not Allowed: {} {} (allowed: {})", req.method, req.path, method));
  }
  if (req.method == "POST") {
    if (n_te == 0 && n_cl == 0) throw ApiError(411, "a POST request needs a Content-Length header (or chunked encoding)");
    if (req.is_multipart_form_data()) throw ApiError(415, "multipart bodies are not supported; send a JSON body");
  }
}

template <class Reader>
std::string OpenAIServer::read_body(const httplib::Request&, const Reader& reader) const {
  std::string body;
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t len) {
    if (body.size() + len > opt_.max_body_bytes) {
      too_large = true;
      return false;
    }
    body.append(data, len);
    return true;
  });
  if (too_large || !ok) {
    if (Connection* conn = current_connection()) conn->close_after_response();  // the rest of the body is unread
    if (too_large) throw ApiError(413, fmt::format("the request body is larger than the limit of {} bytes", opt_.max_body_bytes));
    throw ApiError(400, "the request body could not be read (truncated, malformed chunked encoding, or too slow)");
  }
  return body;
}

std::string OpenAIServer::render_chat(const ChatRequest& cr) const {
  if (cr.chat_template && !opt_.trust_request_chat_template)
    bad_request("chat_template", "a request's own chat_template is rendered only when the server runs with "
                                 "--trust-request-chat-template");
  try {
    if (!cr.chat_template) return chat_template_.apply(cr.messages, cr.add_generation_prompt, cr.continue_final_message);
    // vLLM's per-request template, with the checkpoint's special-token strings.
    return ChatTemplate::from_source(*cr.chat_template, chat_template_.bos_token(), chat_template_.eos_token())
        .apply(cr.messages, cr.add_generation_prompt, cr.continue_final_message);
  } catch (const Error& e) {
    bad_request(cr.chat_template ? "chat_template" : "messages", fmt::format("cannot apply the chat template: {}", e.what()));
  }
}

void OpenAIServer::install_routes() {
  using httplib::Request;
  using httplib::Response;
  // Every handler runs inside this guard: nothing a client sends escapes as an exception.
  auto guarded = [](auto fn) {
    return [fn](const Request& req, Response& res) {
      try {
        fn(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, ApiError(400, e.what()));
      } catch (const std::bad_alloc&) {
        send_error(res, ApiError(500, "out of memory"));
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, e.what()));
      }
    };
  };
  // POST routes read their body through httplib's content reader: a chunked body is bounded like a sized one,
  // and a body is JSON whatever its Content-Type says (no form-urlencoded parsing or its 8 KiB cap).
  auto with_body = [this, guarded](auto fn) {
    return httplib::Server::HandlerWithContentReader(
        [this, guarded, fn](const Request& req, Response& res, const httplib::ContentReader& reader) {
          guarded([&](const Request& r, Response& out) { fn(read_body(r, reader), out); })(req, res);
        });
  };
  const std::string& name = opt_.served_model_name;
  auto check_model = [name](const std::optional<std::string>& model) {
    if (model && *model != name) throw ApiError(404, fmt::format("The model `{}` does not exist.", *model), "model");
  };

  // Framing, method and drain checks run before any body is read; a refused request's connection is closed.
  svr_->set_pre_routing_handler([this](const Request& req, Response& res) {
    try {
      precheck(req, res);
      return httplib::Server::HandlerResponse::Unhandled;
    } catch (const ApiError& e) {
      send_error(res, e);
      if (Connection* conn = current_connection()) conn->close_after_response();
      return httplib::Server::HandlerResponse::Handled;
    }
  });
  // A connection that ends after this response says so.
  svr_->set_post_routing_handler([](const Request&, Response& res) {
    if (const Connection* conn = current_connection(); conn && conn->closing() && !res.has_header("Connection"))
      res.set_header("Connection", "close");
  });

  svr_->Get("/health", [](const Request&, Response& res) { res.status = 200; });
  svr_->Get("/version", [](const Request&, Response& res) { res.set_content(dump({{"version", version()}}), "application/json"); });
  svr_->Get("/metrics", guarded([this](const Request&, Response& res) {
    res.set_content(metrics_.render(opt_.served_model_name), "text/plain; version=0.0.4; charset=utf-8");
  }));
  svr_->Get("/v1/models", guarded([this](const Request&, Response& res) {
    json model = {{"id", opt_.served_model_name}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "ssmserve"},
                  {"root", engine_.config().model.string()}, {"parent", nullptr}, {"max_model_len", opt_.max_model_len}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
  }));

  // Tokenization: {"prompt": str} or {"messages": [...], "add_generation_prompt": bool}.
  svr_->Post("/tokenize", with_body([this, check_model](const std::string& body, Response& res) {
    const auto b = parse_body(body);
    const Tokenizer* tok = engine_.tokenizer();
    if (!tok) throw ApiError(400, "the model has no tokenizer");
    std::string text;
    if (b.contains("messages")) {
      ChatRequest cr = parse_chat_request(b);
      check_model(cr.model);
      text = render_chat(cr);
    } else {
      if (b.contains("model") && !b["model"].is_null()) {
        if (!b["model"].is_string()) bad_request("model", "model must be a string");
        check_model(b["model"].get<std::string>());
      }
      if (!b.contains("prompt") || !b["prompt"].is_string()) bad_request("prompt", "prompt must be a string");
      text = b["prompt"].get<std::string>();
    }
    const std::vector<int> ids = tok->encode(text);
    json strs = json::array();
    if (b.value("return_token_strs", false) == true)
      for (int id : ids) strs.push_back(tok->id_to_token(id));
    res.set_content(dump({{"count", ids.size()}, {"max_model_len", opt_.max_model_len}, {"tokens", ids},
                          {"token_strs", strs.empty() ? json(nullptr) : strs}}),
                    "application/json");
  }));
  svr_->Post("/detokenize", with_body([this, check_model](const std::string& body, Response& res) {
    const auto b = parse_body(body);
    const Tokenizer* tok = engine_.tokenizer();
    if (!tok) throw ApiError(400, "the model has no tokenizer");
    if (b.contains("model") && !b["model"].is_null()) {
      if (!b["model"].is_string()) bad_request("model", "model must be a string");
      check_model(b["model"].get<std::string>());
    }
    if (!b.contains("tokens") || !b["tokens"].is_array()) bad_request("tokens", "tokens must be a list of integers");
    std::vector<int> ids;
    for (const auto& v : b["tokens"]) {
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= engine_.model_config().vocab_size)
        bad_request("tokens", fmt::format("tokens must be integers in [0, {})", engine_.model_config().vocab_size));
      ids.push_back(v.get<int>());
    }
    res.set_content(dump({{"prompt", tok->decode(ids)}}), "application/json");
  }));

  svr_->Post("/v1/completions", with_body([this](const std::string& body, Response& res) { generate(false, body, res); }));
  svr_->Post("/v1/chat/completions", with_body([this](const std::string& body, Response& res) { generate(true, body, res); }));

  // Unknown routes and httplib's own errors (400 on a malformed request line or headers, 408 for a client too
  // slow to send its request, 414 for a long URI) get an OpenAI body too.
  svr_->set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    int status = res.status;
    std::string msg;
    if (const Connection* conn = current_connection(); conn && conn->timed_out()) {
      status = 408;
      msg = "the request was not received in time";
    } else if (status == 404) {
      msg = fmt::format("Not Found: {} {}", req.method, req.path);
    } else if (status == 414) {
      msg = "the request URI is too long";
    } else if (status == 413) {
      msg = "the request body is too large";
    } else if (status < 500) {
      msg = "malformed HTTP request";
    } else {
      msg = "internal server error";
    }
    send_error(res, ApiError(status, msg));
    // A request httplib could not parse (or a timeout) leaves the stream at an unknown position: answer once and
    // close, instead of reading the rest as further requests (each another 400) on a kept-alive connection.
    if (status != 404 && status != 405) {
      if (Connection* conn = current_connection()) conn->close_after_response();
      res.set_header("Connection", "close");
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
}

namespace {
/// Aborts a job's engine requests when dropped before release() (a handler that throws or returns early).
struct AbortGuard {
  AsyncEngine& engine;
  const std::vector<std::string>& ids;
  bool armed = true;
  ~AbortGuard() {
    if (armed) engine.abort(ids);
  }
};
}  // namespace

void OpenAIServer::generate(bool chat, const std::string& body, httplib::Response& res) {
  InflightGuard inflight(inflight_);
  if (draining_) throw ApiError(503, "the server is shutting down");
  const auto b = parse_body(body);
  auto job = std::make_shared<GenerationJob>();
  job->chat = chat;
  job->id = next_id(chat ? "chatcmpl" : "cmpl");
  job->created = unix_now();
  job->model = opt_.served_model_name;
  job->tokenizer = engine_.tokenizer();
  const Tokenizer* tok = engine_.tokenizer();
  const int vocab = engine_.model_config().vocab_size;
  GenerationRequest base;
  std::vector<PromptInput> inputs;
  if (chat) {
    ChatRequest cr = parse_chat_request(b, opt_.max_logprobs);
    if (!tok) throw ApiError(400, "the model has no tokenizer; chat needs one");
    PromptInput in;
    in.text = render_chat(cr);  // ApiError 400 when the template fails
    inputs.push_back(std::move(in));
    if (cr.logprobs) job->logprobs = cr.top_logprobs;
    if (cr.echo && cr.messages.back().value("role", "") == "assistant")  // vLLM: only the response's own role
      job->chat_echo = cr.messages.back().value("content", "");
    base = cr;
  } else {
    CompletionRequest cr = parse_completion_request(b, opt_.max_logprobs);
    inputs = std::move(cr.prompts);
    job->echo = cr.echo;
    job->prompt_only = cr.prompt_only;
    job->logprobs = cr.params.logprobs;
    job->prompt_logprobs = cr.prompt_logprobs;
    base = cr;
  }
  if (base.model && *base.model != opt_.served_model_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist.", *base.model), "model");
  job->n = base.params.n;
  job->stream = base.stream;
  job->include_usage = base.include_usage;
  job->continuous_usage = base.include_usage && base.continuous_usage_stats;  // as vLLM: both
  // 1. Tokenize and check every prompt against the context.
  std::vector<ssmserve::Request> reqs;
  for (size_t p = 0; p < inputs.size(); ++p) {
    ReadyPrompt rp;
    if (inputs[p].is_tokens) {
      for (int id : inputs[p].token_ids)
        if (id >= vocab) bad_request("prompt", fmt::format("prompt token id {} is outside the vocabulary [0, {})", id, vocab));
      rp.token_ids = std::move(inputs[p].token_ids);
      if (tok) rp.text = tok->decode(rp.token_ids);
    } else {
      if (!tok) throw ApiError(400, "the model has no tokenizer; send token ids", "prompt");
      rp.text = std::move(inputs[p].text);
      rp.token_ids = tok->encode(rp.text);
    }
    const int len = static_cast<int>(rp.token_ids.size());
    if (len == 0) bad_request(chat ? "messages" : "prompt", "the prompt is empty");
    if (len >= opt_.max_model_len)
      bad_request(chat ? "messages" : "prompt",
                  fmt::format("This model's maximum context length is {} tokens. However, your request has {} input tokens. "
                              "Please reduce the length of the input messages.", opt_.max_model_len, len));
    SamplingParams sp = base.params;
    if (base.max_tokens_given) {
      if (static_cast<long long>(len) + sp.max_tokens > opt_.max_model_len)
        bad_request("max_tokens", fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                                              "tokens ({} in the input, {} in the completion). Please reduce the length of "
                                              "the input or the completion.",
                                              opt_.max_model_len, static_cast<long long>(len) + sp.max_tokens, len, sp.max_tokens));
    } else {
      sp.max_tokens = chat ? opt_.max_model_len - len : std::min(sp.max_tokens, opt_.max_model_len - len);
    }
    if (sp.min_tokens > sp.max_tokens)
      bad_request("min_tokens", fmt::format("min_tokens ({}) must be less than or equal to max_tokens ({})", sp.min_tokens, sp.max_tokens));
    // The engine scores the prompt once for both echo's logprobs and prompt_logprobs (each rendering takes its top-k).
    if (job->echo && job->logprobs) sp.prompt_logprobs = job->logprobs;
    if (job->prompt_logprobs) sp.prompt_logprobs = std::max(sp.prompt_logprobs.value_or(0), *job->prompt_logprobs);
    sp.n = 1;
    try {
      sp.validate(vocab);
    } catch (const Error& e) {
      bad_request(sp.logit_bias.empty() ? "" : "logit_bias", e.what());
    }
    for (int i = 0; i < base.params.n; ++i) {
      ssmserve::Request r;
      r.request_id = fmt::format("{}-{}-{}", job->id, p, i);
      r.prompt = rp.text;
      r.prompt_token_ids = rp.token_ids;
      r.params = sp;
      if (sp.seed) r.params.seed = *sp.seed + static_cast<uint64_t>(i);
      job->request_ids.push_back(r.request_id);
      reqs.push_back(std::move(r));
    }
    job->prompts.push_back(std::move(rp));
  }
  // 2. Hand the group to the engine thread; it accepts all or none.
  job->channel = engine_.submit(std::move(reqs));
  if (auto err = job->channel->wait_accepted()) throw ApiError(400, *err);
  auto builder = std::make_shared<ResponseBuilder>(job);
  // 3a. Not streaming: wait for the whole result before choosing the status, watching the connection (a client
  // that went away aborts its requests) and the shutdown timeout.
  if (!job->stream) {
    AbortGuard abort_on_exit{engine_, job->request_ids};
    Connection* conn = current_connection();
    std::vector<OutputChannel::Item> items;
    while (!builder->all_finished()) {
      std::string fatal;
      int fatal_status = 500;
      items.clear();
      job->channel->pop_all(items, kPollInterval, &fatal, &fatal_status);
      for (const auto& it : items) builder->on_output(it.index, it.output);
      if (builder->all_finished()) break;
      if (!fatal.empty()) throw ApiError(fatal_status, fatal);
      if (force_stop_) throw ApiError(503, "the server is shutting down; the request was aborted");
      if (conn && conn->peer_closed()) {
        spdlog::info("{}: the client disconnected; aborting", job->id);
        conn->close_after_response();
        return;  // the guard aborts; nothing can be delivered
      }
    }
    abort_on_exit.armed = false;
    res.set_content(dump(builder->final_response()), "application/json");
    return;
  }
  // 3b. Streaming: SSE chunks as outputs arrive. A client that goes away ends the provider: the releaser aborts.
  auto opened = std::make_shared<bool>(false);
  auto provider = [this, builder, opened](size_t, httplib::DataSink& sink) -> bool {
    try {
      return provide(*builder, *opened, sink, force_stop_);
    } catch (const std::exception& e) {  // never let an exception into httplib's connection thread
      spdlog::error("response to {} failed: {}", builder->job().id, e.what());
      return false;
    }
  };
  auto counter = inflight.release();
  auto releaser = [this, builder, counter](bool) {
    if (!builder->all_finished()) engine_.abort(builder->job().request_ids);
    --*counter;
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", provider, releaser);
}

}  // namespace ssmserve::server
