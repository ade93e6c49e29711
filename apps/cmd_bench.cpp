// Owns `ssmserve bench latency`: prefill and decode throughput of one batch of random prompts through the
// engine (vLLM's benchmark_latency), median over repeats, optionally written as JSON; with the replay drafter
// (--speculative-config '{"method": "replay", ...}' --replay-acceptance-rates ...), speculative decode tokens/s
// against the acceptance rate next to the plain rate (issue 29).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <iomanip>
#include <map>
#include <random>
#include <sstream>

#include "apps/bench_stats.h"
#include "apps/commands.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "engine/replay_proposer.h"

namespace ssmserve::cli {
namespace {

struct BenchArgs {
  EngineConfig engine;
  std::string load_format = "auto";
  int input_len = 32;
  int output_len = 128;
  int batch_size = 1;            ///< the batch being run (one of batch_sizes)
  std::vector<int> batch_sizes{1};  ///< --batch-size: one or more sizes, each measured on the same engine
  int num_iters = 5;
  int num_iters_warmup = 1;
  std::string output_json;
  /// --replay-acceptance-rates: one replay run per rate (method replay; empty = the config's acceptance_rate)
  std::vector<double> replay_rates;
};

constexpr int kMaxOutputLen = 1 << 20;  ///< --output-len
constexpr int kMaxIters = 1 << 20;      ///< --num-iters, --num-iters-warmup


/// One timed run: returns {prefill seconds, decode seconds} for the whole batch (engine steps with and without prompt
/// tokens). The prompts depend on `iter` only (request b of a batch is the same for every batch size). `record`: when
/// given, each request's output token ids are stored under its prompt (the continuations the replay drafter replays).
/// `decode_forward`: when given, the decode steps' seconds inside the model's forward are added to it.
std::pair<double, double> run_once(LLMEngine& engine, const BenchArgs& a, int iter,
                                   ReplayProposer::Continuations* record = nullptr, double* decode_forward = nullptr) {
  std::mt19937 rng(1234 + iter);
  std::uniform_int_distribution<int> tok(0, std::min(engine.model_config().vocab_size, 50000) - 1);
  for (int b = 0; b < a.batch_size; ++b) {
    Request r;
    r.request_id = "bench-" + std::to_string(iter) + "-" + std::to_string(b);
    for (int i = 0; i < a.input_len; ++i) r.prompt_token_ids.push_back(tok(rng));
    r.params.max_tokens = a.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = 0.0;
    engine.add_request(std::move(r));
  }
  double prefill = 0.0, decode = 0.0;
  while (engine.has_unfinished_requests()) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<RequestOutput> outs = engine.step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const StepStats& st = engine.last_step_stats();
    (st.num_prefill_tokens > 0 ? prefill : decode) += s;
    if (st.num_prefill_tokens == 0 && decode_forward) *decode_forward += st.forward_seconds;
    if (record)
      for (RequestOutput& o : outs)
        if (o.finished) (*record)[o.prompt_token_ids] = std::move(o.outputs.at(0).token_ids);
  }
  return {prefill, decode};
}

/// Tokens/s of the timed iterations (the warmup ones are run but not kept).
struct Measured {
  std::vector<double> prefill_tps, decode_tps;
  std::vector<double> decode_outside_us;  ///< per iteration: microseconds per decode step outside the model's forward
  std::vector<double> latencies;          ///< per iteration: seconds from the batch's arrival to its last token (vLLM's)
};

/// Runs the warmup and timed iterations at a.batch_size on `engine` (a progress bar on stderr).
Measured measure(LLMEngine& engine, const BenchArgs& a, ReplayProposer::Continuations* record = nullptr) {
  Measured m;
  const int total = a.num_iters_warmup + a.num_iters;
  for (int it = 0; it < total; ++it) {
    std::cerr << "\r[" << std::string(it * 30 / total, '#') << std::string(30 - it * 30 / total, ' ') << "] " << it << "/" << total
              << (it < a.num_iters_warmup ? " (warmup)" : "         ") << std::flush;
    double fwd = 0.0;
    auto [p, d] = run_once(engine, a, it, record, &fwd);
    if (it < a.num_iters_warmup) continue;
    m.prefill_tps.push_back(a.batch_size * static_cast<double>(a.input_len) / p);
    m.decode_tps.push_back(a.batch_size * static_cast<double>(a.output_len - 1) / d);
    m.decode_outside_us.push_back(1e6 * (d - fwd) / (a.output_len - 1));
    m.latencies.push_back(p + d);
  }
  std::cerr << "\r[" << std::string(30, '#') << "] " << total << "/" << total << "           \n";
  return m;
}

/// The engine for a.engine, its state pool sized for a.batch_size requests held at once (with their speculative
/// state columns and, for hybrids, their KV blocks). `seqs_raised`: max-num-seqs was raised to the batch size.
/// `later_spec_k`: the speculative tokens of an engine built after this one on the same pool (the replay bench's plain
/// pass checks a hand-given pool for its speculative pass too, before running anything).
std::unique_ptr<LLMEngine> build_engine(BenchArgs& a, bool seqs_raised, int later_spec_k = 0) {
  const bool auto_blocks = a.engine.num_state_blocks == 0;
  const int spec_k = SpeculativeConfig::parse(a.engine.speculative_config).num_speculative_tokens;
  // One block per sequence, its speculative state columns, and (prefix caching) room for one cached state.
  if (auto_blocks) {
    a.engine.num_state_blocks = a.batch_size * (1 + spec_k) + 1 + (a.engine.enable_prefix_caching ? 1 : 0);
    a.engine.validate();  // the sized pool (run_latency checked the user's flags as given)
  }
  // Only the batch's requests ever run, so the scheduler admits that many, whoever sized the pool (the engine
  // otherwise warns that a pool holding the batch leaves no room for cached states next to --max-num-seqs 256 running
  // requests).
  a.engine.scheduler.max_num_seqs = a.batch_size;
  std::unique_ptr<LLMEngine> engine_ptr;
  try {
    engine_ptr = std::make_unique<LLMEngine>(a.engine);
  } catch (const Error& e) {
    if (!seqs_raised) throw;
    fail("--batch-size {} (max-num-seqs is raised to the batch size): {}", a.batch_size, e.what());
  }
  // Every request of the batch runs at once only when the pool holds its state block, its speculative state columns
  // and (hybrid model) the KV blocks of its whole prompt and output.
  const int bs = engine_ptr->kv_block_size();
  const auto kv_for = [&](int k) { return bs > 0 ? (int64_t{a.input_len} + a.output_len + k + bs - 1) / bs : 0; };
  const auto needed_for = [&](int k) { return int64_t{a.batch_size} * (1 + k + kv_for(k)) + 1; };
  if (bs > 0 && auto_blocks) {
    // Hybrid model: its KV blocks share the pool, so size it for the whole batch's KV as well.
    a.engine.num_state_blocks = static_cast<int>(needed_for(spec_k));
    engine_ptr.reset();
    engine_ptr = std::make_unique<LLMEngine>(a.engine);
  }
  const int check_k = std::max(spec_k, later_spec_k);
  const int64_t kv_per_seq = kv_for(check_k), needed = needed_for(check_k);
  // A smaller pool given by hand would run the batch a few requests at a time, and the numbers would not be the
  // batch's.
  SSM_CHECK(auto_blocks || a.engine.num_state_blocks >= needed,
            "--num-state-blocks {} cannot hold --batch-size {} running requests at once (it needs {}: one block per "
            "request{}{}, plus the null block); raise it, or pass 0 to size the pool for the batch",
            a.engine.num_state_blocks, a.batch_size, needed,
            check_k > 0 ? fmt::format(" and {} per request for the speculative tokens", check_k) : std::string(),
            bs > 0 ? fmt::format(" and {} KV block{} of {} tokens per request", kv_per_seq, kv_per_seq == 1 ? "" : "s", bs)
                   : std::string());
  return engine_ptr;
}

/// The speculative-decoding counters gathered between `before` and `after`.
SpecDecodeStats stats_since(const SpecDecodeStats& before, const SpecDecodeStats& after) {
  SpecDecodeStats d;
  d.num_drafts = after.num_drafts - before.num_drafts;
  d.num_draft_tokens = after.num_draft_tokens - before.num_draft_tokens;
  d.num_accepted_tokens = after.num_accepted_tokens - before.num_accepted_tokens;
  return d;
}

/// --speculative-config with method replay: per batch size, a plain greedy pass (a second engine without
/// speculation) records every prompt's continuation and its decode tokens/s; then, per acceptance rate, the
/// speculative engine runs the same prompts with a ReplayProposer at that rate. Prints and (--output-json) writes
/// plain and speculative decode tokens/s, the speedup, the measured acceptance rate and mean acceptance length.
int run_replay(BenchArgs& a, const SpeculativeConfig& spec, bool seqs_raised) {
  std::vector<double> rates = a.replay_rates;
  if (rates.empty()) rates.push_back(spec.acceptance_rate);
  std::map<int, std::shared_ptr<ReplayProposer::Continuations>> recorded;  // batch size -> continuations
  std::map<int, Measured> plain;
  {
    BenchArgs p = a;
    p.engine.speculative_config.clear();
    std::cerr << "plain greedy pass (records the continuations the replay drafter replays)\n";
    std::unique_ptr<LLMEngine> engine = build_engine(p, seqs_raised, spec.num_speculative_tokens);
    for (int b : a.batch_sizes) {
      p.batch_size = b;
      recorded[b] = std::make_shared<ReplayProposer::Continuations>();
      plain[b] = measure(*engine, p, recorded[b].get());
    }
  }  // the plain engine is freed before the speculative one is built (device memory)
  std::unique_ptr<LLMEngine> engine = build_engine(a, seqs_raised);
  const int vocab = engine->model_config().vocab_size;
  nlohmann::json results = nlohmann::json::array();
  std::cout << "model: " << a.engine.model.string() << " (" << (a.engine.load_format == LoadFormat::Dummy ? "dummy" : "checkpoint")
            << " weights), device " << a.engine.device << "\n"
            << "speculative decoding: replay drafter, k = " << spec.num_speculative_tokens << ", seed " << spec.seed
            << ", adaptive draft length " << (spec.adaptive_draft_length ? "on" : "off")
            << " (each draft is the recorded greedy token with probability = rate)\n";
  for (int b : a.batch_sizes) {
    a.batch_size = b;
    const double plain_d = median(plain[b].decode_tps);
    std::cout << "batch " << b << ", input " << a.input_len << ", output " << a.output_len << ", " << a.num_iters
              << (a.num_iters == 1 ? " iteration\n" : " iterations (median)\n")
              << std::fixed << std::setprecision(1) << "  plain:      decode " << plain_d << " tokens/s\n";
    nlohmann::json row = {{"model", a.engine.model.string()}, {"device", a.engine.device}, {"batch_size", b},
                          {"input_len", a.input_len}, {"output_len", a.output_len}, {"num_iters", a.num_iters},
                          {"num_speculative_tokens", spec.num_speculative_tokens},
                          {"adaptive_draft_length", spec.adaptive_draft_length}, {"plain_decode_tokens_per_s", plain_d},
                          {"plain_decode_tokens_per_s_all", plain[b].decode_tps}, {"replay", nlohmann::json::array()}};
    for (double rate : rates) {
      auto proposer = std::make_unique<ReplayProposer>(recorded[b], vocab, rate, spec.seed);
      const ReplayProposer& replay = *proposer;  // owned by the engine until the next set_proposer
      engine->set_proposer(std::move(proposer));
      const SpecDecodeStats before = engine->spec_decode_stats();
      const Measured m = measure(*engine, a);
      const SpecDecodeStats sd = stats_since(before, engine->spec_decode_stats());
      const double d = median(m.decode_tps);
      std::ostringstream label;
      label << "rate " << rate << ":";
      std::cout << "  " << std::left << std::setw(11) << label.str() << std::right << " decode " << std::setprecision(1) << d
                << " tokens/s, speedup " << std::setprecision(2) << d / plain_d << "x, acceptance rate "
                << std::setprecision(1) << 100.0 * sd.acceptance_rate() << "%, mean acceptance length "
                << std::setprecision(2) << sd.mean_acceptance_length() << "\n";
      if (replay.num_diverged() > 0)
        std::cout << "    note: " << replay.num_diverged() << " of " << b * (a.num_iters_warmup + a.num_iters)
                  << " requests left their recorded continuation (the speculative run's greedy tokens differ from the "
                     "plain pass's), so acceptance is below the rate\n";
      row["replay"].push_back({{"rate", rate}, {"decode_tokens_per_s", d}, {"decode_tokens_per_s_all", m.decode_tps},
                               {"speedup", d / plain_d}, {"acceptance_rate", sd.acceptance_rate()},
                               {"mean_acceptance_length", sd.mean_acceptance_length()}, {"num_drafts", sd.num_drafts},
                               {"num_draft_tokens", sd.num_draft_tokens}, {"num_accepted_tokens", sd.num_accepted_tokens},
                               {"num_diverged_requests", replay.num_diverged()}});
    }
    std::cout << std::defaultfloat << std::setprecision(6);
    results.push_back(row);
  }
  if (!a.output_json.empty()) write_json_file(a.output_json, nlohmann::json{{"results", results}});
  return 0;
}

int run_latency_one(BenchArgs& a, LLMEngine& engine, nlohmann::json* results);

int run_latency(BenchArgs& a) {
  SSM_CHECK(!a.batch_sizes.empty(), "--batch-size needs a value");
  for (int b : a.batch_sizes)
    SSM_CHECK(b >= 1 && b <= kMaxNumSeqs, "--batch-size must be in [1, {}] (got {})", kMaxNumSeqs, b);
  a.batch_size = *std::max_element(a.batch_sizes.begin(), a.batch_sizes.end());
  resolve_engine_config(a.engine, a.load_format);
  {
    // The user's engine flags are checked as given (as generate checks them), before the bench raises
    // --max-num-seqs to the batch and --max-num-batched-tokens to its prompts, which would hide a 0 or a negative.
    EngineConfig given = a.engine;
    given.allow_benchmark_proposers = SpeculativeConfig::parse(given.speculative_config).benchmark_only();
    given.validate();
  }
  SSM_CHECK(a.input_len >= 1 && a.input_len <= kMaxNumBatchedTokens, "--input-len must be in [1, {}] (got {})", kMaxNumBatchedTokens,
            a.input_len);
  SSM_CHECK(a.output_len >= 2 && a.output_len <= kMaxOutputLen, "--output-len must be in [2, {}] (got {})", kMaxOutputLen, a.output_len);
  SSM_CHECK(a.num_iters >= 1 && a.num_iters <= kMaxIters, "--num-iters must be in [1, {}] (got {})", kMaxIters, a.num_iters);
  SSM_CHECK(a.num_iters_warmup >= 0 && a.num_iters_warmup <= kMaxIters, "--num-iters-warmup must be in [0, {}] (got {})", kMaxIters,
            a.num_iters_warmup);
  check_output_path(a.output_json);
  // Decode throughput counts --output-len tokens per request, and the engine stops at the context (--max-model-len,
  // else the model's).
  check_bench_fits_context(a.engine, a.input_len, a.output_len);
  // The whole batch's prompts are one prefill step (up to the budget cap); every request keeps its state block.
  const int64_t batch_tokens = static_cast<int64_t>(a.input_len) * a.batch_size;
  a.engine.scheduler.max_num_batched_tokens = static_cast<int>(std::max<int64_t>(
      a.engine.scheduler.max_num_batched_tokens, std::min<int64_t>(batch_tokens, kMaxNumBatchedTokens)));
  const bool seqs_raised = a.batch_size > a.engine.scheduler.max_num_seqs;
  a.engine.scheduler.max_num_seqs = std::max(a.engine.scheduler.max_num_seqs, a.batch_size);
  const SpeculativeConfig spec = SpeculativeConfig::parse(a.engine.speculative_config);
  SSM_CHECK(a.replay_rates.empty() || spec.method == "replay",
            "--replay-acceptance-rates needs --speculative-config with method replay, e.g. "
            "'{{\"method\": \"replay\", \"num_speculative_tokens\": 4}}'");
  for (double r : a.replay_rates)
    SSM_CHECK(r >= 0.0 && r <= 1.0, "--replay-acceptance-rates: each rate must be in [0, 1] (got {})", r);
  if (spec.benchmark_only()) {
    a.engine.allow_benchmark_proposers = true;
    return run_replay(a, spec, seqs_raised);
  }
  // The whole batch must hold state at once: size the pool for it (the engine checks it fits in RAM).
  std::unique_ptr<LLMEngine> engine_ptr = build_engine(a, seqs_raised);
  LLMEngine& engine = *engine_ptr;
  if (a.batch_sizes.size() == 1) return run_latency_one(a, engine, nullptr);
  // Several sizes (a decode-vs-batch sweep): the engine sized for the largest serves every one.
  nlohmann::json results = nlohmann::json::array();
  const std::string json_path = a.output_json;
  a.output_json.clear();
  for (int b : a.batch_sizes) {
    a.batch_size = b;
    run_latency_one(a, engine, &results);
  }
  if (!json_path.empty()) write_json_file(json_path, nlohmann::json{{"results", results}});
  return 0;
}

/// Runs the warmup and timed iterations at a.batch_size on `engine`, prints the medians and writes / appends
/// them as JSON (a.output_json, or `results` when given).
int run_latency_one(BenchArgs& a, LLMEngine& engine, nlohmann::json* results) {
  const Measured m = measure(engine, a);
  const std::vector<double>& prefill_tps = m.prefill_tps;
  const std::vector<double>& decode_tps = m.decode_tps;
  const double p = median(prefill_tps), d = median(decode_tps);
  std::cout << "model: " << a.engine.model.string() << " (" << (a.engine.load_format == LoadFormat::Dummy ? "dummy" : "checkpoint")
            << " weights)\n"
            << "batch " << a.batch_size << ", input " << a.input_len << ", output " << a.output_len << ", " << a.num_iters
            << (a.num_iters == 1 ? " iteration\n" : " iterations (median)\n")
            << "prefill: " << p << " tokens/s\n"
            << "decode:  " << d << " tokens/s (" << 1000.0 * a.batch_size / d << " ms per step)\n"
            << "decode host time outside the model's forward (scheduling, batch building, host sampling, outputs): "
            << median(m.decode_outside_us) << " us per step\n";
  // vLLM's `bench latency` lines: one iteration's whole time (prefill and every decode step of the batch).
  double sum = 0;
  for (double l : m.latencies) sum += l;
  const double avg = sum / static_cast<double>(m.latencies.size());
  nlohmann::json pct = nlohmann::json::object();
  std::cout << "Avg latency: " << avg << " seconds\n";
  for (int q : {10, 25, 50, 75, 90, 99}) {
    const double v = percentile(m.latencies, q);
    pct[std::to_string(q)] = v;
    std::cout << q << "% percentile latency: " << v << " seconds\n";
  }
  if (const SpecDecodeStats& sd = engine.spec_decode_stats(); engine.speculative_config().enabled())
    std::cout << "speculative decoding (all runs so far): acceptance rate " << 100.0 * sd.acceptance_rate()
              << "%, mean acceptance length " << sd.mean_acceptance_length() << "\n";
  if (!a.output_json.empty() || results) {
    nlohmann::json j = {{"model", a.engine.model.string()}, {"batch_size", a.batch_size}, {"input_len", a.input_len},
                        {"output_len", a.output_len}, {"num_iters", a.num_iters}, {"prefill_tokens_per_s", p},
                        {"decode_tokens_per_s", d}, {"prefill_tokens_per_s_all", prefill_tps}, {"decode_tokens_per_s_all", decode_tps},
                        {"decode_host_us_per_step", median(m.decode_outside_us)}, {"avg_latency", avg},
                        {"latencies", m.latencies}, {"percentiles", pct}};
    if (results) results->push_back(j);
    else write_json_file(a.output_json, j);
  }
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* lat = bench->add_subcommand("latency", "Prefill and decode tokens/s of one batch (median of repeats)");
  add_engine_options(*lat, a->engine, a->load_format);
  // Only the batch ever runs, so the pool and the scheduler follow --batch-size (build_engine, run_latency).
  lat->get_option("--num-state-blocks")
      ->description("Recurrent-state blocks incl. the null block (0 = sized for the largest --batch-size: its state and "
                    "speculative blocks, a hybrid's KV blocks); a pool given must hold that whole batch");
  lat->get_option("--max-num-seqs")
      ->description("Most requests in one step (checked, then set to the largest --batch-size: only the batch runs)");
  const auto check_max_model_len = add_engine_max_model_len(*lat, a->engine);
  lat->add_option("--input-len", a->input_len, "Prompt tokens per request")->capture_default_str();
  lat->add_option("--output-len", a->output_len, "Generated tokens per request")->capture_default_str();
  lat->add_option("--batch-size", a->batch_sizes, "Requests in the batch; several values (1 2 4 ...) measure each on one engine")
      ->capture_default_str();
  lat->add_option("--num-iters", a->num_iters, "Timed repeats")->capture_default_str();
  lat->add_option("--num-iters-warmup", a->num_iters_warmup, "Untimed warmup repeats")->capture_default_str();
  lat->add_option("--output-json", a->output_json, "Also write the results to this JSON file");
  lat->add_option("--replay-acceptance-rates", a->replay_rates,
                  "With --speculative-config '{\"method\": \"replay\", \"num_speculative_tokens\": K}' (benchmark-only "
                  "drafter): acceptance rates in [0, 1] (e.g. 0 0.5 1); a plain greedy pass records the continuations, "
                  "then one replay run per rate reports decode tokens/s, speedup and measured acceptance");
  Runner throughput = add_bench_throughput(*bench);
  CLI::App* multiturn_cmd = nullptr;
  Runner multiturn = add_bench_multiturn(*bench);
  multiturn_cmd = bench->get_subcommand("multiturn");
  return [a, lat, throughput, multiturn, multiturn_cmd, check_max_model_len] {
    if (lat->parsed()) {
      check_max_model_len();
      return run_latency(*a);
    }
    if (multiturn_cmd->parsed()) return multiturn();
    return throughput();
  };
}

}  // namespace ssmserve::cli
