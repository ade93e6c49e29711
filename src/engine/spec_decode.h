// Owns speculative decoding's engine-side pieces (vllm-ssm-design.md §6): the parsed --speculative-config (vLLM's
// SpeculativeConfig names), the proposer interface that drafts tokens for the running requests (n-gram prompt lookup
// here; a draft model or an MTP head is one more Proposer), and the acceptance counters. The verify rows themselves
// (1 + k tokens, one state column per token) are built by the engine (engine/llm_engine.cpp), scheduled by
// engine/scheduler.cpp, run by the decode kernels through kernels/decode_rows.h and accepted in
// engine/step_outputs.cpp.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ssmserve {

struct RequestState;

/// Most draft tokens per step (vLLM accepts more, but verify rows beyond 16 tokens gain nothing here).
inline constexpr int kMaxSpeculativeTokens = 16;

/// --speculative-config, parsed (vLLM's field names).
struct SpeculativeConfig {
  /// "ngram" (prompt lookup), "draft_model", or "replay" (benchmark only: EngineConfig::allow_benchmark_proposers);
  /// empty = off
  std::string method;
  int num_speculative_tokens = 0;  ///< k: drafts per request per step, in [1, kMaxSpeculativeTokens]
  int prompt_lookup_min = 0;       ///< ngram: shortest n-gram matched (vLLM's default: both 5 when neither is set)
  int prompt_lookup_max = 0;       ///< ngram: longest n-gram matched
  std::string model;               ///< draft_model: the draft checkpoint folder
  /// Each request verifies as many of its k drafts as its acceptance so far makes worthwhile (engine/draft_length.h),
  /// down to none with a periodic one-draft probe; false: always every draft the proposer gives (vLLM's behaviour).
  /// Output is the same either way; only the cost of rejected drafts changes.
  bool adaptive_draft_length = true;
  double acceptance_rate = 1.0;    ///< replay: chance that each draft is the true next token, in [0, 1]
  uint64_t seed = 0;               ///< replay: seed of the right / wrong choice per position
  bool enabled() const { return num_speculative_tokens > 0; }
  /// Whether the method is a benchmark-only drafter (replay), which only `ssmserve bench latency` may use.
  bool benchmark_only() const { return method == "replay"; }

  /// Parses the JSON text of --speculative-config ("" = off). Without "method" (or with null) the method is inferred
  /// from "model" as vLLM does: "ngram" / "[ngram]" mean prompt lookup, any other folder draft_model. Throws Error
  /// naming the field for malformed JSON, neither a method nor a model, an
  /// unknown method or key, k outside [1, 16], bad lookup sizes, a draft_model without "model", a replay
  /// acceptance_rate outside [0, 1] or a negative seed, or a field of another method.
  static SpeculativeConfig parse(const std::string& json_text);
};

/// Drafts tokens for running requests. propose() is called once per engine step, before scheduling, with the
/// requests that will decode this step (their state holds every token but the last one they know); it fills each
/// request's draft_token_ids with at most k proposed continuations of its tokens (possibly none).
class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void propose(std::span<RequestState* const> reqs, int k) = 0;
  /// The request finished or was aborted: drop what the proposer keeps for it.
  virtual void release(const std::string& request_id) { (void)request_id; }
};

/// Prompt lookup (vLLM's NgramProposer): for n from prompt_lookup_max down to prompt_lookup_min, the last n tokens of
/// the sequence (prompt + output) are searched for at an earlier position; at the latest earlier match, the tokens
/// that followed it (up to k) are the drafts. No match: no drafts.
class NgramProposer final : public Proposer {
 public:
  NgramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<RequestState* const> reqs, int k) override;
  /// The drafts for one token sequence (exposed for tests): at most k tokens.
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int min_n, int max_n, int k);

 private:
  int min_n_, max_n_;
};

/// What a proposer may need to know of the target engine.
struct ProposerContext {
  int target_vocab = 0;                      ///< the target's vocabulary size
  std::filesystem::path target_tokenizer;    ///< the target's tokenizer folder
  int max_num_seqs = 1;                      ///< most running requests
  int max_model_len = 0;                     ///< most tokens per request (0: unknown)
};

/// Builds the proposer a config asks for (ngram, draft_model, replay: a ReplayProposer without continuations, which
/// drafts nothing until the benchmark installs one that has them with LLMEngine::set_proposer). Throws Error naming --speculative-config when it
/// cannot (a draft model that does not load or has another vocabulary).
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg, const ProposerContext& ctx);

/// Counters since the engine started (vLLM's spec_decode metrics).
struct SpecDecodeStats {
  int64_t num_drafts = 0;           ///< verify rows that carried at least one draft
  int64_t num_draft_tokens = 0;     ///< draft tokens verified
  int64_t num_accepted_tokens = 0;  ///< draft tokens accepted
  std::vector<int64_t> accepted_per_pos;  ///< [k] drafts accepted at position i of their row
  /// Accepted / drafted (0 when nothing was drafted).
  double acceptance_rate() const { return num_draft_tokens ? double(num_accepted_tokens) / double(num_draft_tokens) : 0.0; }
  /// Mean tokens a verify row produced: 1 + accepted drafts per row (vLLM's mean acceptance length).
  double mean_acceptance_length() const { return num_drafts ? 1.0 + double(num_accepted_tokens) / double(num_drafts) : 0.0; }
};

}  // namespace ssmserve
