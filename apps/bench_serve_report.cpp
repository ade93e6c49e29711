// Owns bench serve's result table and JSON (see bench_serve_report.h).
#include "apps/bench_serve_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include "apps/bench_stats.h"
#include "core/error.h"

namespace ssmserve::cli {
namespace {

using nlohmann::json;

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

/// Population standard deviation (numpy's np.std, as vLLM's std_* fields).
double stddev(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

/// vLLM's name of a percentile: "99" for 99.0, "99.9" for 99.9.
std::string percentile_word(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<long long>(p));
  return fmt::format("{}", p);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    std::string w = s.substr(b, e - b);
    w.erase(0, w.find_first_not_of(" \t"));
    w.erase(w.find_last_not_of(" \t") + 1);
    out.push_back(w);
    b = e + 1;
  }
  return out;
}

}  // namespace

ServeMetricOptions parse_serve_metric_options(const std::string& metrics, const std::string& percentiles) {
  ServeMetricOptions m;
  for (const std::string& w : split_commas(metrics)) {
    SSM_CHECK(w == "ttft" || w == "tpot" || w == "itl" || w == "e2el",
              "--percentile-metrics: unknown metric \"{}\" (a comma-separated list of ttft, tpot, itl, e2el)", w);
    if (std::find(m.metrics.begin(), m.metrics.end(), w) == m.metrics.end()) m.metrics.push_back(w);
  }
  for (const std::string& w : split_commas(percentiles)) {
    double p = 0;
    size_t used = 0;
    try {
      p = std::stod(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SSM_CHECK(used == w.size() && !w.empty() && p > 0 && p <= 100,
              "--metric-percentiles: \"{}\" is not a percentile in (0, 100] (a comma-separated list, e.g. 50,90,99)", w);
    if (std::find(m.percentiles.begin(), m.percentiles.end(), p) == m.percentiles.end()) m.percentiles.push_back(p);
  }
  return m;
}

int report_serve_results(const std::vector<RequestResult>& results, double duration, const ServeMetricOptions& m,
                         json& out) {
  int completed = 0;
  long long in_tokens = 0, out_tokens = 0, cached_tokens = 0;
  std::map<std::string, std::vector<double>> values;  // metric -> seconds
  json errors = json::array(), input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array();
  for (const auto& r : results) {
    errors.push_back(r.ok ? std::string() : r.error.substr(0, 500));  // vLLM's: "" for a success
    input_lens.push_back(r.ok ? r.prompt_tokens : 0);
    output_lens.push_back(r.ok ? r.output_tokens : 0);
    ttfts.push_back(r.ok ? r.ttft : 0.0);
    itls.push_back(r.ok ? json(r.itl) : json::array());
    if (!r.ok) continue;
    ++completed;
    in_tokens += r.prompt_tokens;
    out_tokens += r.output_tokens;
    cached_tokens += r.cached_tokens;
    values["ttft"].push_back(r.ttft);
    values["e2el"].push_back(r.latency);
    if (r.output_tokens > 1) values["tpot"].push_back((r.latency - r.ttft) / (r.output_tokens - 1));
    values["itl"].insert(values["itl"].end(), r.itl.begin(), r.itl.end());
  }
  const int failed = static_cast<int>(results.size()) - completed;
  const double hit_rate = in_tokens > 0 ? static_cast<double>(cached_tokens) / static_cast<double>(in_tokens) : 0.0;
  out["completed"] = completed, out["failed"] = failed, out["duration"] = duration, out["duration_s"] = duration;
  out["total_input_tokens"] = in_tokens, out["total_output_tokens"] = out_tokens, out["total_cached_tokens"] = cached_tokens;
  out["prefix_cache_hit_rate"] = hit_rate;
  out["request_throughput"] = completed / duration;
  out["output_throughput"] = static_cast<double>(out_tokens) / duration;
  out["total_token_throughput"] = static_cast<double>(in_tokens + out_tokens) / duration;
  out["input_lens"] = std::move(input_lens), out["output_lens"] = std::move(output_lens);
  out["ttfts"] = std::move(ttfts), out["itls"] = std::move(itls), out["errors"] = std::move(errors);
  for (const std::string& name : m.metrics) {
    const std::vector<double>& v = values[name];
    out[fmt::format("mean_{}_ms", name)] = 1000 * mean(v);
    out[fmt::format("median_{}_ms", name)] = 1000 * percentile(v, 50);
    out[fmt::format("std_{}_ms", name)] = 1000 * stddev(v);
    for (double p : m.percentiles) out[fmt::format("p{}_{}_ms", percentile_word(p), name)] = 1000 * percentile(v, p);
  }
  std::cout << "============ Serving Benchmark Result ============\n";
  auto row = [](const std::string& k, const std::string& v) { std::cout << fmt::format("{:<40}{:>10}\n", k, v); };
  row("Successful requests:", std::to_string(completed));
  row("Failed requests:", std::to_string(failed));
  row("Benchmark duration (s):", fmt::format("{:.2f}", duration));
  row("Total input tokens:", std::to_string(in_tokens));
  row("Total generated tokens:", std::to_string(out_tokens));
  // From usage.prompt_tokens_details.cached_tokens: the share of prompt tokens the server's prefix cache served.
  row("Cached prompt tokens:", std::to_string(cached_tokens));
  row("Prefix cache hit rate (%):", fmt::format("{:.2f}", 100.0 * hit_rate));
  row("Request throughput (req/s):", fmt::format("{:.2f}", completed / duration));
  row("Output token throughput (tok/s):", fmt::format("{:.2f}", out_tokens / duration));
  row("Total token throughput (tok/s):", fmt::format("{:.2f}", (in_tokens + out_tokens) / duration));
  const std::map<std::string, std::pair<std::string, std::string>> titles = {
      {"ttft", {"Time to First Token", "TTFT"}},
      {"tpot", {"Time per Output Token (excl. 1st token)", "TPOT"}},
      {"itl", {"Inter-token Latency", "ITL"}},
      {"e2el", {"End-to-end Latency", "E2EL"}}};
  for (const std::string& name : m.metrics) {
    const auto& [title, abbr] = titles.at(name);
    std::cout << fmt::format("{:-^50}\n", title);
    row(fmt::format("Mean {} (ms):", abbr), fmt::format("{:.2f}", out[fmt::format("mean_{}_ms", name)].get<double>()));
    row(fmt::format("Median {} (ms):", abbr), fmt::format("{:.2f}", out[fmt::format("median_{}_ms", name)].get<double>()));
    for (double p : m.percentiles)
      row(fmt::format("P{} {} (ms):", percentile_word(p), abbr),
          fmt::format("{:.2f}", out[fmt::format("p{}_{}_ms", percentile_word(p), name)].get<double>()));
  }
  std::cout << "==================================================" << std::endl;
  return failed;
}

}  // namespace ssmserve::cli
