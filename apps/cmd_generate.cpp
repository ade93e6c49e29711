// Owns `ssmserve generate`: offline generation for one prompt (--prompt, streamed) or many (--prompts-file,
// batched through the engine), printing text or one JSON object per prompt (--json). The flags and the JSON
// fields are a contract other tools rely on.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "apps/commands.h"
#include "core/error.h"
#include "engine/llm_engine.h"

namespace ssmserve::cli {
namespace {

struct GenerateArgs {
  EngineConfig engine;
  std::string load_format = "auto";
  std::string prompt;
  bool prompt_given = false;  ///< --prompt was passed (possibly as "")
  std::string prompts_file;
  long long seed = -1;        ///< --seed as parsed (checked >= 0 before it becomes params.seed)
  bool seed_given = false;
  SamplingParams params;
  bool json = false;
};

/// The prompts of a JSONL file ("-" = standard input): each non-blank line an object with a non-empty string
/// "prompt". Throws Error naming file:line for a malformed line, and when the file is unreadable or has none.
std::vector<std::string> read_prompts_file(const std::string& path) {
  const bool is_stdin = path == "-";
  const std::string name = is_stdin ? "<stdin>" : path;
  std::error_code ec;
  SSM_CHECK(is_stdin || !std::filesystem::is_directory(path, ec), "{}: --prompts-file is a directory, not a JSONL file", path);
  std::ifstream file;
  if (!is_stdin) {
    file.open(path);
    SSM_CHECK(file, "{}: cannot open the prompts file", path);
  }
  std::istream& in = is_stdin ? std::cin : file;
  std::vector<std::string> prompts;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: invalid JSON ({})", name, lineno, e.what());
    }
    SSM_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
              "{}:{}: each line must be an object with a string \"prompt\"", name, lineno);
    SSM_CHECK(!j["prompt"].get<std::string>().empty(), "{}:{}: the prompt is empty", name, lineno);
    prompts.push_back(j["prompt"].get<std::string>());
  }
  SSM_CHECK(!in.bad(), "{}: read error", name);
  SSM_CHECK(!prompts.empty(), "{}: no prompts", name);
  return prompts;
}

nlohmann::json logprob_list(const std::vector<TokenLogprob>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& t : v) a.push_back({{"id", t.id}, {"logprob", t.logprob}});
  return a;
}

/// vLLM's stop_reason: the matched stop string, or the --stop-token-ids entry that ended the sequence, else null.
nlohmann::json stop_reason(const CompletionOutput& c) {
  if (!c.stop_reason.empty()) return c.stop_reason;
  if (c.stop_reason_token) return *c.stop_reason_token;
  return nullptr;
}

/// The contract's JSON object for one finished request (every key always present).
nlohmann::json to_json(const RequestOutput& o, const SamplingParams& sp) {
  const CompletionOutput& c = o.outputs.at(0);
  nlohmann::json j = {{"prompt", o.prompt}, {"prompt_token_ids", o.prompt_token_ids}, {"text", c.text},
                      {"token_ids", c.token_ids}, {"finish_reason", std::string(finish_reason_name(c.finish_reason))}};
  j["logprobs"] = nullptr;
  if (sp.logprobs) {
    j["logprobs"] = nlohmann::json::array();
    for (const auto& step : c.logprobs) j["logprobs"].push_back(logprob_list(step));
  }
  j["prompt_logprobs"] = nullptr;
  if (sp.prompt_logprobs) {
    j["prompt_logprobs"] = nlohmann::json::array();
    for (const auto& p : o.prompt_logprobs) {
      if (!p) j["prompt_logprobs"].push_back(nullptr);
      else j["prompt_logprobs"].push_back({{"token_logprob", p->token_logprob}, {"top", logprob_list(p->top)}});
    }
  }
  j["stop_reason"] = stop_reason(c);
  return j;
}

/// Flag checks that need no model (the stop_token_ids range is checked against the real vocabulary later).
void check_flags(GenerateArgs& a) {
  SamplingParams& sp = a.params;
  const std::pair<const char*, double> reals[] = {{"--temperature", sp.temperature}, {"--top-p", sp.top_p},
                                                  {"--min-p", sp.min_p}, {"--repetition-penalty", sp.repetition_penalty},
                                                  {"--presence-penalty", sp.presence_penalty},
                                                  {"--frequency-penalty", sp.frequency_penalty}};
  for (const auto& [flag, v] : reals) SSM_CHECK(std::isfinite(v), "{} must be finite (got {})", flag, v);
  if (a.seed_given) {
    SSM_CHECK(a.seed >= 0, "--seed must be >= 0 (got {})", a.seed);
    sp.seed = static_cast<uint64_t>(a.seed);
  }
  for (size_t i = 0; i < sp.stop_token_ids.size(); ++i)
    SSM_CHECK(sp.stop_token_ids[i] >= 0, "--stop-token-ids: entry {} is {}; token ids must be >= 0", i, sp.stop_token_ids[i]);
  SamplingParams rest = sp;
  rest.stop_token_ids.clear();  // vocabulary-dependent: the engine checks them when the request is added
  rest.validate(1);
}

int run_generate(GenerateArgs& a) {
  resolve_engine_config(a.engine, a.load_format);
  check_flags(a);  // fail fast on bad flags before loading the model
  std::vector<std::string> prompts = a.prompt_given ? std::vector<std::string>{a.prompt} : read_prompts_file(a.prompts_file);
  LLM llm(a.engine);
  LLMEngine& engine = llm.engine();
  // Stream a single text prompt as it is generated; otherwise run the batch and print in input order.
  if (!a.json && prompts.size() == 1) {
    Request r;
    r.request_id = "0";
    r.prompt = prompts[0];
    r.params = a.params;
    engine.add_request(std::move(r));
    std::cout << prompts[0] << std::flush;
    while (engine.has_unfinished_requests())
      for (const auto& o : engine.step()) std::cout << o.delta_text << std::flush;
    std::cout << std::endl;
    return 0;
  }
  std::vector<RequestOutput> outs = llm.generate(prompts, a.params);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (a.json) std::cout << to_json(outs[i], a.params).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    else std::cout << "=== prompt " << i << " ===\n" << outs[i].prompt << outs[i].outputs[0].text << "\n";
  }
  std::cout << std::flush;
  return 0;
}

}  // namespace

Runner add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  a->params.max_tokens = 64;
  a->params.temperature = 0.0;
  CLI::App* cmd = app.add_subcommand("generate", "Generate continuations of prompts (offline, through the engine)");
  add_engine_options(*cmd, a->engine, a->load_format);
  auto* p1 = cmd->add_option("--prompt", a->prompt, "Prompt text");
  auto* p2 = cmd->add_option("--prompts-file", a->prompts_file, "JSONL file, one {\"prompt\": \"...\"} per line (- = stdin)");
  p1->excludes(p2);
  SamplingParams& sp = a->params;
  cmd->add_option("--max-tokens", sp.max_tokens, "Tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--min-tokens", sp.min_tokens, "Tokens to generate before EOS / stop ids may end a sequence");
  cmd->add_option("--temperature", sp.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", sp.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", sp.top_k, "Keep the k most likely tokens (0 or -1 = all)")->capture_default_str();
  cmd->add_option("--min-p", sp.min_p, "Drop tokens with p < min_p * p_max")->capture_default_str();
  auto* seed = cmd->add_option("--seed", a->seed, "Per-request random seed, >= 0 (same seed, same output)");
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "HF repetition penalty (> 0, 1 = off)");
  cmd->add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty");
  cmd->add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty");
  cmd->add_option("--stop", sp.stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-ids", sp.stop_token_ids, "Token ids that end a sequence");
  cmd->add_flag("--ignore-eos", sp.ignore_eos, "Keep generating after EOS");
  cmd->add_option("--logprobs", sp.logprobs, "Top-K logprobs of each generated token (JSON output)");
  cmd->add_option("--prompt-logprobs", sp.prompt_logprobs, "Top-K logprobs of each prompt position (JSON output)");
  cmd->add_flag("--json", a->json, "Print one JSON object per prompt, in input order");
  cmd->callback([a, p1, p2, seed] {
    if (p1->count() == 0 && p2->count() == 0) throw CLI::RequiredError("--prompt or --prompts-file");
    a->prompt_given = p1->count() > 0;
    a->seed_given = seed->count() > 0;
  });
  return [a] { return run_generate(*a); };
}

}  // namespace ssmserve::cli
