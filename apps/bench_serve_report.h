// Owns what `ssmserve bench serve` reports from its requests' measurements: vLLM's `bench serve` result table and
// result JSON (throughput; per metric mean, median, std and the chosen percentiles), with --percentile-metrics and
// --metric-percentiles as vLLM reads them.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ssmserve::cli {

/// One request's measurements (seconds).
struct RequestResult {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0, output_tokens = 0;
  int cached_tokens = 0;       ///< usage.prompt_tokens_details.cached_tokens (prompt tokens served from the prefix cache)
  double ttft = 0, latency = 0;
  std::vector<double> itl;     ///< gaps between consecutive content chunks
};

/// Which latency metrics the report shows and at which percentiles.
struct ServeMetricOptions {
  std::vector<std::string> metrics;  ///< of ttft, tpot, itl, e2el, in the order given
  std::vector<double> percentiles;   ///< each in (0, 100]
};

/// Parses vLLM's --percentile-metrics ("ttft,tpot,itl,e2el") and --metric-percentiles ("50,90,99"). Throws Error
/// naming the flag for an unknown metric, an empty list, or a percentile outside (0, 100].
ServeMetricOptions parse_serve_metric_options(const std::string& metrics, const std::string& percentiles);

/// Aggregates `results` over the run's `duration` seconds into `run` (the run's settings, kept as given) and prints
/// vLLM's result table to stdout. Adds vLLM's result fields (duration, completed, total_input_tokens,
/// total_output_tokens, request_throughput, output_throughput, total_token_throughput, input_lens, output_lens,
/// ttfts, itls (seconds), errors, and per chosen metric mean_X_ms, median_X_ms, std_X_ms, pP_X_ms) and ssmserve's
/// (failed, duration_s, total_cached_tokens, prefix_cache_hit_rate). Returns the number of failed requests.
int report_serve_results(const std::vector<RequestResult>& results, double duration, const ServeMetricOptions& m,
                         nlohmann::json& run);

}  // namespace ssmserve::cli
