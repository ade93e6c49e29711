// Owns `ssmserve bench multiturn`: the time to first token of a conversation turn whose history is in the prefix
// cache, against the same turn uncached, for several history lengths (issue 28's benchmark). Each repeat builds a
// history of random token ids, runs it as turn 1 (generating --output-len tokens), then sends turn 2 = history +
// turn 1's answer + --turn-tokens new tokens and times it (cached), then the same turn 2 with its first token changed
// (no prefix shared: uncached) on the same engine. Reports medians per history length, the ratio and the hit rate.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <vector>

#include "apps/bench_stats.h"
#include "apps/commands.h"
#include "core/error.h"
#include "engine/llm_engine.h"

namespace ssmserve::cli {
namespace {

struct MultiTurnArgs {
  EngineConfig engine;
  std::string load_format = "auto";
  std::vector<int> history_lens = {1024, 2048, 4096, 8192};
  bool history_lens_given = false;  // --history-lens on the command line (else the defaults, trimmed to the context)
  int turn_tokens = 200;
  int output_len = 32;
  int num_iters = 3;
  long long seed = 0;
  std::string output_json;
};


/// Runs `prompt` alone (greedy, ignore_eos, max_tokens tokens); returns (seconds to its first output token, the
/// generated ids, num_cached_tokens).
struct TurnResult {
  double ttft = 0.0;
  std::vector<int> ids;
  int cached = 0;
};
TurnResult run_turn(LLMEngine& e, const std::vector<int>& prompt, int max_tokens, const std::string& id) {
  Request r;
  r.request_id = id;
  r.prompt_token_ids = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  TurnResult t;
  const auto t0 = std::chrono::steady_clock::now();
  e.add_request(std::move(r));
  bool first = true;
  while (e.has_unfinished_requests())
    for (const RequestOutput& o : e.step()) {
      if (first && !o.outputs.at(0).token_ids.empty()) {
        t.ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        first = false;
      }
      if (o.finished) t.ids = o.outputs[0].token_ids, t.cached = o.num_cached_tokens;
    }
  return t;
}

int run_multiturn(MultiTurnArgs& a) {
  resolve_engine_config(a.engine, a.load_format);
  SSM_CHECK(!a.history_lens.empty(), "--history-lens needs at least one length");
  for (int h : a.history_lens)
    SSM_CHECK(h >= 1 && h <= kMaxNumBatchedTokens, "--history-lens values must be in [1, {}] (got {})", kMaxNumBatchedTokens, h);
  SSM_CHECK(a.turn_tokens >= 1 && a.turn_tokens <= 1 << 20, "--turn-tokens must be in [1, {}] (got {})", 1 << 20, a.turn_tokens);
  SSM_CHECK(a.output_len >= 1 && a.output_len <= 1 << 20, "--output-len must be in [1, {}] (got {})", 1 << 20, a.output_len);
  SSM_CHECK(a.num_iters >= 1 && a.num_iters <= 1000, "--num-iters must be in [1, 1000] (got {})", a.num_iters);
  check_output_path(a.output_json);
  LLMEngine engine(a.engine);
  SSM_CHECK(engine.prefix_cache_config().enabled(), "bench multiturn measures prefix caching: drop --no-enable-prefix-caching "
                                                    "/ --mamba-cache-mode none");
  // The longest prompt is turn 2 (history + turn 1's answer + the new tokens), and it must leave room for one
  // generated token: check every length now, not after the shorter ones have run. Default lengths that do not fit
  // are left out; given ones are an error naming the flags. The limit is the context (max_model_len) and, for hybrid
  // models, the tokens one request's KV blocks can take in the block pool (--num-state-blocks).
  int ctx = engine.max_model_len();
  std::string limit = "the context (max_model_len)";
  if (const int cap = engine.pool_token_capacity(); cap > 0 && (ctx <= 0 || cap < ctx))
    ctx = cap, limit = "what one request's KV blocks can take in the block pool (--num-state-blocks)";
  if (ctx > 0) {
    const auto fits = [&](int h) { return static_cast<long long>(h) + a.output_len + a.turn_tokens < ctx; };
    if (!a.history_lens_given) {
      std::erase_if(a.history_lens, [&](int h) { return !fits(h); });
      SSM_CHECK(!a.history_lens.empty(),
                "{}, {} tokens, is too short for the default --history-lens with --output-len {} + --turn-tokens {}: "
                "pass shorter --history-lens",
                limit, ctx, a.output_len, a.turn_tokens);
    }
    for (int h : a.history_lens)
      SSM_CHECK(fits(h), "--history-lens {} + --output-len {} + --turn-tokens {} leave no room for a token within {}, {} tokens",
                h, a.output_len, a.turn_tokens, limit, ctx);
  }
  const int V = engine.model_config().vocab_size;
  std::mt19937_64 rng(static_cast<uint64_t>(a.seed));
  auto random_ids = [&](int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int& t : v) t = static_cast<int>(rng() % static_cast<uint64_t>(std::max(1, V - 1)));
    return v;
  };
  std::cout << "model: " << a.engine.model.string() << ", mamba_block_size " << engine.prefix_cache_config().block_size
            << ", turn: history + " << a.output_len << "-token answer + " << a.turn_tokens << " new tokens, median of "
            << a.num_iters << "\n"
            << std::setw(10) << "history" << std::setw(14) << "cached tokens" << std::setw(16) << "TTFT cached ms" << std::setw(18)
            << "TTFT uncached ms" << std::setw(9) << "ratio\n";
  nlohmann::json rows = nlohmann::json::array();
  int counter = 0;
  for (int h : a.history_lens) {
    std::vector<double> cached_s, uncached_s;
    int cached_tokens = 0;
    // One untimed turn first (allocations, kernels' first use).
    run_turn(engine, random_ids(std::min(h, 64)), 1, "warm" + std::to_string(counter++));
    for (int it = 0; it < a.num_iters; ++it) {
      const std::vector<int> history = random_ids(h);
      const TurnResult t1 = run_turn(engine, history, a.output_len, "t1-" + std::to_string(counter++));
      std::vector<int> turn2 = history;
      turn2.insert(turn2.end(), t1.ids.begin(), t1.ids.end());
      const std::vector<int> added = random_ids(a.turn_tokens);
      turn2.insert(turn2.end(), added.begin(), added.end());
      const TurnResult t2 = run_turn(engine, turn2, 1, "t2-" + std::to_string(counter++));
      cached_s.push_back(t2.ttft);
      cached_tokens = t2.cached;
      turn2[0] = (turn2[0] + 1) % V;  // nothing shared with anything cached
      uncached_s.push_back(run_turn(engine, turn2, 1, "t2u-" + std::to_string(counter++)).ttft);
    }
    const double c = median(cached_s), u = median(uncached_s);
    std::cout << std::fixed << std::setw(10) << h << std::setw(14) << cached_tokens << std::setw(16) << std::setprecision(1)
              << 1e3 * c << std::setw(18) << 1e3 * u << std::setw(8) << std::setprecision(3) << (u > 0 ? c / u : 0.0)
              // A history shorter than a cache block caches nothing: both columns are uncached turns (the ratio is noise).
              << (cached_tokens > 0 ? ""
                  : h < engine.prefix_cache_config().block_size ? "  (nothing cached: history below mamba_block_size)"
                                                                 : "  (nothing cached)")
              << "\n";
    rows.push_back({{"history_len", h}, {"cached_tokens", cached_tokens}, {"ttft_cached_s", c}, {"ttft_uncached_s", u},
                    {"ratio", u > 0 ? c / u : 0.0}});
  }
  const PrefixCacheStats st = engine.prefix_cache_stats();
  std::cout << "prefix cache: hit rate " << std::setprecision(1) << 100.0 * st.hit_rate() << "% (" << st.hits << " of "
            << st.queries << " prompt tokens)\n";
  if (!a.output_json.empty())
    write_json_file(a.output_json, {{"model", a.engine.model.string()},
                                    {"mamba_block_size", engine.prefix_cache_config().block_size},
                                    {"turn_tokens", a.turn_tokens},
                                    {"output_len", a.output_len},
                                    {"rows", rows},
                                    {"prefix_cache_hit_rate", st.hit_rate()}});
  return 0;
}

}  // namespace

Runner add_bench_multiturn(CLI::App& bench) {
  auto a = std::make_shared<MultiTurnArgs>();
  CLI::App* cmd = bench.add_subcommand("multiturn", "Time to first token of a conversation turn with its history in the prefix "
                                                    "cache vs uncached, per history length");
  add_engine_options(*cmd, a->engine, a->load_format);
  const auto check_max_model_len = add_engine_max_model_len(*cmd, a->engine);
  CLI::Option* history_lens =
      cmd->add_option("--history-lens", a->history_lens,
                      "History lengths in tokens (several values; by default those that fit the context)")
          ->capture_default_str();
  cmd->add_option("--turn-tokens", a->turn_tokens, "New tokens each turn appends")->capture_default_str();
  cmd->add_option("--output-len", a->output_len, "Tokens the model answers in turn 1")->capture_default_str();
  cmd->add_option("--num-iters", a->num_iters, "Conversations per history length (the median is reported)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the random token ids")->capture_default_str();
  cmd->add_option("--output-json", a->output_json, "Also write the results to this JSON file");
  return [a, cmd, check_max_model_len, history_lens]() -> int {
    if (!cmd->parsed()) return -1;
    check_max_model_len();
    a->history_lens_given = history_lens->count() > 0;
    return run_multiturn(*a);
  };
}

}  // namespace ssmserve::cli
