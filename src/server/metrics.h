// Owns the server's metrics and their Prometheus text rendering (GET /metrics), with vLLM's metric meanings under
// the `ssmserve:` prefix: request gauges, state-block usage, token counters, TTFT / inter-token histograms; those vLLM
// also defines are rendered under vLLM's names (`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`, ...) too.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ssmserve::server {

/// A cumulative Prometheus histogram: counts[i] = observations <= bounds[i] (plus +Inf = count). Seconds.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> counts;  // [bounds.size()], cumulative when rendered
  double sum = 0.0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size(), 0) {}
  void observe(double v);
};

/// Gauges set after every engine step.
struct EngineGauges {
  int num_requests_running = 0;
  int num_requests_waiting = 0;   ///< the engine's waiting queue plus requests not yet handed to it
  int state_blocks_used = 0;
  int state_blocks_total = 0;     ///< blocks that can be handed out (the null block excluded)
  int num_preemptions = 0;        ///< cumulative
  int64_t prefix_cache_queries = 0;  ///< cumulative prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;     ///< cumulative of those served from it
  int64_t spec_decode_num_drafts = 0;           ///< speculative decoding: verify rows with drafts (cumulative)
  int64_t spec_decode_num_draft_tokens = 0;     ///< draft tokens verified (cumulative)
  int64_t spec_decode_num_accepted_tokens = 0;  ///< draft tokens accepted (cumulative)
  std::vector<int64_t> spec_decode_accepted_per_pos;  ///< [k] accepted drafts by position in their row (cumulative)
};

/// One finished request's phases (vLLM's per-request histograms), seconds: queue (arrival -> handed to the engine),
/// prefill (-> its first token), decode (first -> last token), inference (handed to the engine -> last token); and
/// its prompt and generated token counts.
struct RequestPhases {
  double queue_s = 0, prefill_s = 0, decode_s = 0, inference_s = 0;
  uint64_t prompt_tokens = 0, generation_tokens = 0;
};

/// Thread-safe metrics store: the engine thread records, HTTP handlers render.
class Metrics {
 public:
  Metrics();
  void set_gauges(const EngineGauges& g);
  EngineGauges gauges() const;
  void add_prompt_tokens(uint64_t n);
  void add_generation_tokens(uint64_t n);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  void observe_e2e(double seconds);
  /// A finished request's phases and token counts (request_queue_time_seconds ... request_generation_tokens).
  void observe_request(const RequestPhases& r);
  /// Open HTTP connections now (set before rendering).
  void set_http_connections(int n);
  /// Counts a finished request by finish reason ("stop", "length", "abort").
  void count_finished(const std::string& reason);
  /// The Prometheus text exposition (version 0.0.4) of everything above, labelled with model_name.
  std::string render(const std::string& model_name) const;
  /// Cumulative prompt and generated tokens {prompt, generation} (the counters /metrics renders).
  std::pair<uint64_t, uint64_t> token_totals() const;

 private:
  mutable std::mutex mu_;
  EngineGauges gauges_;
  int http_connections_ = 0;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
  Histogram queue_, prefill_, decode_, inference_;  // seconds per finished request
  Histogram prompt_len_, generation_len_;           // tokens per finished request
  std::map<std::string, uint64_t> finished_;
};

/// vLLM's periodic stats line (its LoggingStatLogger): throughput since the previous line, requests, state blocks and
/// prefix-cache hits, e.g. "Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 96.3 tokens/s, Running:
/// 3 reqs, Waiting: 0 reqs, state cache usage: 2.4%, Prefix cache hit rate: 50.0%". Returns "" when nothing ran since
/// the previous line and nothing runs or waits now (an idle server stays quiet). Not thread-safe: one caller.
class StatsLine {
 public:
  /// metrics: read at each next(); seconds: the time since the previous call (> 0).
  std::string next(const Metrics& metrics, double seconds);

 private:
  uint64_t prompt_ = 0, generation_ = 0;
  int64_t queries_ = 0, hits_ = 0;
};

}  // namespace ssmserve::server
