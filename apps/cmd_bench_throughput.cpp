// Owns `ssmserve bench throughput`: submits N requests at once (random token prompts or the first N records of
// a JSONL dataset) and runs the engine to completion, reporting requests/s, total tokens/s and output tokens/s
// (vLLM's benchmark_throughput), optionally written as JSON.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <random>

#include "apps/commands.h"
#include "apps/vllm_compat_flags.h"
#include "config/hf_json.h"
#include "core/error.h"
#include "engine/llm_engine.h"

namespace ssmserve::cli {
namespace {

struct ThroughputArgs {
  EngineConfig engine;
  std::string load_format = "auto";
  int num_prompts = 32;
  int input_len = 128;
  int output_len = 128;
  bool input_len_given = false;  ///< with --dataset, prompts are truncated only when --input-len is given
  std::string dataset;
  long long seed = 0;
  std::string output_json;
};

constexpr int kMaxNumPrompts = 1 << 20;           ///< --num-prompts
constexpr int kMaxOutputLen = 1 << 20;            ///< --output-len
constexpr int64_t kMaxPromptTokens = 1LL << 28;   ///< --num-prompts x --input-len (random prompts, 1 GiB of ids)

/// The first `n` prompt texts of a JSONL file: each non-blank line an object with a string "text" or "prompt".
/// Throws Error naming file:line for a malformed line, and when the file is unreadable or has no records.
std::vector<std::string> read_dataset(const std::string& path, int n) {
  std::ifstream in(path);
  SSM_CHECK(in, "{}: cannot open the dataset", path);
  std::vector<std::string> texts;
  std::string line;
  for (int lineno = 1; static_cast<int>(texts.size()) < n && std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    check_json_depth(line, fmt::format("{}:{}", path, lineno));
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: invalid JSON ({})", path, lineno, e.what());
    }
    const char* key = j.is_object() && j.contains("text") ? "text" : "prompt";
    SSM_CHECK(j.is_object() && j.contains(key) && j[key].is_string(),
              "{}:{}: each line must be an object with a string \"text\" or \"prompt\"", path, lineno);
    SSM_CHECK(!j[key].get<std::string>().empty(), "{}:{}: empty \"{}\"", path, lineno, key);
    texts.push_back(j[key].get<std::string>());
  }
  SSM_CHECK(!texts.empty(), "{}: the dataset has no records", path);
  return texts;
}

/// Builds the N requests (before the clock starts): token-id prompts, ignore_eos, max_tokens = output_len.
std::vector<Request> make_requests(const LLMEngine& engine, const ThroughputArgs& a) {
  std::vector<std::vector<int>> prompts;
  if (a.dataset.empty()) {
    std::mt19937 rng(static_cast<std::mt19937::result_type>(a.seed));
    std::uniform_int_distribution<int> tok(0, std::min(engine.model_config().vocab_size, 50000) - 1);
    for (int i = 0; i < a.num_prompts; ++i) {
      std::vector<int>& p = prompts.emplace_back(a.input_len);
      for (int& t : p) t = tok(rng);
    }
  } else {
    SSM_CHECK(engine.tokenizer(), "--dataset needs a tokenizer: {} has no tokenizer.json (pass --tokenizer DIR, e.g. models/tiny-mamba)",
              engine.config().model.string());
    const std::vector<std::string> texts = read_dataset(a.dataset, a.num_prompts);
    if (static_cast<int>(texts.size()) < a.num_prompts)
      std::cerr << "warning: " << a.dataset << " has only " << texts.size() << (texts.size() == 1 ? " record; it is reused" : " records; they are reused")
                << " in order to make "
                << a.num_prompts << " requests (as bench serve does)\n";
    for (const std::string& text : texts) {
      std::vector<int>& p = prompts.emplace_back(engine.tokenizer()->encode(text));
      if (a.input_len_given && static_cast<int>(p.size()) > a.input_len) p.resize(a.input_len);
    }
    for (size_t i = 0; prompts.size() < static_cast<size_t>(a.num_prompts); ++i) prompts.push_back(prompts[i]);  // cycle
  }
  std::vector<Request> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = "tput-" + std::to_string(i);
    r.prompt_token_ids = std::move(prompts[i]);
    r.params.max_tokens = a.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = 0.0;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

/// Redraws "[####    ] done/total" on stderr.
void draw_progress(int done, int total) {
  const int w = 30, filled = done * w / total;
  std::cerr << "\r[" << std::string(filled, '#') << std::string(w - filled, ' ') << "] " << done << "/" << total << " requests"
            << std::flush;
}

int run_throughput(ThroughputArgs& a) {
  // 1. Validate flags before loading the model.
  resolve_engine_config(a.engine, a.load_format);
  SSM_CHECK(a.num_prompts >= 1 && a.num_prompts <= kMaxNumPrompts, "--num-prompts must be in [1, {}] (got {})", kMaxNumPrompts,
            a.num_prompts);
  SSM_CHECK(a.input_len >= 1 && a.input_len <= kMaxNumBatchedTokens, "--input-len must be in [1, {}] (got {})", kMaxNumBatchedTokens,
            a.input_len);
  SSM_CHECK(a.output_len >= 1 && a.output_len <= kMaxOutputLen, "--output-len must be in [1, {}] (got {})", kMaxOutputLen, a.output_len);
  SSM_CHECK(a.seed >= 0, "--seed must be >= 0 (got {})", a.seed);
  if (a.dataset.empty()) {  // the random prompts are built up front
    // Every request must get its --output-len tokens (the engine would stop it at the context and the output tokens/s
    // would count fewer), against --max-model-len or else the model's context, as bench latency.
    check_bench_fits_context(a.engine, a.input_len, a.output_len);
    const int64_t prompt_tokens = static_cast<int64_t>(a.num_prompts) * a.input_len;
    SSM_CHECK(prompt_tokens <= kMaxPromptTokens, "--num-prompts {} x --input-len {} = {} prompt tokens; at most {} are allowed",
              a.num_prompts, a.input_len, prompt_tokens, kMaxPromptTokens);
  }
  check_output_path(a.output_json);
  if (!a.dataset.empty()) SSM_CHECK(std::ifstream(a.dataset), "{}: cannot open the dataset", a.dataset);
  // 2. Load the engine and build every request up front (tokenization is not timed).
  LLMEngine engine(a.engine);
  std::vector<Request> reqs = make_requests(engine, a);
  const int n = static_cast<int>(reqs.size());
  long long prompt_tokens = 0, output_tokens = 0;
  for (const Request& r : reqs) prompt_tokens += static_cast<long long>(r.prompt_token_ids.size());
  // 3. Submit all at once and run to completion; the scheduler's --max-num-seqs bounds concurrency.
  const auto t0 = std::chrono::steady_clock::now();
  for (Request& r : reqs) engine.add_request(std::move(r));
  int done = 0;
  draw_progress(0, n);
  // Where the time goes: steps with prefill tokens vs decode-only steps, each split into the model's forward
  // (GPU work, metadata upload, logits / picks download) and the rest of the step (scheduling, batch building,
  // sampling, request updates).
  struct Part {
    long long steps = 0, tokens = 0;
    double seconds = 0.0, forward = 0.0;
  } part[2];  // [0] steps with prefill tokens, [1] decode-only steps
  while (engine.has_unfinished_requests()) {
    const auto s0 = std::chrono::steady_clock::now();
    std::vector<RequestOutput> outs = engine.step();
    const StepStats& st = engine.last_step_stats();
    Part& pt = part[st.num_prefill_tokens > 0 ? 0 : 1];
    ++pt.steps;
    pt.tokens += st.num_prefill_tokens + st.num_decode_tokens;
    pt.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    pt.forward += st.forward_seconds;
    for (const RequestOutput& o : outs) {
      if (!o.finished) continue;
      output_tokens += static_cast<long long>(o.outputs.at(0).token_ids.size());
      draw_progress(++done, n);
    }
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << "\n";
  // 4. Report.
  const double rps = n / elapsed, tps = (prompt_tokens + output_tokens) / elapsed, ops = output_tokens / elapsed;
  std::cout << "model: " << a.engine.model.string() << " (" << (a.engine.load_format == LoadFormat::Dummy ? "dummy" : "checkpoint")
            << " weights)\n"
            << n << " requests, " << prompt_tokens << " prompt tokens, " << output_tokens << " output tokens, max-num-seqs "
            << a.engine.scheduler.max_num_seqs << "\n"
            << std::fixed << std::setprecision(2) << "elapsed: " << elapsed << " s\n"
            << "Throughput: " << rps << " requests/s, " << tps << " total tokens/s, " << ops << " output tokens/s\n";
  for (int k = 0; k < 2; ++k) {
    const Part& pt = part[k];
    if (pt.steps == 0) continue;
    // Steps with prompt tokens count as prefill steps, their decode rows' tokens too (the step runs them together).
    std::cout << (k == 0 ? "prefill (and mixed) steps: " : "decode-only steps: ") << pt.steps << " steps, " << pt.tokens << " tokens, "
              << std::setprecision(3) << pt.seconds << " s (forward " << pt.forward << " s, rest " << pt.seconds - pt.forward
              << " s), " << 1e3 * pt.seconds / pt.steps << " ms/step, " << std::setprecision(1)
              << static_cast<double>(pt.tokens) / pt.steps << " tokens/step\n";
  }
  const PrefixCacheStats pc = engine.prefix_cache_stats();
  if (engine.prefix_cache_config().enabled())
    std::cout << "prefix cache: hit rate " << std::setprecision(1) << 100.0 * pc.hit_rate() << "% (" << pc.hits << " of "
              << pc.queries << " prompt tokens)\n";
  const SpecDecodeStats& sd = engine.spec_decode_stats();
  if (engine.speculative_config().enabled())
    std::cout << "speculative decoding: acceptance rate " << std::setprecision(1) << 100.0 * sd.acceptance_rate() << "% ("
              << sd.num_accepted_tokens << " of " << sd.num_draft_tokens << " draft tokens), mean acceptance length "
              << std::setprecision(2) << sd.mean_acceptance_length() << " tokens per verify row\n";
  if (!a.output_json.empty()) {
    nlohmann::json j = {{"model", a.engine.model.string()},
                        {"spec_decode_acceptance_rate", sd.acceptance_rate()},
                        {"spec_decode_mean_acceptance_length", sd.mean_acceptance_length()},
                        {"prefix_cache_hit_rate", pc.hit_rate()},
                        {"prefix_cache_hit_tokens", pc.hits},
                        {"dataset", a.dataset.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.dataset)},
                        {"num_requests", n},
                        {"input_len", a.dataset.empty() || a.input_len_given ? nlohmann::json(a.input_len) : nlohmann::json(nullptr)},
                        {"output_len", a.output_len},
                        {"max_num_seqs", a.engine.scheduler.max_num_seqs},
                        {"max_num_batched_tokens", a.engine.scheduler.max_num_batched_tokens},
                        {"total_num_tokens", prompt_tokens + output_tokens},
                        {"num_prompt_tokens", prompt_tokens},
                        {"num_output_tokens", output_tokens},
                        {"elapsed_time", elapsed},
                        {"requests_per_second", rps},
                        {"tokens_per_second", tps},
                        {"output_tokens_per_second", ops}};
    write_json_file(a.output_json, j);
  }
  return 0;
}

}  // namespace

Runner add_bench_throughput(CLI::App& bench) {
  auto a = std::make_shared<ThroughputArgs>();
  CLI::App* cmd = bench.add_subcommand("throughput", "Requests/s and tokens/s of N requests submitted at once (offline)");
  add_engine_options(*cmd, a->engine, a->load_format);
  const auto check_max_model_len = add_engine_max_model_len(*cmd, a->engine);
  cmd->add_option("--num-prompts", a->num_prompts, "Requests to submit")->capture_default_str();
  CLI::Option* in = cmd->add_option("--input-len,--random-input-len", a->input_len,
                                    "Prompt tokens per request (with --dataset: truncate prompts to this many)")
                        ->capture_default_str();
  cmd->add_option("--output-len,--random-output-len", a->output_len, "Generated tokens per request (ignore_eos)")
      ->capture_default_str();
  CLI::Option* dataset = cmd->add_option(
      "--dataset", a->dataset, "JSONL file of {\"text\": ...} or {\"prompt\": ...}; the first N records are the prompts");
  auto dataset_name = std::make_shared<std::string>(), dataset_path = std::make_shared<std::string>();
  cmd->add_option("--dataset-name", *dataset_name, "vLLM's: random, or custom (a JSONL file of prompts: --dataset-path)");
  cmd->add_option("--dataset-path", *dataset_path, "vLLM's: the custom dataset's JSONL file");
  cmd->add_option("--seed", a->seed, "Seed of the random prompt token ids")->capture_default_str();
  cmd->add_option("--output-json", a->output_json, "Also write the results to this JSON file");
  return [a, in, dataset, dataset_name, dataset_path, check_max_model_len] {
    a->input_len_given = in->count() > 0;
    if (!dataset_name->empty() || !dataset_path->empty()) {  // vLLM's spellings: random prompts are no dataset here
      const std::string d = resolve_vllm_dataset(*dataset_name, *dataset_path, dataset->count() > 0);
      a->dataset = d == "random" ? std::string() : d;
    }
    check_max_model_len();
    return run_throughput(*a);
  };
}

}  // namespace ssmserve::cli
