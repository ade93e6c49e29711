// Tests Metrics::render (GET /metrics): every metric under ssmserve:, and under vLLM's name where vLLM defines the same
// metric, so dashboards and autoscalers reading vLLM's names work unchanged; the same values under both.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "server/metrics.h"

namespace ssmserve::server {
namespace {

/// The samples of a Prometheus text exposition: "name{labels}" -> value (comments skipped).
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return out;
}

TEST(Metrics, VllmNamesCarryTheSameValues) {
  Metrics m;
  EngineGauges g;
  g.num_requests_running = 3;
  g.num_requests_waiting = 2;
  g.state_blocks_used = 5;
  g.state_blocks_total = 20;
  g.prefix_cache_queries = 100;
  g.prefix_cache_hits = 40;
  m.set_gauges(g);
  m.add_prompt_tokens(77);
  m.add_generation_tokens(9);
  m.count_finished("stop");
  m.observe_ttft(0.02);
  m.observe_request({0.004, 0.3, 1.2, 1.5, 33, 7});
  const auto s = samples(m.render("tiny"));
  const std::string l = "{model_name=\"tiny\"}";
  for (const auto& [ours, vllm] : std::map<std::string, std::string>{
           {"num_requests_running", "num_requests_running"},
           {"num_requests_waiting", "num_requests_waiting"},
           {"state_cache_usage_perc", "kv_cache_usage_perc"},
           {"prefix_cache_hits_total", "prefix_cache_hits_total"},
           {"prompt_tokens_total", "prompt_tokens_total"},
           {"generation_tokens_total", "generation_tokens_total"},
           {"time_to_first_token_seconds_count", "time_to_first_token_seconds_count"},
           {"request_queue_time_seconds_sum", "request_queue_time_seconds_sum"},
           {"request_inference_time_seconds_count", "request_inference_time_seconds_count"},
           {"request_prompt_tokens_sum", "request_prompt_tokens_sum"}}) {
    ASSERT_TRUE(s.count("ssmserve:" + ours + l)) << ours;
    ASSERT_TRUE(s.count("vllm:" + vllm + l)) << vllm;
    EXPECT_EQ(s.at("ssmserve:" + ours + l), s.at("vllm:" + vllm + l)) << vllm;
  }
  EXPECT_EQ(s.at("vllm:kv_cache_usage_perc" + l), "0.25");
  // The per-request phases land in their buckets (cumulative): prefill 0.3 s is in le=0.3, not in le=0.1.
  EXPECT_EQ(s.at("vllm:request_prefill_time_seconds_bucket{model_name=\"tiny\",le=\"0.3\"}"), "1");
  EXPECT_EQ(s.at("vllm:request_prefill_time_seconds_bucket{model_name=\"tiny\",le=\"0.1\"}"), "0");
  EXPECT_EQ(s.at("vllm:request_decode_time_seconds_sum" + l), "1.2");
  EXPECT_EQ(s.at("vllm:request_generation_tokens_bucket{model_name=\"tiny\",le=\"10\"}"), "1");
  EXPECT_EQ(s.at("vllm:request_generation_tokens_bucket{model_name=\"tiny\",le=\"5\"}"), "0");
  EXPECT_EQ(s.at("vllm:request_prompt_tokens_sum" + l), "33");
  EXPECT_EQ(s.at("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"}"), "1");
  // ssmserve's own (no vLLM counterpart) only under ssmserve:.
  EXPECT_TRUE(s.count("ssmserve:state_blocks_used" + l));
  EXPECT_FALSE(s.count("vllm:state_blocks_used" + l));
  EXPECT_FALSE(s.count("vllm:http_connections" + l));
}

}  // namespace
}  // namespace ssmserve::server
