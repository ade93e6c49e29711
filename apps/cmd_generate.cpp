// Owns `ssmserve generate`: offline generation for one prompt (--prompt, streamed) or many (--prompts-file,
// batched through the engine), printing text or one JSON object per prompt (--json). The flags and the JSON
// fields are a contract other tools rely on.
#include <nlohmann/json.hpp>

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
  std::string prompts_file;
  SamplingParams params;
  bool json = false;
};

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  SSM_CHECK(in, "{}: cannot open the prompts file", path);
  std::vector<std::string> prompts;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: invalid JSON ({})", path, lineno, e.what());
    }
    SSM_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
              "{}:{}: each line must be an object with a string \"prompt\"", path, lineno);
    prompts.push_back(j["prompt"].get<std::string>());
  }
  SSM_CHECK(!prompts.empty(), "{}: no prompts", path);
  return prompts;
}

nlohmann::json logprob_list(const std::vector<TokenLogprob>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& t : v) a.push_back({{"id", t.id}, {"logprob", t.logprob}});
  return a;
}

/// The contract's JSON object for one finished request.
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
  if (!c.stop_reason.empty()) j["stop_reason"] = c.stop_reason;
  return j;
}

int run_generate(GenerateArgs& a) {
  resolve_engine_config(a.engine, a.load_format);
  std::vector<std::string> prompts = a.prompts_file.empty() ? std::vector<std::string>{a.prompt} : read_prompts_file(a.prompts_file);
  a.params.validate(1 << 30);  // fail fast on bad flags before loading the model
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
  auto* p2 = cmd->add_option("--prompts-file", a->prompts_file, "JSONL file, one {\"prompt\": \"...\"} per line");
  p1->excludes(p2);
  SamplingParams& sp = a->params;
  cmd->add_option("--max-tokens", sp.max_tokens, "Tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--min-tokens", sp.min_tokens, "Tokens to generate before EOS / stop ids may end a sequence");
  cmd->add_option("--temperature", sp.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", sp.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", sp.top_k, "Keep the k most likely tokens (0 or -1 = all)")->capture_default_str();
  cmd->add_option("--min-p", sp.min_p, "Drop tokens with p < min_p * p_max")->capture_default_str();
  cmd->add_option("--seed", sp.seed, "Per-request random seed (same seed, same output)");
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "HF repetition penalty (> 0, 1 = off)");
  cmd->add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty");
  cmd->add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty");
  cmd->add_option("--stop", sp.stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-ids", sp.stop_token_ids, "Token ids that end a sequence");
  cmd->add_flag("--ignore-eos", sp.ignore_eos, "Keep generating after EOS");
  cmd->add_option("--logprobs", sp.logprobs, "Top-K logprobs of each generated token (JSON output)");
  cmd->add_option("--prompt-logprobs", sp.prompt_logprobs, "Top-K logprobs of each prompt position (JSON output)");
  cmd->add_flag("--json", a->json, "Print one JSON object per prompt, in input order");
  cmd->callback([cmd, a] {
    if (a->prompt.empty() && a->prompts_file.empty()) throw CLI::RequiredError("--prompt or --prompts-file");
  });
  return [a] { return run_generate(*a); };
}

}  // namespace ssmserve::cli
