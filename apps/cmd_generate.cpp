// Owns `ssmserve generate`: offline generation for one prompt (--prompt, streamed) or many (--prompts-file,
// batched through the engine), printing text or one JSON object per prompt (--json). The flags and the JSON
// fields are a contract other tools rely on.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <string_view>

#include "apps/commands.h"
#include "config/hf_json.h"
#include "core/error.h"
#include "engine/bad_words.h"
#include "engine/llm_engine.h"
#include "server/protocol.h"
#include "server/structured_request.h"

namespace ssmserve::cli {
namespace {

struct GenerateArgs {
  EngineConfig engine;
  std::string load_format = "auto";
  std::string prompt;
  bool prompt_given = false;  ///< --prompt was passed (possibly as "")
  std::string prompts_file;
  std::string seed;            ///< --seed as given (parsed and range-checked before it becomes params.seed)
  bool seed_given = false;
  int max_model_len = 0;       ///< --max-model-len as given (checked >= 1 when given; then the engine's max_model_len)
  bool max_model_len_given = false;
  SamplingParams params;
  bool json = false;
};

/// One prompt to generate for, with its sampling parameters (the flags', overridden by its JSONL line).
struct PromptJob {
  std::string prompt;
  SamplingParams params;
  std::string where;  ///< "file:line" of its --prompts-file line, for errors; "" for --prompt
};

/// Runs one of the server's field parsers (server/protocol.h, server/structured_request.h) on a prompts-file value:
/// the same types, limits and messages as the server's 400s, prefixed with `where`.
template <class Parse>
auto server_field(const std::string& where, Parse&& parse) {
  try {
    return parse();
  } catch (const server::ApiError& e) {
    fail("{}: {}", where, e.what());
  }
}

/// The SamplingParams fields `generate` sets from its flags, each from the flag of its name with dashes (--max-tokens).
constexpr std::string_view kFlagFields[] = {"max_tokens",       "min_tokens",        "temperature", "top_p",
                                            "top_k",            "min_p",             "repetition_penalty",
                                            "presence_penalty", "frequency_penalty", "stop",
                                            "stop_token_ids",   "logprobs",          "prompt_logprobs"};

/// SamplingParams::validate's error about values taken from the flags, naming the flag the user typed instead of the
/// field: "--max-tokens must be at least 1, got 0", "--min-tokens must be less than or equal to --max-tokens=2, got 5".
/// A field no flag sets keeps its message.
[[noreturn]] void fail_naming_flag(const SamplingParamsError& e) {
  if (std::find(std::begin(kFlagFields), std::end(kFlagFields), e.field()) == std::end(kFlagFields)) throw e;
  auto flag = [](std::string_view field) {
    std::string f = "--" + std::string(field);
    std::replace(f.begin(), f.end(), '_', '-');
    return f;
  };
  std::string msg = e.named(flag(e.field()));
  if (const size_t at = msg.find(" max_tokens="); at != std::string::npos) msg.replace(at + 1, 10, flag("max_tokens"));
  throw Error(msg);
}

/// SamplingParams::validate's error about the values of a --prompts-file line, naming the line and the JSON field:
/// "p.jsonl:2: max_tokens must be at least 1, got 0".
[[noreturn]] void fail_naming_line(const std::string& where, const Error& e) {
  const auto* sp = dynamic_cast<const SamplingParamsError*>(&e);
  fail("{}: {}", where, sp ? sp->named(sp->field()) : std::string(e.what()));
}

/// The fields of a request that set a structured-outputs constraint, as the server reads them: vLLM's
/// structured_outputs (json, regex, choice, grammar, json_object, structural_tag and its options), OpenAI's
/// response_format and vLLM's older guided_* fields and top-level structural_tag.
bool is_constraint_field(const std::string& k) {
  return k == "structured_outputs" || k == "response_format" || k == "structural_tag" || k.rfind("guided_", 0) == 0;
}

/// Overrides `sp` with the sampling fields of one --prompts-file line (vLLM's SamplingParams names; logit_bias,
/// allowed_token_ids, bad_words and the constraint fields (is_constraint_field) parsed as the server parses them,
/// null meaning unset; two constraints on one line are an error naming both). Throws
/// Error naming `where` and the field for an unknown field or a value of the wrong type.
void apply_line_fields(const nlohmann::ordered_json& j, SamplingParams& sp, const std::string& where) {
  auto num = [&](const std::string& k, const nlohmann::ordered_json& v) {
    SSM_CHECK(v.is_number(), "{}: \"{}\" must be a number", where, k);
    return v.get<double>();
  };
  auto integer = [&](const std::string& k, const nlohmann::ordered_json& v) {
    SSM_CHECK(v.is_number_integer() && v.get<long long>() >= std::numeric_limits<int>::min() &&
                  v.get<long long>() <= std::numeric_limits<int>::max(),
              "{}: \"{}\" must be an integer", where, k);
    return v.get<int>();
  };
  auto boolean = [&](const std::string& k, const nlohmann::ordered_json& v) {
    SSM_CHECK(v.is_boolean(), "{}: \"{}\" must be true or false", where, k);
    return v.get<bool>();
  };
  nlohmann::ordered_json constraint_fields = nlohmann::ordered_json::object();
  for (const auto& [k, v] : j.items()) {
    if (k == "prompt") continue;
    if (k == "max_tokens") sp.max_tokens = integer(k, v);
    else if (k == "min_tokens") sp.min_tokens = integer(k, v);
    else if (k == "temperature") sp.temperature = num(k, v);
    else if (k == "top_p") sp.top_p = num(k, v);
    else if (k == "top_k") sp.top_k = integer(k, v);
    else if (k == "min_p") sp.min_p = num(k, v);
    else if (k == "presence_penalty") sp.presence_penalty = num(k, v);
    else if (k == "frequency_penalty") sp.frequency_penalty = num(k, v);
    else if (k == "repetition_penalty") sp.repetition_penalty = num(k, v);
    else if (k == "ignore_eos") sp.ignore_eos = boolean(k, v);
    else if (k == "include_stop_str_in_output") sp.include_stop_str_in_output = boolean(k, v);
    else if (k == "skip_special_tokens") sp.skip_special_tokens = boolean(k, v);
    else if (k == "logprobs") sp.logprobs = integer(k, v);
    else if (k == "prompt_logprobs") sp.prompt_logprobs = integer(k, v);
    else if (k == "seed") {
      // As the server: an integer (or an integral float) in [0, 2^63 - 1].
      const bool integral = v.is_number_unsigned() ? v.get<unsigned long long>() <= (1ull << 63) - 1
                            : v.is_number_integer() ? v.get<long long>() >= 0
                            : v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 9.2233720368547758e18 &&
                                  v.get<double>() == std::floor(v.get<double>());
      SSM_CHECK(integral, "{}: \"seed\" must be an integer in [0, {}]", where, std::numeric_limits<long long>::max());
      sp.seed = v.is_number_float() ? static_cast<uint64_t>(v.get<double>()) : v.get<uint64_t>();
    } else if (k == "stop") {
      SSM_CHECK(v.is_string() || v.is_array(), "{}: \"stop\" must be a string or a list of strings", where);
      sp.stop.clear();
      for (const auto& e : v.is_string() ? nlohmann::ordered_json::array({v}) : v) {
        SSM_CHECK(e.is_string(), "{}: \"stop\" must be a string or a list of strings", where);
        sp.stop.push_back(e.get<std::string>());
      }
    } else if (k == "stop_token_ids") {
      SSM_CHECK(v.is_array(), "{}: \"stop_token_ids\" must be a list of token ids", where);
      sp.stop_token_ids.clear();
      for (const auto& e : v) {
        SSM_CHECK(e.is_number_integer() && e.get<long long>() >= 0 && e.get<long long>() <= std::numeric_limits<int>::max(),
                  "{}: \"stop_token_ids\" must be a list of token ids (integers >= 0)", where);
        sp.stop_token_ids.push_back(e.get<int>());
      }
    } else if (k == "logit_bias") {
      sp.logit_bias = v.is_null() ? std::map<int, float>{} : server_field(where, [&] { return server::parse_logit_bias(v); });
    } else if (k == "allowed_token_ids") {
      sp.allowed_token_ids = v.is_null() ? std::vector<int>{} : server_field(where, [&] { return server::parse_allowed_token_ids(v); });
    } else if (k == "bad_words") {
      sp.bad_words = v.is_null() ? std::vector<std::string>{} : server_field(where, [&] { return server::parse_bad_words(v); });
    } else if (is_constraint_field(k)) {
      constraint_fields[k] = v;  // parsed together below: at most one constraint per line, as the server
    } else {
      fail("{}: unknown field \"{}\" (a line may set prompt and the sampling fields listed in `generate --help`)", where, k);
    }
  }
  if (!constraint_fields.empty())
    sp.structured_outputs = server_field(where, [&] { return server::parse_structured_outputs(constraint_fields); });
}

/// The prompts of a JSONL file ("-" = standard input): each non-blank line an object with a non-empty string
/// "prompt" and optionally per-prompt sampling fields overriding the flags (`base`). Throws Error naming
/// file:line for a malformed line or invalid values, and when the file is unreadable or has none.
std::vector<PromptJob> read_prompts_file(const std::string& path, const SamplingParams& base) {
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
  std::vector<PromptJob> prompts;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json j;  // in the line's order: the first bad field is the one named
    check_json_depth(line, fmt::format("{}:{}", name, lineno));  // deep nesting must not exhaust the stack
    try {
      j = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::ordered_json::exception& e) {
      fail("{}:{}: invalid JSON ({})", name, lineno, e.what());
    }
    SSM_CHECK(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
              "{}:{}: each line must be an object with a string \"prompt\"", name, lineno);
    SSM_CHECK(!j["prompt"].get<std::string>().empty(), "{}:{}: the prompt is empty", name, lineno);
    const std::string where = fmt::format("{}:{}", name, lineno);
    PromptJob job{j["prompt"].get<std::string>(), base, where};
    apply_line_fields(j, job.params, where);
    SamplingParams rest = job.params;
    // Vocabulary-dependent: checked once the model is loaded (check_against_model).
    rest.stop_token_ids.clear(), rest.logit_bias.clear(), rest.allowed_token_ids.clear();
    try {
      rest.validate(1);
    } catch (const Error& e) {
      fail_naming_line(where, e);
    }
    // A schema / regex / grammar xgrammar cannot convert fails here, before the model loads (as the server's 400).
    if (rest.structured_outputs)
      server_field(where, [&] { server::check_structured_outputs(*rest.structured_outputs, ""); });
    prompts.push_back(std::move(job));
  }
  SSM_CHECK(!in.bad(), "{}: read error", name);
  SSM_CHECK(!prompts.empty(), "{}: no prompts", name);
  return prompts;
}

/// Applies the context (--max-model-len, else the model's max_position_embeddings) as vLLM does: a prompt that
/// leaves no room to generate is an error; a prompt + max_tokens beyond it generates only up to the context
/// (finish_reason "length") with a warning on stderr.
void fit_to_context(std::vector<PromptJob>& jobs, const LLMEngine& engine, bool max_model_len_given) {
  const int max_len = engine.max_model_len();
  const Tokenizer* tok = engine.tokenizer();
  if (max_len <= 0 || !tok) return;  // no positional limit (recurrent models), or token-id-only models
  const char* source = max_model_len_given ? "--max-model-len" : "max_position_embeddings";
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int len = static_cast<int>(tok->encode(jobs[i].prompt).size());
    SSM_CHECK(len < max_len, "prompt {}: the prompt has {} tokens, which leaves no room to generate within the maximum "
              "context length of {} tokens ({})", i, len, max_len, source);
    SamplingParams& sp = jobs[i].params;
    if (static_cast<long long>(len) + sp.max_tokens > max_len) {
      std::cerr << fmt::format("warning: prompt {}: {} prompt tokens + max_tokens {} exceed the maximum context length "
                               "of {} tokens ({}); generating at most {} tokens\n", i, len, sp.max_tokens, max_len, source,
                               max_len - len);
      sp.max_tokens = max_len - len;
      sp.min_tokens = std::min(sp.min_tokens, sp.max_tokens);
    }
  }
}

/// The checks that need the model, made before any prompt runs so that an error names the prompt's file:line (the
/// engine would make them too, naming no prompt): token ids (stop_token_ids, logit_bias, allowed_token_ids) below the
/// model's vocab_size, and bad_words tokenized into bad_words_token_ids (tokenize_bad_words: a word that tokenizes to
/// nothing, or past kMaxBadWords sequences / kMaxBadWordsTotalTokens tokens, is an error), as the server does on its
/// request thread. Throws Error naming the job's `where` and the JSON field, or for --prompt the flag.
void check_against_model(std::vector<PromptJob>& jobs, const LLMEngine& engine) {
  const int vocab = engine.model_config().vocab_size;
  const Tokenizer* tok = engine.tokenizer();
  for (PromptJob& job : jobs) {
    SamplingParams& sp = job.params;
    try {
      sp.validate(vocab);
      if (!sp.bad_words.empty()) {
        SSM_CHECK(tok, "bad_words need a tokenizer (the model has none)");
        sp.bad_words_token_ids = tokenize_bad_words(sp.bad_words, *tok, vocab);
      }
      SSM_CHECK(!sp.structured_outputs || tok, "structured_outputs need a tokenizer (the model has none)");
    } catch (const Error& e) {
      if (!job.where.empty()) fail_naming_line(job.where, e);
      if (const auto* bad = dynamic_cast<const SamplingParamsError*>(&e)) fail_naming_flag(*bad);  // --prompt: the flags'
      throw;
    }
  }
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
  j["num_cached_tokens"] = o.num_cached_tokens;  // prompt tokens served from the prefix cache (vLLM's name)
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
  if (a.max_model_len_given) {
    check_max_model_len(a.max_model_len);
    a.engine.max_model_len = a.max_model_len;  // the engine checks it against the model's context when it loads
  }
  if (a.seed_given) {
    // As the server: an integer in [0, 2^63 - 1]; out-of-range values are an error, never clamped.
    long long v = -1;
    const char* end = a.seed.data() + a.seed.size();
    const auto [ptr, ec] = std::from_chars(a.seed.data(), end, v);
    SSM_CHECK(ec == std::errc() && ptr == end && !a.seed.empty() && v >= 0,
              "--seed must be an integer in [0, {}] (got '{}')", std::numeric_limits<long long>::max(), a.seed);
    sp.seed = static_cast<uint64_t>(v);
  }
  for (size_t i = 0; i < sp.stop_token_ids.size(); ++i)
    SSM_CHECK(sp.stop_token_ids[i] >= 0, "--stop-token-ids: entry {} is {}; token ids must be >= 0", i, sp.stop_token_ids[i]);
  SamplingParams rest = sp;
  rest.stop_token_ids.clear();  // vocabulary-dependent: checked against the model (check_against_model)
  try {
    rest.validate(1);
  } catch (const SamplingParamsError& e) {
    fail_naming_flag(e);
  }
}

int run_generate(GenerateArgs& a) {
  resolve_engine_config(a.engine, a.load_format);
  check_flags(a);  // fail fast on bad flags before loading the model
  std::vector<PromptJob> jobs = a.prompt_given ? std::vector<PromptJob>{{a.prompt, a.params, ""}}
                                               : read_prompts_file(a.prompts_file, a.params);
  LLM llm(a.engine);
  LLMEngine& engine = llm.engine();
  // The engine refused a --max-model-len above the model's context or the block pool when it was built.
  fit_to_context(jobs, engine, a.max_model_len_given);
  check_against_model(jobs, engine);
  // Stream a single text prompt as it is generated; otherwise run the batch and print in input order.
  if (!a.json && jobs.size() == 1) {
    Request r;
    r.request_id = "0";
    r.prompt = jobs[0].prompt;
    r.params = jobs[0].params;
    engine.add_request(std::move(r));
    std::cout << jobs[0].prompt << std::flush;
    while (engine.has_unfinished_requests())
      for (const auto& o : engine.step()) std::cout << o.delta_text << std::flush;
    std::cout << std::endl;
    return 0;
  }
  std::vector<std::string> prompts;
  std::vector<SamplingParams> params;
  for (const auto& j : jobs) prompts.push_back(j.prompt), params.push_back(j.params);
  std::vector<RequestOutput> outs = llm.generate(prompts, params);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (a.json) std::cout << to_json(outs[i], params[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
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
  auto* mml = add_max_model_len_option(*cmd, a->max_model_len, "none");
  auto* p1 = cmd->add_option("--prompt", a->prompt, "Prompt text");
  auto* p2 = cmd->add_option("--prompts-file", a->prompts_file,
                             "JSONL file (- = stdin), one object per line: {\"prompt\": \"...\"} plus optional per-prompt "
                             "sampling fields overriding the flags: max_tokens, min_tokens, temperature, top_p, top_k, min_p, "
                             "seed, stop, stop_token_ids, ignore_eos, logprobs, prompt_logprobs, presence_penalty, "
                             "frequency_penalty, repetition_penalty, include_stop_str_in_output, skip_special_tokens, logit_bias "
                             "({\"id\": bias}), allowed_token_ids, bad_words, and one constraint: structured_outputs ({\"json\" | "
                             "\"regex\" | \"choice\" | \"grammar\" | \"json_object\" | \"structural_tag\": ...}), "
                             "response_format, or guided_json / guided_regex / guided_choice / guided_grammar");
  p1->excludes(p2);
  SamplingParams& sp = a->params;
  cmd->add_option("--max-tokens", sp.max_tokens, "Tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--min-tokens", sp.min_tokens, "Tokens to generate before EOS / stop ids may end a sequence");
  cmd->add_option("--temperature", sp.temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", sp.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", sp.top_k, "Keep the k most likely tokens (0 or -1 = all)")->capture_default_str();
  cmd->add_option("--min-p", sp.min_p, "Drop tokens with p < min_p * p_max")->capture_default_str();
  auto* seed = cmd->add_option("--seed", a->seed, "Per-request random seed in [0, 2^63 - 1] (same seed, same output)");
  cmd->add_option("--repetition-penalty", sp.repetition_penalty, "HF repetition penalty (> 0, 1 = off)");
  cmd->add_option("--presence-penalty", sp.presence_penalty, "OpenAI presence penalty");
  cmd->add_option("--frequency-penalty", sp.frequency_penalty, "OpenAI frequency penalty");
  cmd->add_option("--stop", sp.stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-ids", sp.stop_token_ids, "Token ids that end a sequence");
  cmd->add_flag("--ignore-eos", sp.ignore_eos, "Keep generating after EOS");
  cmd->add_option("--logprobs", sp.logprobs, "Top-K logprobs of each generated token (JSON output)");
  cmd->add_option("--prompt-logprobs", sp.prompt_logprobs, "Top-K logprobs of each prompt position (JSON output)");
  cmd->add_flag("--json", a->json, "Print one JSON object per prompt, in input order");
  cmd->callback([a, p1, p2, seed, mml] {
    if (p1->count() == 0 && p2->count() == 0) throw CLI::RequiredError("--prompt or --prompts-file");
    a->prompt_given = p1->count() > 0;
    a->seed_given = seed->count() > 0;
    a->max_model_len_given = mml->count() > 0 && a->max_model_len != -1;  // -1 / auto: the model's (vLLM)
  });
  return [a] { return run_generate(*a); };
}

}  // namespace ssmserve::cli
