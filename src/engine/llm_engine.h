// Owns the engine loop: LLMEngine::step() = schedule -> build the packed batch -> run the model -> sample ->
// update requests -> emit outputs (vLLM v1's EngineCore.step), and LLM, the offline API that runs it to the end.
#pragma once
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/state_cache.h"
#include "cache/block_pool.h"
#include "cache/prefix_cache_stats.h"
#include "engine/engine_config.h"
#include "engine/request_output.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_decode.h"
#include "engine/structured_output.h"
#include "model/causal_lm.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {

/// Step timing and counters of the last step (for bench and metrics).
struct StepStats {
  int num_prefill_tokens = 0;
  int num_decode_tokens = 0;  ///< decode tokens the step produced (multi-step: those kept, over all model steps)
  double forward_seconds = 0.0;
  int num_model_steps = 1;    ///< > 1: a multi-step decode (EngineConfig::num_scheduler_steps)
};

/// The host form of CausalLM::forward_greedy_steps, for models without one: `steps` forward() calls on a copy of
/// the decode-only `batch`, each logits row's greedy pick (sample_token with temperature 0 and num_top logprobs)
/// written into out [steps, n_logits] (step-major) and fed as that row's next input id. logits / scratch: reused
/// host buffers. Throws what forward() and sample_token throw.
void host_greedy_steps(CausalLM& model, const ForwardBatch& batch, StateCache& cache, int num_top, int steps,
                       std::vector<float>& logits, std::vector<float>& scratch, std::vector<GreedyPick>& out);

/// The engine: owns the model, tokenizer, state pool, scheduler and requests. Single-threaded.
class LLMEngine {
 public:
  /// Loads model and tokenizer (tokenizer optional for dummy weights: token-id prompts only).
  /// Throws Error on any config / checkpoint / tokenizer defect.
  explicit LLMEngine(EngineConfig cfg);
  ~LLMEngine();

  /// Validates and queues a request. Tokenizes `prompt` when prompt_token_ids is empty. Throws Error on an
  /// empty prompt, a token id outside the vocabulary, invalid sampling params, or a duplicate request_id.
  void add_request(Request req);
  /// Aborts a request (no-op if unknown or finished); its block is freed at once.
  void abort_request(const std::string& request_id);
  /// Preempts (by recompute) the running request vLLM would preempt first, the most recently scheduled one;
  /// it resumes later from its tokens with identical results. Returns false when nothing is running.
  bool preempt_newest_request();
  int num_preemptions() const { return scheduler_->num_preemptions(); }
  /// Prefix-cache counters since the engine started (all zero with --no-enable-prefix-caching).
  PrefixCacheStats prefix_cache_stats() const { return scheduler_->prefix_cache_stats(); }
  /// Speculative decoding counters since the engine started (all zero without --speculative-config).
  const SpecDecodeStats& spec_decode_stats() const { return spec_stats_; }
  /// The parsed --speculative-config (method empty when off).
  const SpeculativeConfig& speculative_config() const { return spec_; }
  /// Replaces the proposer (tests and benchmarks: a drafter that is always right, always wrong, or replays a known
  /// continuation). Needs speculative decoding on (num_speculative_tokens > 0): throws Error otherwise.
  void set_proposer(std::unique_ptr<Proposer> p);
  /// Host-tier counters (--swap-space): states and KV pages swapped out of / back into the device pool.
  HostTierStats host_tier_stats() const { return scheduler_->host_tier_stats(); }
  /// Runs one iteration; returns an output for every request that produced tokens or finished this step.
  std::vector<RequestOutput> step();
  bool has_unfinished_requests() const { return scheduler_->has_unfinished() || !compiling_.empty(); }
  /// Drops every cached prefix state and KV page (vLLM's LLMEngine.reset_prefix_cache; Scheduler::reset_prefix_cache):
  /// true once nothing is cached (also with prefix caching off); false, changing nothing, while a request is unfinished.
  bool reset_prefix_cache() { return !has_unfinished_requests() && scheduler_->reset_prefix_cache(); }

  const ModelConfig& model_config() const { return model_->config(); }
  /// Most prompt + generated tokens per request: EngineConfig::max_model_len, else the model's context, else
  /// EngineConfig::max_model_len_without_limit (0 = none).
  int max_model_len() const {
    if (cfg_.max_model_len > 0) return cfg_.max_model_len;
    return model_->config().max_model_len > 0 ? model_->config().max_model_len : cfg_.max_model_len_without_limit;
  }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const EngineConfig& config() const { return cfg_; }
  const StepStats& last_step_stats() const { return stats_; }
  /// Blocks a new request could get now: free ones and cached ones no request holds (evicted on demand).
  int num_free_blocks() const { return scheduler_->num_available_blocks(); }
  /// Blocks holding cached prefix states or KV pages (prefix caching).
  int num_cached_blocks() const { return scheduler_->num_cached_blocks(); }
  /// Resolved prefix-caching settings (mode None when off).
  const PrefixCacheConfig& prefix_cache_config() const { return scheduler_->prefix_config(); }
  /// Tokens per KV block of a hybrid model (KV blocks share the state pool), 0 for pure recurrent models.
  int kv_block_size() const { return model_->kv_block_size(); }
  /// Most tokens one request's KV blocks can hold (hybrid models: (blocks - 2) x kv_block_size, the null block
  /// and the request's state block aside); 0 when the model has no KV blocks (a request's memory does not grow).
  /// (Clamped to INT32_MAX.)
  int pool_token_capacity() const {
    if (kv_block_size() <= 0) return 0;
    const long long t = static_cast<long long>(std::max(0, pool_->num_blocks() - 2)) * kv_block_size();
    return static_cast<int>(std::min<long long>(t, std::numeric_limits<int>::max()));
  }
  /// Requests waiting for their first schedule (or re-schedule after preemption); running ones (for metrics).
  int num_waiting_requests() const { return scheduler_->num_waiting() + static_cast<int>(compiling_.size()); }
  int num_running_requests() const { return scheduler_->num_running(); }
  /// State blocks in the pool including the null block (block 0), so num_state_blocks() - 1 can be handed out.
  int num_state_blocks() const { return pool_->num_blocks(); }
  /// What step()'s outputs hold: OutputKind::Cumulative (the default) or Delta (see RequestOutput).
  void set_output_kind(OutputKind k) { output_kind_ = k; }

 private:
  /// Which positions of a scheduled request need logits, and where its rows start in the logits buffer.
  struct RowPlan {
    int first_logit_row = 0;
    std::vector<int> positions;  ///< sequence positions whose next-token distribution is needed
  };
  /// step()'s body (step() ends the scheduler's step when it throws).
  std::vector<RequestOutput> step_impl();
  /// picks: the step's device greedy picks (one per logits row) instead of logits, or nullptr. Returns the tokens
  /// folded into r's state this step (num_tokens, or for a verify row 1 + its accepted drafts).
  int process_request(RequestState& r, const ScheduledRequest& s, const float* logits, const GreedyPick* picks, const RowPlan& plan,
                      std::vector<RequestOutput>& outs);
  /// The next token of r from logits row `row` of the step (sampled on the host, or the device's pick).
  SampleResult sample_row(RequestState& r, const float* logits, const GreedyPick* picks, int row);
  /// sample_row, except when r's own masks (grammar, allowed_token_ids, bad_words) leave nothing to sample: then r
  /// ends (finish_reason abort; its output, with the `num_new_tokens` tokens this step already added, is appended to
  /// outs) and the result is nullopt. Other errors (NaN logits of an unmasked row) propagate and fail the step.
  std::optional<SampleResult> sample_or_end(RequestState& r, const float* logits, const GreedyPick* picks, int row,
                                            size_t num_new_tokens, std::vector<RequestOutput>& outs);
  /// The next token of a constrained request (structured outputs) from its logits row [vocab]: the row under its
  /// grammar's bitmask, then sample_token.
  SampleResult sample_constrained(RequestState& r, std::span<const float> logits_row);
  /// Hands the constrained requests whose grammars are compiled to the scheduler; one whose compilation failed ends
  /// (finish_reason abort, its output appended to outs).
  void admit_compiled(std::vector<RequestOutput>& outs);
  /// r's output after a step that added its newest `num_new_tokens` tokens, as output_kind_ says
  /// (request_output.cpp).
  RequestOutput make_output(RequestState& r, size_t num_new_tokens);
  /// Prefix caching from cfg_ and the model (mode, block size, hash granularity); throws Error naming the flag.
  PrefixCacheConfig resolve_prefix_cache() const;
  /// --swap-space: checks it against `ram` bytes and gives the scheduler a host tier when the model has one.
  void enable_swap_space(const PrefixCacheConfig& prefix, double ram);
  /// --log-level debug: the pool's split (running / cached / free blocks) and the hit rate, at most every 10 s.
  void log_pool_split();
  /// Appends a sampled token (and its logprobs entry when the request asks for them) to r.
  void append_sample(RequestState& r, const SampleResult& s);
  /// Detokenizes `token` (r's newest output) and finishes r when a stop condition holds.
  void check_stop(RequestState& r, int token);
  /// Model steps for this engine step: cfg_.num_scheduler_steps when the batch is decode-only, every row a plain
  /// greedy pick (plain_greedy: the device greedy predicate), no row a speculative verify row and the model has no
  /// KV blocks, capped at the fewest tokens any request still needs before max_tokens (rounded down to a power of
  /// two when below it); else 1 (a step with verify rows runs the one verify pass).
  int multi_step_count(const SchedulerOutput& sched, const std::vector<ScheduledRequest>& order, bool plain_greedy) const;
  /// Applies picks_ [steps, n_logits] (step-major) to r in order, stopping at its stop, and emits one output with
  /// every new token in delta_token_ids.
  void process_request_steps(RequestState& r, int steps, size_t n_logits, const RowPlan& plan,
                             std::vector<RequestOutput>& outs);

  EngineConfig cfg_;
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<StateCache> cache_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<StructuredOutputManager> structured_;  // structured outputs: built by the first constrained request
  /// Constrained requests waiting for their grammar (in requests_, not yet in the scheduler), in arrival order.
  struct Compiling {
    RequestState* req;
    std::shared_ptr<PendingGrammar> pending;
  };
  std::vector<Compiling> compiling_;
  int reasoning_start_id_ = -1, reasoning_end_id_ = -1;  // --reasoning-parser's marker tokens (-1: none)
  bool reasoning_starts_in_ = false;                       // its ReasoningFormat::starts_in_reasoning
  std::map<std::string, std::unique_ptr<RequestState>> requests_;
  std::vector<float> logits_;   // [num_logit_rows, vocab]
  std::vector<GreedyPick> picks_;  // device greedy steps: [num_logit_rows]
  std::vector<float> scratch_;  // sampler scratch
  std::vector<float> masked_;   // a constrained row's logits after its grammar's mask: [vocab]
  std::vector<int32_t> bitmask_;  // a constrained row's token bitmask: [token_bitmask_words(vocab)]
  DeviceSampleBatch sample_;    // device sampling steps: the packed rows (uniforms drawn) and logit modifications
  bool sample_drawn_ = false;   // this step's uniforms are in sample_.rows
  bool device_sampling_ = true; // try CausalLM::forward_sample (SSMSERVE_DEVICE_SAMPLING=0: never)
  StepStats stats_;
  SpeculativeConfig spec_;              // --speculative-config (off: method empty)
  std::unique_ptr<Proposer> proposer_;  // drafts for the decoding requests (null when off)
  SpecDecodeStats spec_stats_;
  std::chrono::steady_clock::time_point last_pool_log_{};
  OutputKind output_kind_ = OutputKind::Cumulative;
};

/// Offline API (vLLM's `LLM`): LLM(cfg).generate(prompts, params) runs every prompt through the engine with
/// continuous batching and returns the outputs in input order.
class LLM {
 public:
  explicit LLM(EngineConfig cfg) : engine_(std::move(cfg)) {}
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts, const SamplingParams& params);
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts, const std::vector<SamplingParams>& params);
  /// Token-id prompts.
  std::vector<RequestOutput> generate_ids(const std::vector<std::vector<int>>& prompts, const SamplingParams& params);
  LLMEngine& engine() { return engine_; }

 private:
  std::vector<RequestOutput> run(std::vector<Request> reqs);
  LLMEngine engine_;
  int next_id_ = 0;
};

}  // namespace ssmserve
