// Owns the HTTP routes of the OpenAI-compatible server (see http_server.h).
#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/version.h"
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

/// Writes what the engine produced for a generation job since the last call: SSE chunks (stream) or, once every
/// choice finished, the whole JSON body. Returns false when the client went away (httplib then ends the response).
bool provide(ResponseBuilder& builder, bool& opened, httplib::DataSink& sink) {
  const GenerationJob& j = builder.job();
  auto write = [&sink](const json& chunk) {
    const std::string s = "data: " + dump(chunk) + "\n\n";
    return sink.write(s.data(), s.size());
  };
  if (j.stream && !opened) {
    for (const auto& c : builder.opening_chunks())
      if (!write(c)) return false;
  }
  opened = true;
  std::vector<OutputChannel::Item> items;
  std::string fatal;
  j.channel->pop_all(items, kPollInterval, &fatal);
  for (const auto& it : items)
    for (const auto& c : builder.on_output(it.index, it.output))
      if (!write(c)) return false;
  if (!fatal.empty()) {
    const ApiError e(500, "InternalServerError", fatal);
    if (j.stream) {
      const std::string s = "data: " + dump(e.body()) + "\n\ndata: [DONE]\n\n";
      sink.write(s.data(), s.size());
    } else {
      const std::string s = dump(e.body());
      sink.write(s.data(), s.size());
    }
    sink.done();
    return true;
  }
  if (builder.all_finished()) {
    std::string s;
    if (j.stream) {
      if (j.include_usage) s += "data: " + dump(builder.usage_chunk()) + "\n\n";
      s += "data: [DONE]\n\n";
    } else {
      s = dump(builder.final_response());
    }
    if (!sink.write(s.data(), s.size())) return false;
    sink.done();
  }
  return true;
}

}  // namespace

OpenAIServer::OpenAIServer(AsyncEngine& engine, Metrics& metrics, ChatTemplate chat_template, ServerOptions opt)
    : engine_(engine), metrics_(metrics), chat_template_(std::move(chat_template)), opt_(std::move(opt)),
      svr_(std::make_unique<httplib::Server>()) {
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
  draining_ = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (inflight_->load() > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(kPollInterval);
  if (inflight_->load() > 0) spdlog::warn("shutdown: {} requests still running after {} s; closing them", inflight_->load(), timeout_s);
  svr_->stop();
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
        send_error(res, ApiError(400, "BadRequestError", e.what()));
      } catch (const std::bad_alloc&) {
        send_error(res, ApiError(500, "InternalServerError", "out of memory"));
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, "InternalServerError", e.what()));
      }
    };
  };
  const std::string& name = opt_.served_model_name;
  auto check_model = [name](const std::optional<std::string>& model) {
    if (model && *model != name)
      throw ApiError(404, "NotFoundError", fmt::format("The model `{}` does not exist.", *model), "model");
  };

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
  svr_->Post("/tokenize", guarded([this, check_model](const Request& req, Response& res) {
    const auto b = parse_body(req.body);
    const Tokenizer* tok = engine_.tokenizer();
    if (!tok) throw ApiError(400, "BadRequestError", "the model has no tokenizer");
    std::string text;
    if (b.contains("messages")) {
      ChatRequest cr = parse_chat_request(b);
      check_model(cr.model);
      text = chat_template_.apply(cr.messages, cr.add_generation_prompt);
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
  svr_->Post("/detokenize", guarded([this, check_model](const Request& req, Response& res) {
    const auto b = parse_body(req.body);
    const Tokenizer* tok = engine_.tokenizer();
    if (!tok) throw ApiError(400, "BadRequestError", "the model has no tokenizer");
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

  // Generation.
  auto generation = [this, check_model](bool chat) {
    return [this, check_model, chat](const Request& req, Response& res) {
      InflightGuard inflight(inflight_);
      if (draining_) throw ApiError(503, "ServiceUnavailableError", "the server is shutting down");
      const auto b = parse_body(req.body);
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
        ChatRequest cr = parse_chat_request(b);
        if (!tok) throw ApiError(400, "BadRequestError", "the model has no tokenizer; chat needs one");
        PromptInput in;
        try {
          in.text = chat_template_.apply(cr.messages, cr.add_generation_prompt);
        } catch (const Error& e) {
          bad_request("messages", fmt::format("cannot apply the chat template: {}", e.what()));
        }
        inputs.push_back(std::move(in));
        if (cr.logprobs) job->logprobs = cr.top_logprobs;
        base = cr;
      } else {
        CompletionRequest cr = parse_completion_request(b);
        inputs = std::move(cr.prompts);
        job->echo = cr.echo;
        job->logprobs = cr.params.logprobs;
        base = cr;
      }
      check_model(base.model);
      job->n = base.params.n;
      job->stream = base.stream;
      job->include_usage = base.include_usage;
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
          if (!tok) throw ApiError(400, "BadRequestError", "the model has no tokenizer; send token ids", "prompt");
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
        sp.min_tokens = std::min(sp.min_tokens, sp.max_tokens);
        if (job->echo && job->logprobs && !job->stream) sp.prompt_logprobs = job->logprobs;
        sp.n = 1;
        try {
          sp.validate(vocab);
        } catch (const Error& e) {
          bad_request("", e.what());
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
      if (auto err = job->channel->wait_accepted()) throw ApiError(400, "BadRequestError", *err);
      // 3. Respond as outputs arrive. A client that goes away makes a write fail: the releaser aborts.
      auto builder = std::make_shared<ResponseBuilder>(job);
      auto opened = std::make_shared<bool>(false);
      auto provider = [builder, opened](size_t, httplib::DataSink& sink) -> bool {
        try {
          return provide(*builder, *opened, sink);
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
      if (job->stream) {
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", provider, releaser);
      } else {
        res.set_chunked_content_provider("application/json", provider, releaser);
      }
    };
  };
  svr_->Post("/v1/completions", guarded(generation(false)));
  svr_->Post("/v1/chat/completions", guarded(generation(true)));

  // Unknown routes and httplib's own errors (413, 400 on a malformed request line) get an OpenAI body too.
  svr_->set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const int status = res.status;
    const char* type = status == 404 ? "NotFoundError" : status == 413 ? "RequestTooLarge" : status >= 500 ? "InternalServerError" : "BadRequestError";
    const std::string msg = status == 404 ? fmt::format("Not Found: {} {}", req.method, req.path) : fmt::format("HTTP {}", status);
    send_error(res, ApiError(status, type, msg));
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));
}

}  // namespace ssmserve::server
