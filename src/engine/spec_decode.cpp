// Owns the speculative-decoding config parser, the n-gram proposer and make_proposer (see spec_decode.h).
#include "engine/spec_decode.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"
#include "engine/draft_model_proposer.h"
#include "engine/replay_proposer.h"
#include "engine/request.h"

namespace ssmserve {

namespace {

/// An integer field of the config object (absent: `def`). Throws naming the field when it is not an integer or is
/// outside [-2^30, 2^30] (the callers check their own ranges).
int int_field(const nlohmann::json& j, const char* key, int def) {
  if (!j.contains(key)) return def;
  const auto& v = j[key];
  SSM_CHECK(v.is_number_integer(), "--speculative-config: \"{}\" must be an integer (got {})", key, v.dump());
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= (1ULL << 30)
                                           : v.get<int64_t>() >= -(1LL << 30) && v.get<int64_t>() <= (1LL << 30);
  SSM_CHECK(fits, "--speculative-config: \"{}\" is out of range (got {})", key, v.dump());
  return static_cast<int>(v.get<int64_t>());
}

}  // namespace

SpeculativeConfig SpeculativeConfig::parse(const std::string& json_text) {
  SpeculativeConfig c;
  if (json_text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("--speculative-config: not valid JSON ({})", e.what());
  }
  SSM_CHECK(j.is_object(), "--speculative-config must be a JSON object, e.g. {{\"method\": \"ngram\", "
                           "\"num_speculative_tokens\": 4}} (got {})", j.dump());
  static const char* kKeys[] = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model",
                                "adaptive_draft_length", "acceptance_rate", "seed"};
  for (const auto& [key, value] : j.items()) {
    (void)value;
    SSM_CHECK(std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) != std::end(kKeys),
              "--speculative-config: unknown field \"{}\" (known: method, num_speculative_tokens, prompt_lookup_min, "
              "prompt_lookup_max, model, adaptive_draft_length, acceptance_rate, seed)", key);
  }
  if (!j.contains("method") || j["method"].is_null()) {
    // vLLM infers the method from "model": "ngram" / "[ngram]" name prompt lookup, any other model a draft model.
    SSM_CHECK(j.contains("model") && j["model"].is_string(),
              "--speculative-config: \"method\" must be a string: \"ngram\" or \"draft_model\" (or leave it out and give "
              "\"model\": the draft checkpoint folder, as vLLM)");
    const std::string m = j["model"].get<std::string>();
    j["method"] = m == "ngram" || m == "[ngram]" ? "ngram" : "draft_model";
    if (j["method"] == "ngram") j.erase("model");
  }
  SSM_CHECK(j["method"].is_string(), "--speculative-config: \"method\" must be a string: \"ngram\" or \"draft_model\"");
  c.method = j["method"].get<std::string>();
  SSM_CHECK(c.method == "ngram" || c.method == "draft_model" || c.method == "replay",
            "--speculative-config: unknown method \"{}\" (known: ngram, draft_model; replay in ssmserve bench latency)",
            c.method);
  SSM_CHECK(j.contains("num_speculative_tokens"), "--speculative-config: \"num_speculative_tokens\" is required");
  c.num_speculative_tokens = int_field(j, "num_speculative_tokens", 0);
  SSM_CHECK(c.num_speculative_tokens >= 1 && c.num_speculative_tokens <= kMaxSpeculativeTokens,
            "--speculative-config: \"num_speculative_tokens\" must be in [1, {}] (got {})", kMaxSpeculativeTokens,
            c.num_speculative_tokens);
  if (c.method != "replay")
    SSM_CHECK(!j.contains("acceptance_rate") && !j.contains("seed"),
              "--speculative-config: \"acceptance_rate\" / \"seed\" are for method replay (bench latency), not {}", c.method);
  if (c.method == "replay") {
    if (j.contains("acceptance_rate")) {
      const auto& v = j["acceptance_rate"];
      SSM_CHECK(v.is_number(), "--speculative-config: \"acceptance_rate\" must be a number in [0, 1] (got {})", v.dump());
      c.acceptance_rate = v.get<double>();
      SSM_CHECK(c.acceptance_rate >= 0.0 && c.acceptance_rate <= 1.0,
                "--speculative-config: \"acceptance_rate\" must be in [0, 1] (got {})", v.dump());
    }
    const int seed = int_field(j, "seed", 0);
    SSM_CHECK(seed >= 0, "--speculative-config: \"seed\" must be >= 0 (got {})", seed);
    c.seed = static_cast<uint64_t>(seed);
    SSM_CHECK(!j.contains("model") && !j.contains("prompt_lookup_min") && !j.contains("prompt_lookup_max"),
              "--speculative-config: method replay takes num_speculative_tokens, acceptance_rate and seed only "
              "(\"model\" is for draft_model, \"prompt_lookup_*\" for ngram)");
  } else if (c.method == "ngram") {
    // vLLM's defaults: both 5 when neither is given, else the one given for both.
    int lo = int_field(j, "prompt_lookup_min", 0), hi = int_field(j, "prompt_lookup_max", 0);
    const bool has_lo = j.contains("prompt_lookup_min"), has_hi = j.contains("prompt_lookup_max");
    if (!has_lo && !has_hi) lo = hi = 5;
    else if (!has_lo) lo = hi;
    else if (!has_hi) hi = lo;
    SSM_CHECK(lo >= 1, "--speculative-config: \"prompt_lookup_min\" must be >= 1 (got {})", lo);
    SSM_CHECK(hi >= 1 && hi <= 1024, "--speculative-config: \"prompt_lookup_max\" must be in [1, 1024] (got {})", hi);
    SSM_CHECK(lo <= hi, "--speculative-config: \"prompt_lookup_min\" {} must be <= \"prompt_lookup_max\" {}", lo, hi);
    c.prompt_lookup_min = lo, c.prompt_lookup_max = hi;
    SSM_CHECK(!j.contains("model"), "--speculative-config: \"model\" is for method draft_model, not ngram");
  } else {
    SSM_CHECK(j.contains("model"), "--speculative-config: method draft_model needs \"model\": the draft checkpoint folder");
    SSM_CHECK(j["model"].is_string() && !j["model"].get<std::string>().empty(),
              "--speculative-config: \"model\" must be the draft checkpoint folder, a non-empty string (got {})",
              j["model"].dump());
    c.model = j["model"].get<std::string>();
    SSM_CHECK(!j.contains("prompt_lookup_min") && !j.contains("prompt_lookup_max"),
              "--speculative-config: \"prompt_lookup_min\" / \"prompt_lookup_max\" are for method ngram");
  }
  if (j.contains("adaptive_draft_length")) {
    SSM_CHECK(j["adaptive_draft_length"].is_boolean(), "--speculative-config: \"adaptive_draft_length\" must be true or "
              "false (got {})", j["adaptive_draft_length"].dump());
    c.adaptive_draft_length = j["adaptive_draft_length"].get<bool>();
  }
  return c;
}

std::vector<int32_t> NgramProposer::lookup(std::span<const int32_t> tokens, int min_n, int max_n, int k) {
  const int64_t L = static_cast<int64_t>(tokens.size());
  for (int n = std::min<int64_t>(max_n, L - 1); n >= min_n; --n) {
    const std::span<const int32_t> tail = tokens.subspan(static_cast<size_t>(L - n));
    // The latest earlier occurrence: start positions L - n - 1 down to 0 (an occurrence may overlap the tail).
    for (int64_t s = L - n - 1; s >= 0; --s) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + s)) continue;
      const int64_t from = s + n, to = std::min<int64_t>(from + k, L);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

void NgramProposer::propose(std::span<RequestState* const> reqs, int k) {
  std::vector<int32_t> seq;
  for (RequestState* r : reqs) {
    seq.resize(static_cast<size_t>(r->num_tokens()));
    for (int p = 0; p < r->num_tokens(); ++p) seq[static_cast<size_t>(p)] = r->token_at(p);
    r->draft_token_ids = lookup(seq, min_n_, max_n_, k);
  }
}

std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg, const ProposerContext& ctx) {
  if (cfg.method == "ngram") return std::make_unique<NgramProposer>(cfg.prompt_lookup_min, cfg.prompt_lookup_max);
  if (cfg.method == "draft_model")
    return std::make_unique<DraftModelProposer>(cfg.model, ctx.target_vocab, ctx.target_tokenizer, ctx.max_num_seqs,
                                                ctx.max_model_len);
  if (cfg.method == "replay")
    return std::make_unique<ReplayProposer>(nullptr, ctx.target_vocab, cfg.acceptance_rate, cfg.seed);
  fail("--speculative-config: method \"{}\" is not available in this build", cfg.method);
}

}  // namespace ssmserve
