// Owns `ssmserve serve`: the OpenAI-compatible HTTP server (src/server/) over one engine thread, with graceful
// shutdown on SIGTERM / SIGINT (new requests get 503, running ones finish for up to --shutdown-timeout seconds).
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <iostream>
#include <thread>

#include "apps/commands.h"
#include "apps/vllm_compat_flags.h"
#include "config/hf_hub_cache.h"
#include "core/env_options.h"
#include "core/error.h"
#include "engine/generation_defaults.h"
#include "server/async_engine.h"
#include "server/tool_parsers.h"
#include "chat/chat_template.h"
#include "server/http_server.h"

namespace ssmserve::cli {
namespace {

/// Raises the open-file limit towards what --max-connections needs (each connection is a descriptor), up to the
/// hard limit; warns when that is not enough (connections past it are refused by accept until others close).
void raise_fd_limit(int max_connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t want = static_cast<rlim_t>(max_connections) + 256;  // model files, pipes, the listener
  if (rl.rlim_cur < want) {
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < want)
    std::cerr << "ssmserve: warning: the open-file limit (" << rl.rlim_cur << ") is below --max-connections "
              << max_connections << " + 256; raise `ulimit -n` to hold that many connections" << std::endl;
}

struct ServeArgs {
  EngineConfig engine;
  std::string load_format = "auto";
  server::ServerOptions server;
  int max_model_len = 0;          ///< --max-model-len as given (checked > 0 when given)
  bool max_model_len_given = false;
  bool served_model_name_given = false;
  int max_num_waiting = 1024;
  /// Per request: output bytes buffered for a client that does not read before the request is aborted.
  size_t max_pending_output_bytes = 64u << 20;
  /// Prompt tokens scored per engine step (prompt_logprobs / echo + logprobs), so scoring a long prompt does not
  /// make every concurrent request's steps slow (SchedulerConfig::max_num_scored_tokens).
  int max_num_scored_tokens = 256;
  int max_seqs_per_request = 0;  ///< fair admission: one request's sequences in the engine at once (0 = max_num_seqs / 4)
  std::string chat_template;
  std::string chat_template_content_format = "auto";  ///< vLLM's --chat-template-content-format
  std::string default_chat_template_kwargs;            ///< vLLM's --default-chat-template-kwargs (a JSON object)
  double shutdown_timeout = 30.0;
  std::string model_tag;                       ///< `serve MODEL` (vLLM's positional model)
  std::vector<std::string> served_model_names;  ///< --served-model-name NAME... (the first names responses)
  bool model_option_given = false;
  bool vllm_noop_flag = false;     ///< --disable-log-requests (ssmserve never logs request contents)
  bool disable_log_stats = false;  ///< --disable-log-stats: no periodic stats line
  /// --allowed-origins / --allowed-methods / --allowed-headers as given (JSON lists, vLLM's json.loads values)
  std::string allowed_origins = R"(["*"])", allowed_methods = R"(["*"])", allowed_headers = R"(["*"])";
  uint64_t seed = 0;              ///< --seed (vLLM's engine seed; ServerOptions::seed), in [0, 2^64)
  VllmCompatFlags vllm;           ///< vLLM flags accepted with no effect
};

/// vLLM's load_chat_template rule for --chat-template: a readable file is read; a value that is not one but holds
/// any of "{", "}" or a newline is the template text itself, its backslash escapes (\n, \t, \r, \\, \", \')
/// decoded; anything else is an error (a file path that failed to open).
server::ChatTemplate load_serve_chat_template(const std::filesystem::path& tokenizer_dir, const std::string& value) {
  std::error_code ec;
  if (value.empty() || std::filesystem::is_regular_file(value, ec) ||
      value.find_first_of("{}\n") == std::string::npos)
    return server::ChatTemplate::load(tokenizer_dir, value);  // a missing file: load's error names it
  std::string source;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '\\' || i + 1 == value.size()) {
      source += value[i];
      continue;
    }
    switch (const char e = value[++i]) {
      case 'n': source += '\n'; break;
      case 't': source += '\t'; break;
      case 'r': source += '\r'; break;
      case '\\': case '"': case '\'': source += e; break;
      default: source += '\\', source += e;  // an unknown escape stays as written (Python's unicode_escape)
    }
  }
  const auto [bos, eos] = server::ChatTemplate::special_tokens(tokenizer_dir);
  try {
    return server::ChatTemplate::from_source(std::move(source), bos, eos);
  } catch (const Error& e) {
    fail("--chat-template (given as the template text): {}", e.what());
  }
}

int run_serve(ServeArgs& a) {
  if (!a.model_tag.empty()) {  // vLLM: the positional model, or --model, not both
    SSM_CHECK(!a.model_option_given, "give the model once: `serve MODEL` or --model MODEL, not both");
    a.engine.model = a.model_tag;
  }
  const std::string model_as_given = a.engine.model.string();  // the default served name (a hub id stays the id)
  if (!a.vllm.revision.empty() && !a.engine.model.empty())  // a hub id's snapshot of --revision (else main)
    a.engine.model = resolve_model_path(a.engine.model.string(), a.vllm.revision);
  resolve_engine_config(a.engine, a.load_format);
  check_vllm_compat_flags(a.vllm);
  a.server.seed = a.seed;
  SSM_CHECK(a.server.port >= 0 && a.server.port <= 65535, "--port must be in [0, 65535] (got {})", a.server.port);
  if (a.max_model_len_given) {
    check_max_model_len(a.max_model_len);
    a.engine.max_model_len = a.max_model_len;  // the engine refuses one above the model's context or its block pool
  }
  if (a.served_model_name_given) {
    for (const auto& n : a.served_model_names) {
      SSM_CHECK(n.find_first_not_of(" \t\r\n") != std::string::npos,
                "--served-model-name must not be empty (clients send it as \"model\")");
      // A flag read as a name (`--served-model-name --api-key K` with the name's variable unset): an error, as
      // vLLM's argparse gives, not a served "--api-key" and a server without its key.
      SSM_CHECK(n[0] != '-', "--served-model-name needs a name, got \"{}\" (a name cannot start with '-')", n);
    }
    a.server.served_model_name = a.served_model_names.front();
    a.server.served_model_aliases.assign(a.served_model_names.begin() + 1, a.served_model_names.end());
  }
  for (const auto& key : a.server.api_keys) {
    SSM_CHECK(!key.empty(), "--api-key must not be empty");
    SSM_CHECK(key[0] != '-', "--api-key needs a key, got a flag-like \"{}\" (a key cannot start with '-')", key.substr(0, 40));
  }
  if (a.server.api_keys.empty() && !env_options().vllm_api_key.empty())
    a.server.api_keys.push_back(env_options().vllm_api_key);
  a.server.cors.allowed_origins = server::parse_cors_list(a.allowed_origins, "--allowed-origins");
  a.server.cors.allowed_methods = server::parse_cors_list(a.allowed_methods, "--allowed-methods");
  a.server.cors.allowed_headers = server::parse_cors_list(a.allowed_headers, "--allowed-headers");
  if (!a.default_chat_template_kwargs.empty()) {
    auto kw = nlohmann::ordered_json::parse(a.default_chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    SSM_CHECK(kw.is_object(), "--default-chat-template-kwargs must be a JSON object of template variables (got '{}')",
              a.default_chat_template_kwargs.substr(0, 200));
    a.server.default_chat_template_kwargs = std::move(kw);
  }
  SSM_CHECK(a.server.read_timeout_s > 0 && a.server.read_timeout_s <= 3600, "--http-read-timeout must be in (0, 3600] seconds");
  SSM_CHECK(a.max_seqs_per_request >= 0, "--max-num-seqs-per-request must be >= 0 (got {})", a.max_seqs_per_request);
  SSM_CHECK(a.max_num_waiting >= 0, "--max-num-waiting must be >= 0 (got {})", a.max_num_waiting);
  SSM_CHECK(a.max_num_scored_tokens >= 0 && a.max_num_scored_tokens <= kMaxNumBatchedTokens,
            "--max-num-scored-tokens must be in [0, {}] (got {})", kMaxNumBatchedTokens, a.max_num_scored_tokens);
  a.engine.scheduler.max_num_scored_tokens = a.max_num_scored_tokens;
  SSM_CHECK(!a.server.enable_auto_tool_choice || !a.server.tool_call_parser.empty(),
            "--enable-auto-tool-choice needs --tool-call-parser (the format of the model's tool calls)");
  if (!a.server.tool_call_parser.empty()) server::make_tool_parser(a.server.tool_call_parser);  // an unknown name: error
  SSM_CHECK(a.server.max_logprobs >= 0 && a.server.max_logprobs <= kMaxLogprobs,
            "--max-logprobs must be in [0, {}] (got {}; the engine returns at most {} logprobs per token)", kMaxLogprobs,
            a.server.max_logprobs, kMaxLogprobs);
  SSM_CHECK(a.server.http_threads >= 1 && a.server.http_threads <= 4096, "--http-threads must be in [1, 4096] (got {})",
            a.server.http_threads);
  SSM_CHECK(a.server.io_threads >= 1 && a.server.io_threads <= 256, "--http-io-threads must be in [1, 256] (got {})",
            a.server.io_threads);
  SSM_CHECK(a.server.max_connections >= 1 && a.server.max_connections <= (1 << 20),
            "--max-connections must be in [1, 1048576] (got {})", a.server.max_connections);
  SSM_CHECK(a.server.header_timeout_s > 0 && a.server.header_timeout_s <= 3600, "--http-header-timeout must be in (0, 3600] seconds");
  SSM_CHECK(a.server.keep_alive_timeout_s > 0 && a.server.keep_alive_timeout_s <= 3600,
            "--http-keep-alive-timeout must be in (0, 3600] seconds");
  SSM_CHECK(a.server.write_timeout_s > 0 && a.server.write_timeout_s <= 3600, "--http-write-timeout must be in (0, 3600] seconds");
  // The defaults of the sampling fields a request leaves unset (vLLM's generation config), checked before the model
  // loads.
  a.server.generation_defaults =
      GenerationDefaults::load(a.engine.model, a.engine.generation_config, a.engine.override_generation_config);
  if (!a.server.generation_defaults.empty())
    spdlog::warn("{}", a.server.generation_defaults.notice("`--generation-config vllm`"));
  raise_fd_limit(a.server.max_connections);
  SSM_CHECK(a.shutdown_timeout >= 0 && a.shutdown_timeout <= 3600, "--shutdown-timeout must be in [0, 3600] seconds");
  // Signals go to one thread (sigwait) only: block them before any other thread exists.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away must make a write fail, not kill the server

  server::Metrics metrics;
  server::AsyncEngine engine(a.engine, server::AsyncEngineOptions{a.max_num_waiting, a.max_pending_output_bytes, a.max_seqs_per_request}, metrics);
  const ModelConfig& mc = engine.model_config();
  a.server.max_model_len = a.max_model_len_given ? a.max_model_len : mc.max_model_len > 0 ? mc.max_model_len : kDefaultMaxModelLenWithoutLimit;
  if (const int cap = engine.pool_token_capacity(); cap > 0 && a.server.max_model_len > cap) {
    // From the model's context (e.g. 10M tokens, beyond the automatic pool): lowered to what the pool holds, with a
    // warning.
    std::cerr << "ssmserve: warning: max_model_len lowered from the model's context (" << a.server.max_model_len
              << ") to the " << cap << " tokens one request's KV blocks can take in the block pool (--num-state-blocks "
              << "raises it)" << std::endl;
    a.server.max_model_len = cap;
  }
  if (a.server.served_model_name.empty()) a.server.served_model_name = model_as_given;
  a.server.model_root = model_as_given;
  // The chat template lives with the tokenizer (tokenizer_config.json), as in vLLM: --tokenizer DIR when given.
  const std::filesystem::path& tokenizer_dir = a.engine.tokenizer.empty() ? a.engine.model : a.engine.tokenizer;
  server::ChatTemplate tmpl = load_serve_chat_template(tokenizer_dir, a.chat_template);
  a.server.chat_template_content_format =
      server::parse_chat_content_format(a.chat_template_content_format, "--chat-template-content-format");
  if (a.server.chat_template_content_format == server::ChatContentFormat::Auto) {
    server::ChatTemplateInputs probe;
    try {
      spdlog::info("chat template content format detected: {} (--chat-template-content-format overrides it)",
                   server::chat_content_format_name(tmpl.content_format(probe)));
    } catch (const Error&) {  // several named templates and no default: each request's pick is detected then
    }
  }
  server::OpenAIServer http(engine, metrics, std::move(tmpl), a.server);
  const int port = http.bind();

  std::thread signal_thread([&http, &sigs, timeout = a.shutdown_timeout] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::cerr << "ssmserve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining requests, then stopping" << std::endl;
    http.drain_and_stop(timeout);
  });
  // An IPv6 address goes in brackets in a URL (http://[::1]:8000).
  const std::string host = a.server.host.find(':') != std::string::npos ? "[" + a.server.host + "]" : a.server.host;
  std::cerr << "ssmserve: serving " << a.server.served_model_name << " on http://" << host << ":" << port
            << " (max_model_len " << a.server.max_model_len << ")" << std::endl;
  // vLLM's periodic stats line (LoggingStatLogger, every 10 s, at info; quiet while idle).
  std::mutex stats_mu;
  std::condition_variable stats_cv;
  bool stats_stop = false;
  std::thread stats_thread;
  if (!a.disable_log_stats && spdlog::should_log(spdlog::level::info))
    stats_thread = std::thread([&] {
      server::StatsLine stats;
      auto last = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lk(stats_mu);
      while (!stats_cv.wait_for(lk, std::chrono::seconds(10), [&] { return stats_stop; })) {
        const auto now = std::chrono::steady_clock::now();
        const std::string line = stats.next(metrics, std::chrono::duration<double>(now - last).count());
        last = now;
        if (!line.empty()) spdlog::info("{}", line);
      }
    });
  auto stop_stats = [&] {
    if (!stats_thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(stats_mu);
      stats_stop = true;
    }
    stats_cv.notify_all();
    stats_thread.join();
  };
  try {
    http.listen();
  } catch (...) {
    stop_stats();  // a joinable thread left behind would end the process
    throw;
  }
  stop_stats();
  signal_thread.join();
  engine.shutdown();
  std::cerr << "ssmserve: stopped" << std::endl;
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)");
  add_engine_options(*cmd, a->engine, a->load_format);
  add_generation_config_options(*cmd, a->engine);
  cmd->add_option("--host", a->server.host,
                  "Address to listen on (default every IPv4 interface, as vLLM; 127.0.0.1: this machine only; '::': "
                  "every IPv6 and IPv4 one)")
      ->capture_default_str();
  cmd->add_option("--port", a->server.port, "Port (0 = any free port, printed at startup)")->capture_default_str();
  cmd->add_option("model_tag", a->model_tag, "The model folder (as --model; vLLM's `serve MODEL`)");
  auto* name = cmd->add_option("--served-model-name", a->served_model_names,
                               "Model ids clients use; the first names responses, any is accepted (default: the model path)");
  cmd->add_option("--api-key", a->server.api_keys,
                  "A key every /v1 request must send as \"Authorization: Bearer KEY\" (else 401); repeat it to "
                  "accept several; default: $VLLM_API_KEY, else none")
      ->allow_extra_args(false);  // one value per --api-key: `serve --api-key K MODEL` keeps MODEL the model
  cmd->add_option("--allowed-origins", a->allowed_origins,
                  "CORS: origins browsers may call the server from, a JSON list (e.g. '[\"https://app.example\"]')")
      ->capture_default_str();
  cmd->add_option("--allowed-methods", a->allowed_methods, "CORS: allowed methods, a JSON list")->capture_default_str();
  cmd->add_option("--allowed-headers", a->allowed_headers, "CORS: allowed request headers, a JSON list")
      ->capture_default_str();
  cmd->add_flag("--allow-credentials", a->server.cors.allow_credentials,
                "CORS: let browsers send credentials (cookies, Authorization) across origins");
  cmd->add_flag("--disable-log-stats", a->disable_log_stats,
                "No stats line every 10 s (throughput, requests, state cache; logged at info, serve's default level)");
  cmd->add_flag("--disable-uvicorn-access-log", a->server.disable_access_log,
                "No access line per request (client - \"METHOD path HTTP/1.1\" status; info level)");
  cmd->add_option("--seed", a->seed,
                  "Engine seed (vLLM's): requests without their own seed get seeds derived from it and their arrival "
                  "order, so a server's sampled outputs repeat from run to run")
      ->capture_default_str();
  add_vllm_compat_flags(*cmd, a->vllm);
  cmd->add_flag("--enable-request-id-headers", a->server.enable_request_id_headers,
                "Every response carries an X-Request-Id header: the request's own, else a fresh id (vLLM's)");
  cmd->add_flag("--disable-log-requests", a->vllm_noop_flag,
                "Accepted for vLLM command lines (ssmserve never logs request contents)");
  auto* mml = add_max_model_len_option(*cmd, a->max_model_len, std::to_string(kDefaultMaxModelLenWithoutLimit));
  cmd->add_option("--max-num-waiting", a->max_num_waiting,
                  "Waiting sequences (prompts x n) before new requests get 503; a request with more on its own gets 400 "
                  "(0 = no limit)")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs-per-request", a->max_seqs_per_request,
                  "Fair admission: most sequences of one request in the engine at once; the rest wait and requests take "
                  "turns; while others are active, also at most --max-num-seqs / active requests (0 = a quarter of --max-num-seqs)")
      ->capture_default_str();
  cmd->add_option("--max-num-scored-tokens", a->max_num_scored_tokens,
                  "Prompt tokens scored (prompt_logprobs, echo with logprobs) per engine step, so a long prompt's "
                  "scoring is spread over steps instead of slowing everyone's (0 = no limit beyond "
                  "--max-num-batched-tokens)")
      ->capture_default_str();
  cmd->add_option("--max-pending-output-bytes", a->max_pending_output_bytes,
                  "Output bytes buffered per request while its client does not read (a stalled stream); past it the "
                  "request is aborted with an error event (0 = no limit)")
      ->check(CLI::Range(size_t{0}, size_t{1} << 40))  // a negative value would wrap to "no limit"
      ->capture_default_str();
  cmd->add_option("--max-logprobs", a->server.max_logprobs,
                  "Most logprobs / prompt_logprobs / top_logprobs a request may ask for (more: 400)")
      ->capture_default_str();
  cmd->add_flag("--return-tokens-as-token-ids", a->server.return_tokens_as_token_ids,
                "Logprobs name tokens \"token_id:<id>\" instead of their text (a request's "
                "return_tokens_as_token_ids overrides; as vLLM)");
  cmd->add_flag("--enable-auto-tool-choice", a->server.enable_auto_tool_choice,
                "Chat requests with tools and tool_choice \"auto\" get the model's tool calls parsed (needs "
                "--tool-call-parser; as vLLM)");
  cmd->add_option("--tool-call-parser", a->server.tool_call_parser,
                  "Format of the tool calls the model writes: hermes (Qwen, Hermes, Granite 4.0 <tool_call>), granite4 "
                  "(Granite 4.0 as vLLM's granite4: hermes' calls, the text around them kept as content), granite "
                  "(<|tool_call|>), jamba, minimax, nemotron_json (<TOOLCALL>), qwen3_coder / qwen3_xml (Qwen3-Coder, "
                  "Qwen3.5, Qwen3.6, Qwen3-Next: <tool_call><function=NAME><parameter=ARG>)");
  cmd->add_option("--chat-template", a->chat_template,
                  "Jinja chat template file, or the template itself (a value with {, } or a newline; as vLLM) "
                  "(default: the checkpoint's, else plain)");
  cmd->add_option("--chat-template-content-format", a->chat_template_content_format,
                  "How the chat template gets each message's content: string (text parts joined with newlines), "
                  "openai (a list of {\"type\": \"text\", \"text\"} parts) or auto (detected from the template: "
                  "openai when it loops over a message's content; as vLLM)")
      ->check(CLI::IsMember({"auto", "string", "openai"}))
      ->capture_default_str();
  cmd->add_option("--default-chat-template-kwargs", a->default_chat_template_kwargs,
                  "Template variables every chat request gets unless its chat_template_kwargs set them, as a JSON "
                  "object, e.g. '{\"enable_thinking\": false}' (vLLM's)");
  cmd->add_flag("--trust-request-chat-template", a->server.trust_request_chat_template,
                "Render a chat request's own \"chat_template\" (else it is a 400; as vLLM)");
  cmd->add_option("--http-threads", a->server.http_threads,
                  "Threads that parse and tokenize requests and render chat templates")
      ->capture_default_str();
  cmd->add_option("--http-io-threads", a->server.io_threads, "Threads running every connection's network I/O")
      ->capture_default_str();
  cmd->add_option("--max-connections", a->server.max_connections,
                  "Open connections at once; more are answered 503 and closed")
      ->capture_default_str();
  cmd->add_option("--http-header-timeout", a->server.header_timeout_s,
                  "Seconds a client has to send a request's line and headers once it started (else 408)")
      ->capture_default_str();
  cmd->add_option("--http-keep-alive-timeout", a->server.keep_alive_timeout_s,
                  "Seconds an idle connection (or a new one that sends nothing) stays open")
      ->capture_default_str();
  cmd->add_option("--http-write-timeout", a->server.write_timeout_s,
                  "Seconds a client may read nothing of its response before it is dropped")
      ->capture_default_str();
  cmd->add_option("--shutdown-timeout", a->shutdown_timeout,
                  "Seconds running requests may finish after SIGTERM (new ones get 503); then they are aborted")
      ->capture_default_str();
  cmd->add_option("--http-read-timeout", a->server.read_timeout_s,
                  "Seconds a client has to send a request's headers and body (slower ones get 408 and are dropped)")
      ->capture_default_str();
  cmd->callback([a, name, mml, cmd] {
    a->served_model_name_given = name->count() > 0;
    a->model_option_given = cmd->get_option("--model")->count() > 0;
    a->max_model_len_given = mml->count() > 0 && a->max_model_len != -1;  // -1 / auto: the model's (vLLM)
  });
  return [a] { return run_serve(*a); };
}

}  // namespace ssmserve::cli
