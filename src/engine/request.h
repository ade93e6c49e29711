// Owns the request types: Request (what the client asked, immutable once added) and RequestState (the engine's
// mutable bookkeeping for it), following vLLM v1's Request / mlc-llm's request vs request-state split.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/prefix_cache.h"
#include "engine/draft_length.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/stop_checker.h"

namespace ssmserve {

class IncrementalDetokenizer;
class StructuredOutputGrammar;

/// A client's request. prompt_token_ids is the tokenized prompt (the text may be empty for token prompts).
struct Request {
  std::string request_id;
  std::string prompt;
  std::vector<int> prompt_token_ids;
  SamplingParams params;
  /// vLLM's cache_salt: prefix-cache blocks are shared only among requests with the same salt (empty: none, shared
  /// with every other unsalted request). Mixed into the root of the block hash chain (cache_salt_root).
  std::string cache_salt;
  /// The reply is content from its first token although the prompt leaves the reasoning open by its markers (a chat
  /// request with enable_thinking false under a reasoning format that makes such replies content: nemotron_v3): a
  /// structured output's constraint then applies from the first token instead of after a "</think>" that will not
  /// come. False: the prompt's markers decide (reasoning_ended).
  bool reasoning_off = false;
  std::chrono::steady_clock::time_point arrival_time = std::chrono::steady_clock::now();
};

/// Where a request is in its life.
enum class RequestStatus { Waiting, Running, Preempted, Finished };

/// One prompt position's logprob entry: the prompt token's logprob and the top-k of that distribution.
struct PromptLogprob {
  float token_logprob = 0.0f;
  int rank = 0;  ///< 1-based rank of the prompt token in its distribution: 1 + tokens with a larger logit (vLLM)
  std::vector<TokenLogprob> top;
};

/// The engine's mutable state of one request.
struct RequestState {
  Request request;
  RequestStatus status = RequestStatus::Waiting;
  int num_computed_tokens = 0;               ///< tokens (prompt + output) whose effect is in the state block
  int num_cached_tokens = -1;                ///< prompt tokens the prefix cache supplied at the first schedule (-1: not yet scheduled)
  std::vector<int> output_token_ids;
  std::vector<std::vector<TokenLogprob>> logprobs;  ///< per output token: [chosen, top...] when requested
  std::vector<std::optional<PromptLogprob>> prompt_logprobs;  ///< [prompt_len], entry 0 is nullopt
  int state_block = 0;                       ///< 0 = none held
  std::vector<int> kv_blocks;                ///< KV block table (hybrid models): block i holds positions [i*bs, (i+1)*bs)
  /// Speculative decoding: state columns 1..k of the request's verify rows (column 0 is state_block; after a verify
  /// step the engine swaps the column of the last accepted token into state_block). Held from the first verify row
  /// until the request finishes or is preempted.
  std::vector<int> spec_blocks;
  std::vector<int32_t> draft_token_ids;      ///< speculative decoding: this step's drafts (the proposer's, cut to fit)
  DraftLength draft_length;                  ///< speculative decoding: how many drafts it verifies (adaptive_draft_length)
  std::vector<BlockHash> block_hashes;       ///< prefix caching: token-chain hashes of its full hash blocks so far
  int num_kv_registered = 0;                 ///< prefix caching: leading kv_blocks already in the cached-block table
  FinishReason finish_reason = FinishReason::None;
  std::string stop_reason;                   ///< the stop string that matched, if any
  std::optional<int> stop_reason_token;      ///< the stop_token_ids entry that ended the sequence, if any
  std::string text;                          ///< detokenized output (stop string trimmed when finished)
  size_t streamed_chars = 0;                 ///< how much of `text` was already handed out as deltas
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<StopChecker> stop;
  /// Structured outputs: the matcher of the request's constraint (null when unconstrained); it has accepted every
  /// output token so far.
  std::unique_ptr<StructuredOutputGrammar> grammar;
  /// Structured outputs with a reasoning parser: the output is still inside the model's reasoning, so the grammar
  /// waits (it applies from the token after the reasoning's end marker).
  bool in_reasoning = false;
  RequestRng rng;

  explicit RequestState(Request r);
  ~RequestState();
  int prompt_len() const { return static_cast<int>(request.prompt_token_ids.size()); }
  /// Every token of the sequence so far (prompt then output); the tokens to feed are [num_computed_tokens, size).
  int num_tokens() const { return prompt_len() + static_cast<int>(output_token_ids.size()); }
  int token_at(int pos) const {
    return pos < prompt_len() ? request.prompt_token_ids[pos] : output_token_ids[pos - prompt_len()];
  }
  bool finished() const { return status == RequestStatus::Finished; }
};

}  // namespace ssmserve
