// Owns `ssmserve bench serve`: a load generator for a running OpenAI-compatible server (vLLM's `bench serve`).
// Requests arrive as a Poisson process (--request-rate, inf = all at once), each streams its completion (SSE);
// reports request / token throughput and TTFT, TPOT, ITL and end-to-end latency (bench_serve_report.h).
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>

#include "apps/bench_serve_report.h"
#include "apps/commands.h"
#include "apps/vllm_compat_flags.h"
#include "config/hf_json.h"
#include "core/env_options.h"
#include "core/error.h"

namespace ssmserve::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

/// Client threads when --max-concurrency is 0 (unlimited): requests beyond them wait for a free thread.
constexpr size_t kMaxClientThreads = 1024;
/// Slowest --request-rate (mean gaps of ~3 hours; a slower rate's arrival times overflow the clock).
constexpr double kMinRequestRate = 1e-4;

struct BenchServeArgs {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;           ///< empty = the first id of GET /v1/models
  std::string dataset = "random";
  int num_prompts = 100;
  double request_rate = std::numeric_limits<double>::infinity();
  int max_concurrency = 0;
  int input_len = 128;
  int output_len = 128;
  long long seed = 0;
  std::string output_json;
  // vLLM's `vllm bench serve` spellings of the same settings (resolve_vllm_spellings folds them in).
  std::string host;             ///< with port: http://host:port unless --base-url is given
  int port = 0;
  std::string dataset_name;     ///< random, or custom (JSONL prompts at dataset_path)
  std::string dataset_path;
  bool ignore_eos = false;      ///< accepted: every request already sets ignore_eos
  std::string backend = "vllm";  ///< vllm / openai (completions) or openai-chat (chat completions when --endpoint is not given)
  std::string tokenizer;        ///< recorded only (the server tokenizes; random prompts are token ids)
  std::string percentile_metrics = "ttft,tpot,itl,e2el";
  std::string metric_percentiles = "99";
  bool save_result = false;     ///< write the result JSON to result_dir / result_filename (vLLM's naming)
  std::string result_dir, result_filename;
  int num_warmups = 0;          ///< requests sent (one at a time) before the timed run
  bool disable_tqdm = false;    ///< accepted: no progress bar is drawn
  bool base_url_given = false, dataset_given = false, endpoint_given = false;
};

/// The local time now in strftime's `format`.
std::string date_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  return std::strftime(buf, sizeof buf, format, &tm) ? std::string(buf) : std::string();
}

/// --save-result's file: result_dir / (result_filename, else vLLM's "{backend}-{rate}qps[-concurrency{n}]-{model's last
/// path part}-{date}.json"); "" without --save-result.
std::string result_path_of(const BenchServeArgs& a) {
  if (!a.save_result) return "";
  std::string name = a.result_filename;
  if (name.empty()) {
    std::string model = a.model.substr(a.model.find_last_of('/') == std::string::npos ? 0 : a.model.find_last_of('/') + 1);
    name = fmt::format("{}-{}qps{}-{}-{}.json", a.backend, std::isinf(a.request_rate) ? "inf" : fmt::format("{}", a.request_rate),
                       a.max_concurrency > 0 ? fmt::format("-concurrency{}", a.max_concurrency) : "", model,
                       date_now("%Y%m%d-%H%M%S"));
  }
  return a.result_dir.empty() ? name : a.result_dir + "/" + name;
}

/// Folds vLLM's --host / --port and --dataset-name / --dataset-path into base_url and dataset; throws Error naming
/// the flags for a combination that means two things.
void resolve_vllm_spellings(BenchServeArgs& a) {
  if (!a.host.empty() || a.port != 0) {
    SSM_CHECK(a.port >= 0 && a.port <= 65535, "--port must be in [1, 65535] (got {})", a.port);
    if (!a.base_url_given)  // vLLM: --base-url, when given, wins over --host / --port
      a.base_url = fmt::format("http://{}:{}", a.host.empty() ? "127.0.0.1" : a.host, a.port == 0 ? 8000 : a.port);
  }
  if (!a.dataset_name.empty() || !a.dataset_path.empty())
    a.dataset = resolve_vllm_dataset(a.dataset_name, a.dataset_path, a.dataset_given);
}

struct Url {
  std::string scheme_host_port;
  std::string path_prefix;
};

Url split_url(const std::string& url) {
  SSM_CHECK(url.rfind("http://", 0) == 0, "--base-url must start with http:// (got \"{}\")", url);
  const size_t slash = url.find('/', 7);
  Url u{slash == std::string::npos ? url : url.substr(0, slash), slash == std::string::npos ? "" : url.substr(slash)};
  while (!u.path_prefix.empty() && u.path_prefix.back() == '/') u.path_prefix.pop_back();
  // An OpenAI client's base URL (".../v1") names the same server: the endpoints add /v1 themselves.
  if (u.path_prefix.size() >= 3 && u.path_prefix.compare(u.path_prefix.size() - 3, 3, "/v1") == 0)
    u.path_prefix.resize(u.path_prefix.size() - 3);
  return u;
}

/// Prompts: JSONL records ("prompt" or "text"), or random token ids in [100, 10000) of --input-len tokens.
std::vector<json> make_prompts(const BenchServeArgs& a) {
  std::vector<json> prompts;
  if (a.dataset == "random") {
    std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
    std::uniform_int_distribution<int> tok(100, 9999);
    for (int i = 0; i < a.num_prompts; ++i) {
      json ids = json::array();
      for (int t = 0; t < a.input_len; ++t) ids.push_back(tok(rng));
      prompts.push_back(std::move(ids));
    }
    return prompts;
  }
  std::ifstream in(a.dataset);
  SSM_CHECK(in, "{}: cannot open the dataset", a.dataset);
  std::string line;
  for (int lineno = 1; static_cast<int>(prompts.size()) < a.num_prompts && std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    check_json_depth(line, fmt::format("{}:{}", a.dataset, lineno));
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail("{}:{}: invalid JSON ({})", a.dataset, lineno, e.what());
    }
    const char* key = j.is_object() && j.contains("text") ? "text" : "prompt";
    SSM_CHECK(j.is_object() && j.contains(key) && j[key].is_string() && !j[key].get<std::string>().empty(),
              "{}:{}: each line must be an object with a non-empty string \"text\" or \"prompt\"", a.dataset, lineno);
    prompts.push_back(j[key]);
  }
  SSM_CHECK(!prompts.empty(), "{}: the dataset has no records", a.dataset);
  for (size_t i = 0; prompts.size() < static_cast<size_t>(a.num_prompts); ++i) prompts.push_back(prompts[i]);  // cycle
  return prompts;
}

/// Whether `endpoint` (leading '/' ensured) is the chat endpoint (vLLM's openai-chat backend: a user message per
/// prompt, content deltas) rather than completions (the openai backend); throws Error for any other endpoint.
bool is_chat_endpoint(const std::string& endpoint) {
  const auto ends_with = [&](const std::string& tail) {
    return endpoint.size() >= tail.size() && endpoint.compare(endpoint.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with("/chat/completions")) return true;
  SSM_CHECK(ends_with("/completions"), "--endpoint must be a completions or chat completions path such as "
            "/v1/completions or /v1/chat/completions (got \"{}\")", endpoint);
  return false;
}

/// A client of the server at `url`, sending $OPENAI_API_KEY as its bearer token when set (vLLM's bench, the openai
/// client), for servers started with --api-key.
httplib::Client server_client(const Url& url) {
  httplib::Client cli(url.scheme_host_port);
  if (const std::string& key = env_options().openai_api_key; !key.empty()) cli.set_bearer_token_auth(key);
  return cli;
}

/// Random token-id prompts as text, for the chat endpoint (a message holds text): the server's /detokenize of each.
/// Throws Error naming the server's answer when it cannot.
void detokenize_prompts(const Url& url, const std::string& model, std::vector<json>& prompts) {
  httplib::Client cli = server_client(url);
  cli.set_connection_timeout(30);
  for (json& p : prompts) {
    if (!p.is_array()) continue;
    const json body = {{"model", model}, {"tokens", p}};
    auto res = cli.Post(url.path_prefix + "/detokenize", body.dump(), "application/json");
    SSM_CHECK(res && res->status == 200, "the chat endpoint needs text prompts: {}{}/detokenize turned the random "
              "token ids into none ({}); use --dataset FILE", url.scheme_host_port, url.path_prefix,
              res ? fmt::format("HTTP {}", res->status) : std::string("no answer"));
    check_json_depth(res->body, "the server's /detokenize answer");
    const json j = json::parse(res->body, nullptr, false);
    SSM_CHECK(!j.is_discarded() && j.contains("prompt") && j["prompt"].is_string(),
              "{}/detokenize returned no \"prompt\" text", url.path_prefix);
    p = j["prompt"];
  }
}

/// The text of a stream event's first choice: `text` (completions) or `delta.content` / `delta.reasoning_content`
/// (chat); empty when it carries none.
std::string event_text(const json& j, bool chat) {
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty() || !j["choices"][0].is_object()) return "";
  const json& c = j["choices"][0];
  if (!chat) return c.contains("text") && c["text"].is_string() ? c["text"].get<std::string>() : "";
  if (!c.contains("delta") || !c["delta"].is_object()) return "";
  std::string out;
  for (const char* k : {"reasoning_content", "content"})
    if (c["delta"].contains(k) && c["delta"][k].is_string()) out += c["delta"][k].get<std::string>();
  return out;
}

/// Sends one streaming completion (chat: one user message) and measures it.
RequestResult run_request(const Url& url, const std::string& path, bool chat, const std::string& model, const json& prompt,
                          int max_tokens) {
  RequestResult r;
  httplib::Client cli = server_client(url);
  cli.set_connection_timeout(30);
  cli.set_read_timeout(600);
  httplib::Request req;
  req.method = "POST";
  req.path = url.path_prefix + path;
  json body = {{"model", model}, {"temperature", 0.0}, {"ignore_eos", true}, {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (chat) body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}}), body["max_completion_tokens"] = max_tokens;
  else body["prompt"] = prompt, body["max_tokens"] = max_tokens;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buf, error_body;
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos; buf.erase(0, end + 2)) {
      const std::string ev = buf.substr(0, end);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string payload = ev.substr(6);
      if (payload == "[DONE]") continue;
      try {
        check_json_depth(payload, "a stream event");  // a server's nesting must not exhaust our stack
      } catch (const Error& e) {
        error_body = e.what();
        continue;
      }
      const json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) error_body = payload;
      if (j.contains("usage") && j["usage"].is_object()) {
        r.prompt_tokens = j["usage"].value("prompt_tokens", 0);
        r.output_tokens = j["usage"].value("completion_tokens", 0);
        if (const auto d = j["usage"].find("prompt_tokens_details"); d != j["usage"].end() && d->is_object())
          r.cached_tokens = d->value("cached_tokens", 0);
      }
      if (event_text(j, chat).empty()) continue;
      const auto now = Clock::now();
      if (first) r.ttft = std::chrono::duration<double>(now - start).count(), first = false;
      else r.itl.push_back(std::chrono::duration<double>(now - last).count());
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  r.latency = std::chrono::duration<double>(Clock::now() - start).count();
  if (!sent) r.error = "connection failed: " + httplib::to_string(err);
  else if (res.status != 200) r.error = fmt::format("HTTP {}: {}", res.status, res.body.empty() ? buf : res.body);
  else if (!error_body.empty()) r.error = error_body;
  else if (first) r.error = "no tokens received";
  r.ok = r.error.empty();
  return r;
}

int run_bench_serve(BenchServeArgs& a) {
  resolve_vllm_spellings(a);
  SSM_CHECK(a.num_prompts >= 1 && a.num_prompts <= 100000, "--num-prompts must be in [1, 100000] (got {})", a.num_prompts);
  SSM_CHECK(a.request_rate >= kMinRequestRate, "--request-rate must be >= {} (inf = all at once), got {}",
            kMinRequestRate, a.request_rate);
  SSM_CHECK(a.input_len >= 1 && a.input_len <= (1 << 20), "--input-len must be in [1, {}] (got {})", 1 << 20, a.input_len);
  SSM_CHECK(a.output_len >= 1 && a.output_len <= (1 << 20), "--output-len must be in [1, {}] (got {})", 1 << 20, a.output_len);
  SSM_CHECK(a.max_concurrency >= 0 && a.max_concurrency <= 100000, "--max-concurrency must be in [0, 100000] (got {})",
            a.max_concurrency);
  SSM_CHECK(a.seed >= 0, "--seed must be >= 0 (got {})", a.seed);
  check_output_path(a.output_json);
  SSM_CHECK(a.backend == "vllm" || a.backend == "openai" || a.backend == "openai-chat",
            "--backend {} is not supported: vllm or openai (completions), openai-chat (chat completions)", a.backend);
  SSM_CHECK(a.num_warmups >= 0 && a.num_warmups <= 10000, "--num-warmups must be in [0, 10000] (got {})", a.num_warmups);
  SSM_CHECK(a.save_result || (a.result_dir.empty() && a.result_filename.empty()),
            "--result-dir / --result-filename need --save-result");
  const ServeMetricOptions metrics = parse_serve_metric_options(a.percentile_metrics, a.metric_percentiles);
  if (a.backend == "openai-chat" && !a.endpoint_given) a.endpoint = "/v1/chat/completions";
  if (a.endpoint.empty() || a.endpoint.front() != '/') a.endpoint.insert(0, "/");
  const bool chat = is_chat_endpoint(a.endpoint);
  const Url url = split_url(a.base_url);
  if (a.model.empty()) {  // the server's (first) model
    httplib::Client cli = server_client(url);
    auto res = cli.Get(url.path_prefix + "/v1/models");
    SSM_CHECK(!res || res->status != 401, "{}{}/v1/models answered 401: the server wants an API key (set OPENAI_API_KEY)",
              url.scheme_host_port, url.path_prefix);
    SSM_CHECK(res && res->status == 200, "cannot list the models at {}{}/v1/models (is the server running?)", url.scheme_host_port,
              url.path_prefix);
    check_json_depth(res->body, "the server's /v1/models answer");
    const json j = json::parse(res->body, nullptr, false);
    SSM_CHECK(!j.is_discarded() && j.contains("data") && !j["data"].empty(), "{}/v1/models returned no model", a.base_url);
    a.model = j["data"][0]["id"].get<std::string>();
  }
  const std::string result_path = result_path_of(a);
  if (!a.result_dir.empty()) {  // vLLM makes the folder
    std::error_code ec;
    std::filesystem::create_directories(a.result_dir, ec);
    SSM_CHECK(!ec, "--result-dir {}: cannot create the folder ({})", a.result_dir, ec.message());
  }
  check_output_path(result_path);
  std::vector<json> prompts = make_prompts(a);
  if (chat) detokenize_prompts(url, a.model, prompts);
  // vLLM's --num-warmups: requests before the timed run (here one at a time, the first prompt), not counted.
  for (int w = 0; w < a.num_warmups; ++w) {
    const RequestResult r = run_request(url, a.endpoint, chat, a.model, prompts.front(), a.output_len);
    SSM_CHECK(r.ok, "--num-warmups: warmup request {} failed: {}", w + 1, r.error);
  }
  // Poisson arrivals: exponential gaps of mean 1 / rate (all at t = 0 when the rate is infinite).
  std::mt19937_64 rng(static_cast<uint64_t>(a.seed) + 1);
  std::exponential_distribution<double> gap(std::isinf(a.request_rate) ? 1.0 : a.request_rate);
  std::vector<double> arrivals(prompts.size(), 0.0);
  for (size_t i = 1; i < arrivals.size(); ++i) arrivals[i] = arrivals[i - 1] + (std::isinf(a.request_rate) ? 0.0 : gap(rng));

  std::cerr << fmt::format("bench serve: {} requests to {}{}{} (model {}), request rate {}, max concurrency {}\n", prompts.size(),
                           url.scheme_host_port, url.path_prefix, a.endpoint, a.model, a.request_rate, a.max_concurrency ? std::to_string(a.max_concurrency) : fmt::format("unlimited (up to {} client threads)", kMaxClientThreads));
  std::vector<RequestResult> results(prompts.size());
  // A pool of client threads, each taking the next request in arrival order and sending it at its arrival time: at
  // most --max-concurrency in flight (unlimited: kMaxClientThreads). One thread per request kept every finished
  // thread's stack until the end and aborted the process once threads could no longer be created.
  const size_t workers = std::min<size_t>(prompts.size(), a.max_concurrency > 0 ? static_cast<size_t>(a.max_concurrency)
                                                                                : kMaxClientThreads);
  std::atomic<size_t> next{0};
  const auto t0 = Clock::now();
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < prompts.size();) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i])));
      try {
        results[i] = run_request(url, a.endpoint, chat, a.model, prompts[i], a.output_len);
      } catch (const std::exception& e) {  // a malformed answer: this request failed, not the run
        results[i].ok = false, results[i].error = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers);
  std::string spawn_error;
  for (size_t w = 0; w < workers; ++w) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error& e) {  // out of threads: go on with those started
      spawn_error = e.what();
      break;
    }
  }
  if (threads.size() < workers)
    std::cerr << fmt::format("bench serve: warning: {} of {} client threads started ({}); at most {} requests in "
                             "flight\n", threads.size(), workers, spawn_error, threads.size());
  if (threads.empty()) work();  // not even one: send them from this thread
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();

  json out = {{"date", date_now("%Y%m%d-%H%M%S")}, {"backend", a.backend}, {"model_id", a.model},
              {"tokenizer_id", a.tokenizer.empty() ? a.model : a.tokenizer}, {"base_url", a.base_url}, {"model", a.model},
              {"dataset", a.dataset}, {"num_prompts", a.num_prompts},
              {"request_rate", std::isinf(a.request_rate) ? json("inf") : json(a.request_rate)},
              {"max_concurrency", a.max_concurrency > 0 ? json(a.max_concurrency) : json(nullptr)}, {"endpoint", a.endpoint}};
  const int failed = report_serve_results(results, duration, metrics, out);
  if (!a.output_json.empty()) write_json_file(a.output_json, out);
  if (!result_path.empty()) write_json_file(result_path, out);
  std::string first_error;
  for (const auto& r : results)
    if (!r.ok) {
      first_error = r.error;
      break;
    }
  if (failed > 0) {
    std::cerr << "error: " << failed << " of " << results.size() << " requests failed; first: " << first_error << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

Runner add_bench_serve(CLI::App& bench) {
  auto a = std::make_shared<BenchServeArgs>();
  CLI::App* cmd = bench.add_subcommand("serve", "Load a running server with Poisson arrivals; throughput, TTFT, TPOT, ITL");
  CLI::Option* base_url =
      cmd->add_option("--base-url", a->base_url, "Server URL: http://host:port, optionally a path prefix (a trailing /v1 is dropped)")
          ->capture_default_str();
  cmd->add_option("--host", a->host, "vLLM's: the server's host (with --port: http://HOST:PORT; --base-url wins)");
  cmd->add_option("--port", a->port, "vLLM's: the server's port (default 8000 with --host)");
  CLI::Option* endpoint = cmd->add_option("--endpoint", a->endpoint,
                  "/v1/completions (prompts as sent) or /v1/chat/completions (each prompt one user message; random "
                  "prompts as text through the server's /detokenize), as vLLM's openai / openai-chat backends")
      ->capture_default_str();
  cmd->add_option("--model", a->model, "Model id to send (default: the server's first)");
  CLI::Option* dataset =
      cmd->add_option("--dataset", a->dataset, "JSONL file ({\"prompt\"} or {\"text\"} per line) or 'random'")->capture_default_str();
  cmd->add_option("--dataset-name", a->dataset_name, "vLLM's: random, or custom (a JSONL file of prompts: --dataset-path)");
  cmd->add_option("--dataset-path", a->dataset_path, "vLLM's: the custom dataset's JSONL file");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "vLLM's: every request sets ignore_eos already (each generates --output-len tokens)");
  cmd->add_option("--num-prompts", a->num_prompts, "Requests to send")->capture_default_str();
  cmd->add_option("--request-rate", a->request_rate, "Mean requests per second (Poisson, >= 1e-4); inf = all at once")->capture_default_str();
  cmd->add_option("--max-concurrency", a->max_concurrency, "Most requests in flight (0 = no limit beyond the 1024 client threads)")->capture_default_str();
  cmd->add_option("--input-len,--random-input-len", a->input_len, "Prompt tokens of random prompts (vLLM's --random-input-len)")
      ->capture_default_str();
  cmd->add_option("--output-len,--random-output-len", a->output_len,
                  "max_tokens of every request (ignore_eos is set; vLLM's --random-output-len)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the prompts and arrival times")->capture_default_str();
  cmd->add_option("--output-json", a->output_json, "Also write the results as JSON to this file");
  cmd->add_option("--percentile-metrics", a->percentile_metrics,
                  "vLLM's: the latency metrics reported, a comma-separated list of ttft, tpot, itl, e2el (vLLM's default "
                  "leaves out e2el)")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", a->metric_percentiles,
                  "vLLM's: the percentiles reported beside mean and median, e.g. 50,90,99")
      ->capture_default_str();
  cmd->add_flag("--save-result", a->save_result,
                "vLLM's: write the result JSON to --result-dir (default .) as --result-filename (default vLLM's "
                "{backend}-{rate}qps[-concurrency{n}]-{model}-{date}.json)");
  cmd->add_option("--result-dir", a->result_dir, "vLLM's: the folder of --save-result's file");
  cmd->add_option("--result-filename", a->result_filename, "vLLM's: the name of --save-result's file");
  cmd->add_option("--backend", a->backend,
                  "vLLM's: vllm or openai (completions), openai-chat (chat completions: --endpoint defaults to "
                  "/v1/chat/completions)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer, "vLLM's: recorded in the results only (the server tokenizes the prompts)");
  cmd->add_option("--num-warmups", a->num_warmups, "vLLM's: requests sent one at a time before the timed run, not counted")
      ->capture_default_str();
  cmd->add_flag("--disable-tqdm", a->disable_tqdm, "vLLM's: no effect (no progress bar is drawn)");
  return [a, base_url, dataset, endpoint] {
    a->base_url_given = base_url->count() > 0;
    a->dataset_given = dataset->count() > 0;
    a->endpoint_given = endpoint->count() > 0;
    return run_bench_serve(*a);
  };
}

}  // namespace ssmserve::cli
