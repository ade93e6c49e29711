// Tests StatsLine, `serve`'s periodic stats line (vLLM's LoggingStatLogger): throughput over the interval from the
// token counters, the request / state-cache gauges, the prefix-cache hit rate over the interval, quiet while idle.
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace ssmserve::server {
namespace {

TEST(StatsLine, ThroughputOverTheIntervalAndQuietWhenIdle) {
  Metrics m;
  StatsLine stats;
  EXPECT_EQ(stats.next(m, 10.0), "");  // nothing ran, nothing runs
  m.add_prompt_tokens(500);
  m.add_generation_tokens(100);
  EngineGauges g;
  g.num_requests_running = 2;
  g.num_requests_waiting = 1;
  g.state_blocks_used = 5;
  g.state_blocks_total = 200;
  m.set_gauges(g);
  EXPECT_EQ(stats.next(m, 10.0),
            "Avg prompt throughput: 50.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 2 reqs, "
            "Waiting: 1 reqs, state cache usage: 2.5%");
  // Only what ran since the previous line counts; the prefix-cache rate too, once the cache has been queried.
  m.add_generation_tokens(40);
  g.prefix_cache_queries = 100;
  g.prefix_cache_hits = 25;
  m.set_gauges(g);
  EXPECT_EQ(stats.next(m, 4.0),
            "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 2 reqs, "
            "Waiting: 1 reqs, state cache usage: 2.5%, Prefix cache hit rate: 25.0%");
  g.num_requests_running = g.num_requests_waiting = 0;
  m.set_gauges(g);
  EXPECT_EQ(stats.next(m, 10.0), "");  // idle again: quiet
}

}  // namespace
}  // namespace ssmserve::server
