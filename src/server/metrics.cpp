// Owns the metrics store and its Prometheus rendering (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace ssmserve::server {

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) ++counts[i];
  sum += v;
  ++count;
}

namespace {

/// vLLM's request_latency_buckets (seconds), with finer low buckets for CPU-sized models.
std::vector<double> latency_buckets() {
  return {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
          240.0, 480.0, 960.0, 1920.0, 7680.0};
}

/// vLLM's build_1_2_5_buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to 10M.
std::vector<double> token_buckets() {
  std::vector<double> b;
  for (double m = 1; m <= 1e7; m *= 10)
    for (double f : {1.0, 2.0, 5.0}) b.push_back(f * m);
  return b;
}

}  // namespace

// Buckets: vLLM's, with finer low buckets for CPU-sized models.
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0}),
      queue_(latency_buckets()),
      prefill_(latency_buckets()),
      decode_(latency_buckets()),
      inference_(latency_buckets()),
      prompt_len_(token_buckets()),
      generation_len_(token_buckets()) {}

void Metrics::observe_request(const RequestPhases& r) {
  std::lock_guard lk(mu_);
  queue_.observe(r.queue_s);
  prefill_.observe(r.prefill_s);
  decode_.observe(r.decode_s);
  inference_.observe(r.inference_s);
  prompt_len_.observe(static_cast<double>(r.prompt_tokens));
  generation_len_.observe(static_cast<double>(r.generation_tokens));
}

void Metrics::set_gauges(const EngineGauges& g) {
  std::lock_guard lk(mu_);
  gauges_ = g;
}
EngineGauges Metrics::gauges() const {
  std::lock_guard lk(mu_);
  return gauges_;
}
void Metrics::add_prompt_tokens(uint64_t n) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += n;
}
void Metrics::add_generation_tokens(uint64_t n) {
  std::lock_guard lk(mu_);
  generation_tokens_ += n;
}
void Metrics::observe_ttft(double s) {
  std::lock_guard lk(mu_);
  ttft_.observe(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard lk(mu_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard lk(mu_);
  e2e_.observe(s);
}
void Metrics::count_finished(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++finished_[reason];
}

void Metrics::set_http_connections(int n) {
  std::lock_guard lk(mu_);
  http_connections_ = n;
}

std::string Metrics::render(const std::string& model_name) const {
  std::lock_guard lk(mu_);
  std::string out;
  std::string escaped;  // Prometheus label values escape \\, \" and newlines
  for (char c : model_name) escaped += c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : std::string(1, c);
  const std::string label = fmt::format("model_name=\"{}\"", escaped);
  // Each metric under ssmserve: and, where vLLM has one of the same meaning, under vLLM's name too (`vllm_name`), so
  // dashboards, autoscalers and routers that read vLLM's metrics work unchanged.
  auto prefixes = [](const char* name, const char* vllm_name) {
    std::vector<std::string> names = {std::string("ssmserve:") + name};
    if (vllm_name) names.push_back(std::string("vllm:") + vllm_name);
    return names;
  };
  auto metric = [&](const char* name, const char* type, const char* help, double value, const char* vllm_name = nullptr) {
    for (const std::string& n : prefixes(name, vllm_name))
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", n, help, n, type, n, label, value);
  };
  metric("num_requests_running", "gauge", "Requests in the running batch.", gauges_.num_requests_running,
         "num_requests_running");
  metric("num_requests_waiting", "gauge", "Requests waiting to be scheduled.", gauges_.num_requests_waiting,
         "num_requests_waiting");
  metric("state_blocks_used", "gauge", "Blocks of the pool (recurrent states, and KV blocks of hybrid models) held by requests.", gauges_.state_blocks_used);
  metric("state_blocks_total", "gauge", "Blocks of the state / KV pool that can be handed out (null block excluded).",
         gauges_.state_blocks_total);
  metric("state_cache_usage_perc", "gauge", "Fraction of state blocks in use (vLLM's kv_cache_usage_perc).",
         gauges_.state_blocks_total ? static_cast<double>(gauges_.state_blocks_used) / gauges_.state_blocks_total : 0.0,
         "kv_cache_usage_perc");
  metric("num_preemptions_total", "counter", "Cumulative preemptions.", gauges_.num_preemptions, "num_preemptions_total");
  metric("http_connections", "gauge", "Open HTTP connections.", http_connections_);
  metric("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
         static_cast<double>(gauges_.prefix_cache_queries), "prefix_cache_queries_total");
  metric("prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.",
         static_cast<double>(gauges_.prefix_cache_hits), "prefix_cache_hits_total");
  metric("spec_decode_num_drafts_total", "counter", "Speculative decoding: verify rows that carried drafts.",
         static_cast<double>(gauges_.spec_decode_num_drafts), "spec_decode_num_drafts_total");
  metric("spec_decode_num_draft_tokens_total", "counter", "Speculative decoding: draft tokens verified.",
         static_cast<double>(gauges_.spec_decode_num_draft_tokens), "spec_decode_num_draft_tokens_total");
  metric("spec_decode_num_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted.",
         static_cast<double>(gauges_.spec_decode_num_accepted_tokens), "spec_decode_num_accepted_tokens_total");
  if (!gauges_.spec_decode_accepted_per_pos.empty()) {
    for (const std::string& n : prefixes("spec_decode_num_accepted_tokens_per_pos_total",
                                         "spec_decode_num_accepted_tokens_per_pos_total")) {
      out += fmt::format("# HELP {} Accepted draft tokens by position in their verify row.\n# TYPE {} counter\n", n, n);
      for (size_t i = 0; i < gauges_.spec_decode_accepted_per_pos.size(); ++i)
        out += fmt::format("{}{{{},position=\"{}\"}} {}\n", n, label, i, gauges_.spec_decode_accepted_per_pos[i]);
    }
  }
  metric("prompt_tokens_total", "counter", "Prefilled prompt tokens.", static_cast<double>(prompt_tokens_),
         "prompt_tokens_total");
  metric("generation_tokens_total", "counter", "Generated tokens.", static_cast<double>(generation_tokens_),
         "generation_tokens_total");
  for (const std::string& n : prefixes("request_success_total", "request_success_total")) {
    out += fmt::format("# HELP {} Finished requests by finish reason.\n# TYPE {} counter\n", n, n);
    for (const char* reason : {"stop", "length", "abort"}) {
      auto it = finished_.find(reason);
      out += fmt::format("{}{{{},finished_reason=\"{}\"}} {}\n", n, label, reason, it == finished_.end() ? 0 : it->second);
    }
  }
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    for (const std::string& n : prefixes(name, name)) {
      out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", n, help, n);
      for (size_t i = 0; i < h.bounds.size(); ++i)
        out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", n, label, h.bounds[i], h.counts[i]);
      out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", n, label, h.count);
      out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", n, label, h.sum, n, label, h.count);
    }
  };
  histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.", ttft_);
  histogram("inter_token_latency_seconds", "Time between consecutive token deliveries of a request (a --num-scheduler-steps burst counts once, as vLLM counts steps).", itl_);
  histogram("e2e_request_latency_seconds", "Time from arrival to the last token.", e2e_);
  histogram("request_queue_time_seconds", "Finished requests: time from arrival to being handed to the engine.", queue_);
  histogram("request_prefill_time_seconds", "Finished requests: time from being handed to the engine to the first token.",
            prefill_);
  histogram("request_decode_time_seconds", "Finished requests: time from the first to the last token.", decode_);
  histogram("request_inference_time_seconds", "Finished requests: time from being handed to the engine to the last token.",
            inference_);
  histogram("request_prompt_tokens", "Finished requests: prompt tokens.", prompt_len_);
  histogram("request_generation_tokens", "Finished requests: generated tokens.", generation_len_);
  return out;
}

std::pair<uint64_t, uint64_t> Metrics::token_totals() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {prompt_tokens_, generation_tokens_};
}

std::string StatsLine::next(const Metrics& metrics, double seconds) {
  const auto [prompt, generation] = metrics.token_totals();
  const EngineGauges g = metrics.gauges();
  const uint64_t dp = prompt - prompt_, dg = generation - generation_;
  const int64_t dq = g.prefix_cache_queries - queries_, dh = g.prefix_cache_hits - hits_;
  prompt_ = prompt, generation_ = generation, queries_ = g.prefix_cache_queries, hits_ = g.prefix_cache_hits;
  if (dp == 0 && dg == 0 && g.num_requests_running == 0 && g.num_requests_waiting == 0) return "";
  std::string line = fmt::format(
      "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, Running: {} reqs, Waiting: "
      "{} reqs, state cache usage: {:.1f}%",
      static_cast<double>(dp) / seconds, static_cast<double>(dg) / seconds, g.num_requests_running,
      g.num_requests_waiting,
      g.state_blocks_total > 0 ? 100.0 * g.state_blocks_used / g.state_blocks_total : 0.0);
  if (g.prefix_cache_queries > 0)
    line += fmt::format(", Prefix cache hit rate: {:.1f}%", dq > 0 ? 100.0 * static_cast<double>(dh) / static_cast<double>(dq) : 0.0);
  return line;
}

}  // namespace ssmserve::server
