// Owns the HTTP routes of the OpenAI-compatible server (see http_server.h).
#include "server/http_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/version.h"
#include "engine/bad_words.h"
#include "engine/reasoning.h"
#include "engine/sampler.h"
#include "server/generation_producer.h"
#include "server/http_responses.h"
#include "server/messages_api.h"
#include "server/protocol.h"
#include "server/responses_api.h"
#include "server/serving.h"
#include "server/structured_request.h"

namespace ssmserve::server {

using json = nlohmann::ordered_json;

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(50);

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

/// Routes and their methods (HEAD is served by GET routes); other methods on them get 405 with Allow.
const std::vector<std::pair<std::string, std::string>>& known_routes() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {"/health", "GET"}, {"/version", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"}, {"/ping", "GET"},
      {"/ping", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"}, {"/v1/completions", "POST"},
      {"/v1/chat/completions", "POST"}, {"/v1/responses", "POST"}, {"/v1/messages", "POST"},
      {"/v1/messages/count_tokens", "POST"}, {"/invocations", "POST"}};
  return r;
}

/// vLLM's --default-chat-template-kwargs: each default the request's chat_template_kwargs leave unset.
void add_default_chat_template_kwargs(ChatRequest& cr, const ServerOptions& opt) {
  if (opt.default_chat_template_kwargs.empty()) return;
  if (!cr.chat_template_kwargs.is_object()) cr.chat_template_kwargs = json::object();
  for (const auto& [k, v] : opt.default_chat_template_kwargs.items())
    if (!cr.chat_template_kwargs.contains(k)) cr.chat_template_kwargs[k] = v;
}

/// `e` naming `field` instead of its chat field (e.param), in its param and its message.
ApiError respelt(const ApiError& e, const std::string& field) {
  std::string msg = e.what();
  if (!e.param.empty() && field != e.param)
    for (size_t at = msg.find(e.param); at != std::string::npos; at = msg.find(e.param, at + field.size()))
      msg.replace(at, e.param.size(), field);
  return ApiError(e.status, std::move(msg), field);
}

bool starts_with_ci(const std::string& s, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return s.size() >= n && std::equal(prefix, prefix + n, s.begin(), [](char a, char b) { return std::tolower(a) == std::tolower(b); });
}

}  // namespace

OpenAIServer::OpenAIServer(AsyncEngine& engine, Metrics& metrics, ChatTemplate chat_template, ServerOptions opt)
    : engine_(engine), metrics_(metrics), chat_template_(std::move(chat_template)), opt_(std::move(opt)), cors_(opt_.cors) {
  HttpLimits lim;
  lim.max_connections = opt_.max_connections;
  lim.max_body_bytes = opt_.max_body_bytes;
  lim.header_timeout_s = opt_.header_timeout_s;
  lim.read_timeout_s = opt_.read_timeout_s;
  lim.keep_alive_timeout_s = opt_.keep_alive_timeout_s;
  lim.write_timeout_s = opt_.write_timeout_s;
  lim.io_threads = opt_.io_threads;
  lim.worker_threads = opt_.http_threads;
  lim.access_log = !opt_.disable_access_log;
  transport_ = std::make_unique<HttpTransport>(
      lim, [this](const HttpRequest& r) { return precheck(r); }, [this](const std::shared_ptr<Exchange>& ex) { handle(ex); },
      [](int status, const std::string& msg) { return error_response(ApiError(status, msg)); },
      [this](const HttpRequest& r, std::vector<std::pair<std::string, std::string>>& headers) {
        cors_.add_response_headers(r, headers);
        // vLLM's --enable-request-id-headers: the request's X-Request-Id echoed, else a fresh id.
        if (opt_.enable_request_id_headers) {
          const auto id = r.header("X-Request-Id");
          headers.emplace_back("X-Request-Id", id && !id->empty() ? *id : next_id("req").substr(4));
        }
      });
}

OpenAIServer::~OpenAIServer() = default;

int OpenAIServer::bind() {
  opt_.port = transport_->bind(opt_.host, opt_.port);
  return opt_.port;
}

void OpenAIServer::listen() { transport_->run(); }

void OpenAIServer::drain_and_stop(double timeout_s) {
  draining_ = true;  // from now on precheck() answers every request with 503
  transport_->set_draining(true);
  auto wait_until = [this](std::chrono::steady_clock::time_point deadline) {
    while (inflight_->load() > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(kPollInterval);
  };
  wait_until(std::chrono::steady_clock::now() +
             std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s)));
  if (inflight_->load() > 0) {
    spdlog::warn("shutdown: {} requests still running after {} s; aborting them", inflight_->load(), timeout_s);
    force_stop_ = true;  // producers end streams with an error event + [DONE] and answer waiting requests 503
    wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(600));
  }
  transport_->stop();  // closes every connection, whatever its state
}

std::optional<HttpResponse> OpenAIServer::precheck(const HttpRequest& req) const {
  try {
    if (draining_ && req.path != "/metrics") throw ApiError(503, "the server is shutting down");
    // A CORS preflight, whatever the path (vLLM's CORSMiddleware answers it before routing and authentication).
    if (std::optional<HttpResponse> p = cors_.preflight(req)) return p;
    // The API key first, before any body is read and whatever the method (vLLM's middleware runs before routing).
    if (!authorized(req)) {
      HttpResponse r;
      r.status = 401;
      r.content_type = "application/json";
      r.body = R"({"error":"Unauthorized"})";  // vLLM's AuthenticationMiddleware body
      // Its body is not read: a request that has one ends the connection.
      r.close = req.header_count("Transfer-Encoding") > 0 || req.header("Content-Length").value_or("0") != "0";
      return r;
    }
    std::string allowed;  // the methods of a known path, when the request's is not one of them
    for (const auto& [path, method] : known_routes()) {
      if (path != req.path) continue;
      if (req.method == method || (method == "GET" && req.method == "HEAD")) {
        allowed.clear();
        break;
      }
      allowed += (allowed.empty() ? "" : ", ") + (method == "GET" ? std::string("GET, HEAD") : method);
    }
    if (!allowed.empty()) {
      HttpResponse r = error_response(
          ApiError(405, fmt::format("Method Not Allowed: {} {} (allowed: {})", req.method, req.path, allowed)));
      r.headers.emplace_back("Allow", allowed);
      return r;
    }
    if (req.method == "POST") {
      if (req.header_count("Transfer-Encoding") == 0 && req.header_count("Content-Length") == 0)
        throw ApiError(411, "a POST request needs a Content-Length header (or chunked encoding)");
      if (starts_with_ci(req.header("Content-Type").value_or(""), "multipart/form-data"))
        throw ApiError(415, "multipart bodies are not supported; send a JSON body");
    }
  } catch (const ApiError& e) {
    HttpResponse r = error_response(e);
    if (e.status == 503 || e.status == 411 || e.status == 415) r.close = true;
    return r;
  }
  return std::nullopt;
}

std::string OpenAIServer::render_chat(const ChatRequest& cr) const {
  if (cr.chat_template && !opt_.trust_request_chat_template)
    bad_request("chat_template", "a request's own chat_template is rendered only when the server runs with "
                                 "--trust-request-chat-template");
  ChatTemplateInputs in;
  in.add_generation_prompt = cr.add_generation_prompt;
  in.continue_final_message = cr.continue_final_message;
  in.kwargs = cr.chat_template_kwargs;
  in.documents = cr.documents;
  in.tools = cr.tools;
  in.content_format = opt_.chat_template_content_format;
  try {
    if (!cr.chat_template) return chat_template_.apply(cr.messages, in);
    // vLLM's per-request template, with the checkpoint's special-token strings.
    return ChatTemplate::from_source(*cr.chat_template, chat_template_.bos_token(), chat_template_.eos_token())
        .apply(cr.messages, in);
  } catch (const Error& e) {
    bad_request(cr.chat_template ? "chat_template" : "messages", fmt::format("cannot apply the chat template: {}", e.what()));
  }
}

void OpenAIServer::check_model(const std::optional<std::string>& model) const {
  // vLLM's _check_model: an empty name is the default model; any --served-model-name is accepted.
  if (!model || model->empty() || *model == opt_.served_model_name) return;
  for (const auto& alias : opt_.served_model_aliases)
    if (*model == alias) return;
  throw ApiError(404, fmt::format("The model `{}` does not exist.", *model), "model");
}

bool OpenAIServer::authorized(const HttpRequest& req) const {
  if (opt_.api_keys.empty() || req.method == "OPTIONS" || req.path.rfind("/v1", 0) != 0) return true;
  // "Authorization: Bearer <key>", or Anthropic clients' "x-api-key: <key>".
  const auto value = req.header("Authorization");
  const auto x_api_key = value ? std::nullopt : req.header("x-api-key");
  std::string_view token;
  if (value) {
    const size_t space = value->find(' ');
    if (space == std::string::npos) return false;
    std::string scheme = value->substr(0, space);
    for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (scheme != "bearer") return false;
    token = std::string_view(*value).substr(space + 1);
  } else if (x_api_key) {
    token = *x_api_key;
  } else {
    return false;
  }
  // Compared in time independent of where the bytes differ (as vLLM's compare_digest), every key tried.
  bool match = false;
  for (const auto& key : opt_.api_keys) {
    unsigned char diff = key.size() == token.size() ? 0 : 1;
    for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ (i < token.size() ? token[i] : 0));
    match |= diff == 0;
  }
  return match;
}

HttpResponse OpenAIServer::tokenize(const std::string& body) const {
  const auto b = parse_body(body);
  const Tokenizer* tok = engine_.tokenizer();
  if (!tok) throw ApiError(400, "the model has no tokenizer");
  std::string text;
  if (b.contains("messages")) {
    ChatRequest cr = parse_chat_request(b);
    add_default_chat_template_kwargs(cr, opt_);
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
  const std::vector<int> ids = tok->encode(text, /*add_special_tokens=*/!b.contains("messages"));
  json strs = json::array();
  if (b.value("return_token_strs", false) == true)
    for (int id : ids) strs.push_back(tok->id_to_token(id));
  return json_response(json({{"count", ids.size()}, {"max_model_len", opt_.max_model_len}, {"tokens", ids},
                        {"token_strs", strs.empty() ? json(nullptr) : strs}}));
}

HttpResponse OpenAIServer::count_message_tokens(const std::string& body) const {
  const json chat = messages_to_chat_request(parse_body(body), false);
  const Tokenizer* tok = engine_.tokenizer();
  if (!tok) throw ApiError(400, "the model has no tokenizer");
  ChatRequest cr;
  try {
    cr = parse_chat_request(chat);
  } catch (const ApiError& e) {  // the chat path's field names as the Messages request spelt them
    throw respelt(e, messages_field(e.param));
  }
  add_default_chat_template_kwargs(cr, opt_);
  check_model(cr.model);
  // As generate() encodes a chat prompt: the template writes its own special tokens.
  return json_response(json({{"input_tokens", tok->encode(render_chat(cr), false).size()}}));
}

HttpResponse OpenAIServer::detokenize(const std::string& body) const {
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
  return json_response(json({{"prompt", tok->decode(ids)}}));
}

void OpenAIServer::handle(const std::shared_ptr<Exchange>& ex) {
  const HttpRequest& req = ex->request();
  // Every route runs inside this guard: nothing a client sends escapes as an exception.
  try {
    const std::string& p = req.path;
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (p == "/health" && get) return ex->respond(HttpResponse{});
    if (p == "/ping" && (get || req.method == "POST")) return ex->respond(HttpResponse{});  // vLLM's (SageMaker) probe
    if (p == "/version" && get) return ex->respond(json_response({{"version", version()}}));
    if (p == "/metrics" && get) {
      HttpResponse r;
      r.content_type = "text/plain; version=0.0.4; charset=utf-8";
      metrics_.set_http_connections(transport_->num_connections());
      r.body = metrics_.render(opt_.served_model_name);
      return ex->respond(std::move(r));
    }
    if (p == "/v1/models" && get) {
      json data = json::array();
      std::vector<std::string> names{opt_.served_model_name};
      names.insert(names.end(), opt_.served_model_aliases.begin(), opt_.served_model_aliases.end());
      for (const auto& id : names)
        data.push_back({{"id", id}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "ssmserve"},
                        {"root", opt_.model_root.empty() ? engine_.config().model.string() : opt_.model_root},
                        {"parent", nullptr}, {"max_model_len", opt_.max_model_len}});
      return ex->respond(json_response({{"object", "list"}, {"data", data}}));
    }
    if (req.method == "POST") {
      if (p == "/tokenize") return ex->respond(tokenize(req.body));
      if (p == "/detokenize") return ex->respond(detokenize(req.body));
      if (p == "/v1/completions") return generate(false, req.body, ex);
      if (p == "/v1/chat/completions") return generate(true, req.body, ex);
      if (p == "/v1/responses") return responses(req.body, ex);
      if (p == "/v1/messages" || p == "/v1/messages/count_tokens") {  // Anthropic's API: its error body too
        try {
          if (p != "/v1/messages") return ex->respond(count_message_tokens(req.body));
          return messages(req.body, ex);
        } catch (const ApiError& e) {
          return ex->respond(json_response(anthropic_error_body(e), e.status));
        } catch (const Error& e) {
          const ApiError ae(400, e.what());
          return ex->respond(json_response(anthropic_error_body(ae), 400));
        }
      }
      if (p == "/invocations") {  // vLLM's SageMaker route: a chat request by its messages, else a completion
        const auto b = parse_body(req.body);
        if (b.contains("messages")) return generate(true, req.body, ex);
        if (b.contains("prompt")) return generate(false, req.body, ex);
        bad_request("", "cannot find a handler for this /invocations body: expected a chat completion request "
                        "(\"messages\") or a completion request (\"prompt\")");
      }
    }
    throw ApiError(404, fmt::format("Not Found: {} {}", req.method, req.path));
  } catch (const ApiError& e) {
    ex->respond(error_response(e));
  } catch (const Error& e) {
    ex->respond(error_response(ApiError(400, e.what())));
  } catch (const std::bad_alloc&) {
    ex->respond(error_response(ApiError(500, "out of memory")));
  } catch (const std::exception& e) {
    ex->respond(error_response(ApiError(500, e.what())));
  }
}

void OpenAIServer::responses(const std::string& body, const std::shared_ptr<Exchange>& ex) {
  const ResponsesRequest rr = responses_to_chat_request(parse_body(body));
  // vLLM's Response id: the request's request_id (X-Request-Id, else the body's), "resp_" + it unless it has that prefix.
  std::string id = "resp_" + next_id("resp").substr(5);
  std::optional<std::string> client_id = ex->request().header("X-Request-Id");
  if (const auto it = rr.chat.find("request_id"); !client_id && it != rr.chat.end() && it->is_string()) client_id = it->get<std::string>();
  if (client_id && !client_id->empty()) id = client_id->rfind("resp_", 0) == 0 ? *client_id : "resp_" + *client_id;
  auto rs = std::make_shared<ResponsesStream>(id, unix_now(), rr.reflect);
  try {
    generate(true, body, ex, &rr.chat, rs);
  } catch (const ApiError& e) {  // the chat path's field names as the Responses request spelt them
    throw respelt(e, responses_field(e.param));
  }
}

void OpenAIServer::messages(const std::string& body, const std::shared_ptr<Exchange>& ex) {
  const json chat = messages_to_chat_request(parse_body(body));
  auto ms = std::make_shared<MessagesStream>("msg_" + next_id("msg").substr(4));
  try {
    generate(true, body, ex, &chat, ms);
  } catch (const ApiError& e) {  // the chat path's field names as the Messages request spelt them
    throw respelt(e, messages_field(e.param));
  }
}

void OpenAIServer::generate(bool chat, const std::string& body, const std::shared_ptr<Exchange>& ex, const json* parsed,
                            std::shared_ptr<ChatRenderer> renderer) {
  InflightGuard inflight(inflight_);
  if (draining_) throw ApiError(503, "the server is shutting down");
  const json b = parsed ? *parsed : parse_body(body);
  auto job = std::make_shared<GenerationJob>();
  job->chat = chat;
  job->renderer = std::move(renderer);
  // Engine request ids stay the server's own (unique); the response id is vLLM's: "cmpl-" / "chatcmpl-" + the
  // X-Request-Id header, else the body's request_id, else a fresh id.
  const std::string engine_id = next_id(chat ? "chatcmpl" : "cmpl");
  job->id = engine_id;
  std::optional<std::string> client_id = ex->request().header("X-Request-Id");
  if (const auto it = b.find("request_id"); !client_id && it != b.end() && !it->is_null()) {
    if (!it->is_string()) bad_request("request_id", "request_id must be a string");
    client_id = it->get<std::string>();
  }
  if (client_id) job->id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", *client_id);
  job->created = unix_now();
  job->model = opt_.served_model_name;
  job->tokenizer = engine_.tokenizer();
  const Tokenizer* tok = engine_.tokenizer();
  const int vocab = engine_.model_config().vocab_size;
  GenerationRequest base;
  std::vector<PromptInput> inputs;
  if (chat) {
    ChatRequest cr = parse_chat_request(b, opt_.max_logprobs, opt_.generation_defaults);
    add_default_chat_template_kwargs(cr, opt_);
    if (!tok) throw ApiError(400, "the model has no tokenizer; chat needs one");
    if (cr.tool_choice == "auto") {
      if (!opt_.enable_auto_tool_choice || opt_.tool_call_parser.empty())
        bad_request(cr.tool_choice_given ? "tool_choice" : "tools", "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
      job->tool_parser = opt_.tool_call_parser;
      job->tools = cr.tools;
    } else if (cr.tool_choice == "required" || cr.tool_choice == "function") {
      // Decoded under vLLM's tool-call schema (parse_chat_request set it); no parser flags needed, as vLLM.
      job->forced_tool = cr.tool_choice_function;
      job->tools = cr.tools;
    }
    PromptInput in;
    in.text = render_chat(cr);  // ApiError 400 when the template fails
    inputs.push_back(std::move(in));
    job->parallel_tool_calls = cr.parallel_tool_calls;
    if (cr.logprobs) job->logprobs = cr.top_logprobs;
    job->prompt_logprobs = cr.prompt_logprobs;
    if (cr.echo && cr.messages.back().value("role", "") == "assistant")  // vLLM: only the response's own role
      job->chat_echo = chat_content_text(cr.messages.back().value("content", json()));
    if (const std::string& name = engine_.config().reasoning_parser; !name.empty()) {
      job->reasoning = &reasoning_format(name);  // the engine checked the name and the markers' tokens at start
      job->include_reasoning = cr.include_reasoning;
      const auto& kw = cr.chat_template_kwargs;
      job->thinking_off = kw.is_object() && kw.contains("enable_thinking") && kw["enable_thinking"] == false;
    }
    base = cr;
  } else {
    CompletionRequest cr = parse_completion_request(b, opt_.max_logprobs, opt_.generation_defaults);
    inputs = std::move(cr.prompts);
    job->echo = cr.echo;
    job->prompt_only = cr.prompt_only;
    job->logprobs = cr.params.logprobs;
    job->prompt_logprobs = cr.prompt_logprobs;
    base = cr;
  }
  check_model(base.model);
  if (base.model && !base.model->empty()) job->model = *base.model;  // vLLM's _get_model_name: the name it was sent
  if (job->renderer) job->renderer->set_model(job->model);  // its translators send no n: one reply
  job->n = base.params.n;
  job->stream = base.stream;
  job->return_tokens_as_token_ids = base.return_tokens_as_token_ids.value_or(opt_.return_tokens_as_token_ids);
  job->return_token_ids = base.return_token_ids;
  job->include_usage = base.include_usage;
  job->continuous_usage = base.include_usage && base.continuous_usage_stats;  // as vLLM: both
  // 0. The bad words' token sequences, once for all the request's prompts (the engine then finds them tokenized); a
  // word that tokenizes to nothing, or too many sequences or tokens, is a 400 naming the field.
  if (!base.params.bad_words.empty()) {
    if (!tok) bad_request("bad_words", "the model has no tokenizer; bad_words need one");
    try {
      base.params.bad_words_token_ids = tokenize_bad_words(base.params.bad_words, *tok, vocab);
    } catch (const Error& e) {
      bad_request("bad_words", e.what());
    }
  }
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
      // Chat prompts are rendered by the template, which writes its own BOS: encoded without special tokens (vLLM's
      // default add_special_tokens=False for chat); completions get them (True, as vLLM); the request may say.
      rp.token_ids = tok->encode(rp.text, base.add_special_tokens.value_or(!chat));
    }
    if (const auto& k = base.truncate_prompt_tokens) {  // vLLM: the last k tokens (left truncation)
      if (*k > opt_.max_model_len)
        bad_request("truncate_prompt_tokens", fmt::format("truncate_prompt_tokens value ({}) is greater than max_model_len ({}). "
                                                          "Please, select a smaller truncation size.", *k, opt_.max_model_len));
      const size_t keep = *k == -1 ? static_cast<size_t>(opt_.max_model_len) : static_cast<size_t>(*k);
      if (rp.token_ids.size() > keep) {
        rp.token_ids.erase(rp.token_ids.begin(), rp.token_ids.end() - static_cast<std::ptrdiff_t>(keep));
        if (tok) rp.text = tok->decode(rp.token_ids);  // what echo returns: the prompt the model saw
      }
    }
    const int len = static_cast<int>(rp.token_ids.size());
    if (len == 0) bad_request(chat ? "messages" : "prompt", "the prompt is empty");
    if (job->reasoning) {
      // Where the rendered chat prompt leaves the reasoning (the template may open a block, or close an empty one when
      // chat_template_kwargs disable thinking): read from its token ids, as the engine reads them for structured
      // outputs; from its text when the markers are not single tokens.
      const auto start = tok->token_to_id(job->reasoning->start), end = tok->token_to_id(job->reasoning->end);
      job->prompt_reasoning = start && end ? prompt_reasoning(rp.token_ids, *start, *end)
                                           : prompt_reasoning(rp.text, *job->reasoning);
      if (job->thinking_off && job->reasoning->content_when_thinking_off) job->prompt_reasoning = PromptReasoning::Closed;
    }
    if (len >= opt_.max_model_len)
      bad_request(chat ? "messages" : "prompt",
                  fmt::format("This model's maximum context length is {} tokens. However, your request has {} input tokens. "
                              "Please reduce the length of the input messages.", opt_.max_model_len, len));
    SamplingParams sp = base.params;
    // Completions' omitted max_tokens is 16, checked as a given one (vLLM's CompletionRequest default, then
    // _validate_input: a prompt that leaves no room for 16 tokens is a 400, not a shorter completion).
    if (base.max_tokens_given || base.max_tokens_defaulted) {
      if (static_cast<long long>(len) + sp.max_tokens > opt_.max_model_len)
        bad_request(base.max_tokens_field,
                    fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in "
                                "the input, {} in the completion). Please reduce the length of the input or the completion.",
                                opt_.max_model_len, static_cast<long long>(len) + sp.max_tokens, len, sp.max_tokens));
    } else {
      // Chat's absent max_tokens and completions' null: vLLM's get_max_tokens, what the context leaves, at most the
      // model's default max_tokens.
      const int room = opt_.max_model_len - len;
      const GenerationDefaults& gd = opt_.generation_defaults;
      sp.max_tokens = std::min(room, gd.max_tokens.value_or(room));
    }
    // vLLM's override_max_tokens: a server-wide cap (--override-generation-config max_new_tokens, or that of a
    // --generation-config folder) on every request's max_tokens, its own included.
    if (const auto& cap = opt_.generation_defaults.max_tokens_limit) sp.max_tokens = std::min(sp.max_tokens, *cap);
    if (sp.min_tokens > sp.max_tokens)
      bad_request("min_tokens", fmt::format("min_tokens ({}) must be less than or equal to {} ({})", sp.min_tokens,
                                            base.max_tokens_field, sp.max_tokens));
    // The engine scores the prompt once for both echo's logprobs and prompt_logprobs (each rendering takes its top-k).
    if (job->echo && job->logprobs) sp.prompt_logprobs = job->logprobs;
    if (job->prompt_logprobs) sp.prompt_logprobs = std::max(sp.prompt_logprobs.value_or(0), *job->prompt_logprobs);
    sp.n = 1;
    try {
      sp.validate(vocab);
    } catch (const SamplingParamsError& e) {
      // The request's field (SamplingParams' names are vLLM's, the API's): "stop_token_ids[0] = 50280 is out of ...".
      bad_request(e.field() == "bad_words_token_ids" ? "bad_words" : e.field(), e.named(e.field()));
    } catch (const Error& e) {
      bad_request("", e.what());
    }
    // vLLM's engine seed for a valid request without its own (choice i then uses seed + i, as a seeded request's).
    if (!sp.seed && opt_.seed) sp.seed = derived_request_seed(*opt_.seed, unseeded_requests_.fetch_add(1));
    for (int i = 0; i < base.params.n; ++i) {
      ssmserve::Request r;
      r.request_id = fmt::format("{}-{}-{}", engine_id, p, i);
      r.prompt = rp.text;
      r.prompt_token_ids = rp.token_ids;
      r.params = sp;
      r.cache_salt = base.cache_salt;
      // A reply the server reads as content from its first token (nemotron_v3 with thinking off): so does its constraint.
      r.reasoning_off = job->thinking_off && job->reasoning && job->reasoning->content_when_thinking_off;
      if (sp.seed) r.params.seed = *sp.seed + static_cast<uint64_t>(i);
      // The n choices of a prompt share its logprobs: a whole response scores the prompt once (its first choice).
      if (i > 0 && !job->stream) r.params.prompt_logprobs.reset();
      job->request_ids.push_back(r.request_id);
      reqs.push_back(std::move(r));
    }
    job->prompts.push_back(std::move(rp));
  }
  // The sampling values used (defaults applied), for replies that report them (a Response's temperature, ...).
  if (job->renderer && !reqs.empty())
    job->renderer->set_sampling(reqs[0].params.temperature, reqs[0].params.top_p, reqs[0].params.max_tokens);
  // 2. The constraint's check (xgrammar's conversion) here on the request thread, its error naming the field the client
  // used; the engine thread then finds it validated (a cache hit) and compiles it.
  if (const auto& so = base.params.structured_outputs)
    check_structured_outputs(*so, base.structured_outputs_field, job->tools, job->forced_tool.value_or(""));
  // 3. Hand the group to the engine thread (it accepts all or none) and the exchange to a producer, woken by the
  // channel whenever the engine has something for it.
  std::weak_ptr<Exchange> wex = ex;
  job->channel = engine_.submit(std::move(reqs), [wex] {
    if (auto e = wex.lock()) e->wake();
  });
  ex->respond_later(std::make_shared<GenerationProducer>(*this, ex, job, inflight.release()));
}

}  // namespace ssmserve::server
