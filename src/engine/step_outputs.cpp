// Owns how a step's logits (or device picks) become each request's tokens and outputs (see llm_engine.h): plain
// decode and prefill rows, prompt scoring, speculative verify rows (acceptance, the state column swap, the adaptive
// draft length's observation), multi-step bursts, stop checks.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <span>

#include "core/error.h"
#include "engine/llm_engine.h"

namespace ssmserve {

namespace {
/// A device pick as the sampler's result for request r: its token, logprob, rank and the first `logprobs` top entries.
/// Error when the device flagged the row (token < 0: NaN / +inf logits, or all -inf).
SampleResult device_pick_result(const GreedyPick& g, const RequestState& r) {
  SSM_CHECK(g.token >= 0, "sampler: the logits of request {} hold a NaN or +inf, or are all -inf", r.request.request_id);
  SampleResult s;
  s.token = g.token;
  s.logprob = g.logprob;
  s.rank = r.request.params.logprobs ? g.sampled_rank : 0;
  const int num_top = std::min<int>(r.request.params.logprobs.value_or(0), static_cast<int>(g.top.size()));
  for (int j = 0; j < num_top; ++j) s.top.push_back({g.top[j].first, g.top[j].second, j + 1});
  return s;
}
}  // namespace

SampleResult LLMEngine::sample_row(RequestState& r, const float* logits, const GreedyPick* picks, int row) {
  const int V = model_->config().vocab_size;
  const SamplingParams& sp = r.request.params;
  const std::span<const float> logits_row(logits + static_cast<size_t>(row) * V, static_cast<size_t>(V));
  const double uniform = sample_drawn_ ? sample_.rows[row].uniform : 0.0;
  if (picks && picks[row].token == kPickOnHost)  // left to the host by the device sampler
    return sample_token_with_uniform(picks[row].logits, sp, r.request.prompt_token_ids, r.output_token_ids,
                                     model_->config().eos_token_ids, uniform, scratch_);
  if (picks) return device_pick_result(picks[row], r);  // picked on the device (step 3)
  if (r.grammar && !r.in_reasoning) return sample_constrained(r, logits_row);
  if (sample_drawn_)  // the uniform was drawn for a device step the model declined
    return sample_token_with_uniform(logits_row, sp, r.request.prompt_token_ids, r.output_token_ids,
                                     model_->config().eos_token_ids, uniform, scratch_);
  return sample_token(logits_row, sp, r.request.prompt_token_ids, r.output_token_ids, model_->config().eos_token_ids, r.rng,
                      scratch_);
}

SampleResult LLMEngine::sample_constrained(RequestState& r, std::span<const float> logits_row) {
  // Structured outputs: the grammar's mask applies to the raw logits before the sampler (vLLM's
  // apply_grammar_bitmask), so the logprobs are those of the constrained distribution.
  const SamplingParams& sp = r.request.params;
  masked_.assign(logits_row.begin(), logits_row.end());
  bitmask_.resize(static_cast<size_t>(token_bitmask_words(static_cast<int>(logits_row.size()))));
  if (r.grammar->fill_bitmask(bitmask_)) apply_token_bitmask(masked_, bitmask_);
  // A complete text can only end: min_tokens no longer holds EOS back (it would leave no token to sample).
  if (r.grammar->is_completed() && !sp.ignore_eos && static_cast<int>(r.output_token_ids.size()) < sp.min_tokens) {
    SamplingParams relaxed = sp;
    relaxed.min_tokens = 0;
    return sample_token(masked_, relaxed, r.request.prompt_token_ids, r.output_token_ids, model_->config().eos_token_ids,
                        r.rng, scratch_);
  }
  return sample_token(masked_, sp, r.request.prompt_token_ids, r.output_token_ids, model_->config().eos_token_ids, r.rng,
                      scratch_);
}

int LLMEngine::process_request(RequestState& r, const ScheduledRequest& s, const float* logits, const GreedyPick* picks,
                               const RowPlan& plan, std::vector<RequestOutput>& outs) {
  const int V = model_->config().vocab_size;
  const SamplingParams& sp = r.request.params;
  if (s.num_draft_tokens > 0) {
    // Verify row (vllm-ssm-design.md §6.1): position j's logits give the token after draft j - 1. Each token is
    // sampled exactly as a plain decode step would sample it (same logits, history and RNG draw), and draft j is
    // accepted when it equals the token sampled at its position: for a proposer that drafts one token per position
    // (n-gram, a greedy drafter), this is the rejection rule of Leviathan et al. 2023 (accept with probability
    // min(1, p/q) = p(draft), else draw from the residual), so the output distribution is the target's, and a seeded
    // request's tokens are identical with and without speculation. The state after the last kept token is in its
    // column: swapped into state_block (no copy). A stop inside the row ends it there.
    const int drafts = s.num_draft_tokens, c = s.num_computed_before;
    int kept = 0, accepted_drafts = 0;
    for (int j = 0; j <= drafts && !r.finished(); ++j) {
      r.num_computed_tokens = c + j + 1;  // token c + j (the last known token or draft j) is in column j
      if (j > 0) std::swap(r.state_block, r.spec_blocks[static_cast<size_t>(j - 1)]);
      const std::optional<SampleResult> res = sample_or_end(r, logits, picks, plan.first_logit_row + j, kept, outs);
      if (!res) return j + 1;  // ended by its own masks: its state holds the tokens up to c + j
      append_sample(r, *res);
      ++kept;
      const bool accepted = j < drafts && res->token == r.draft_token_ids[static_cast<size_t>(j)];
      if (accepted) ++spec_stats_.accepted_per_pos[static_cast<size_t>(j)], ++accepted_drafts;
      check_stop(r, res->token);
      if (!accepted) break;
    }
    r.draft_length.observe(drafts, accepted_drafts);
    spec_stats_.num_drafts += 1;
    spec_stats_.num_draft_tokens += drafts;
    spec_stats_.num_accepted_tokens += accepted_drafts;
    outs.push_back(make_output(r, static_cast<size_t>(kept)));
    return kept;
  }
  r.num_computed_tokens += s.num_tokens;
  bool sampled = false;
  for (size_t k = 0; k < plan.positions.size(); ++k) {
    const int p = plan.positions[k];
    auto row = [&] { return std::span<const float>(logits + static_cast<size_t>(plan.first_logit_row + k) * V, V); };
    if (p + 1 < r.prompt_len()) {  // 1. Score prompt token p+1 (never a device greedy step).
      PromptLogprob lp;
      if (picks) {  // scored on the device (step 3b: SampleRowParams::score_token)
        const GreedyPick& g = picks[plan.first_logit_row + static_cast<int>(k)];
        SSM_CHECK(g.token >= 0, "prompt logprobs: the logits of request {} hold a NaN or +inf, or are all -inf",
                  r.request.request_id);
        for (const auto& [id, lpv] : g.top) lp.top.push_back({id, lpv, static_cast<int>(lp.top.size()) + 1});
        lp.token_logprob = g.score_logprob;
        lp.rank = g.score_rank;
        r.prompt_logprobs[p + 1] = std::move(lp);
        continue;
      }
      lp.top = top_logprobs(row(), *sp.prompt_logprobs, &lp.token_logprob, r.token_at(p + 1));
      lp.rank = raw_rank(row(), row()[r.token_at(p + 1)]);
      r.prompt_logprobs[p + 1] = std::move(lp);
      continue;
    }
    // 2. Sample the next token from the last position (a row its own masks leave empty ends its request: sample_or_end).
    const std::optional<SampleResult> res = sample_or_end(r, logits, picks, plan.first_logit_row + static_cast<int>(k), 0, outs);
    if (!res) return s.num_tokens;
    append_sample(r, *res);
    sampled = true;
  }
  if (!sampled) return s.num_tokens;
  // Structured outputs: a complete text whose EOS the grammar accepted ends here, min_tokens or not (the sampler let
  // EOS through because nothing else was allowed; the stop check would keep padding with EOS).
  if (r.grammar && !r.in_reasoning && r.grammar->is_terminated() && !r.request.params.ignore_eos) {
    if (r.detok) {  // the EOS that ended the grammar is a stop token: its text only with include_stop_str_in_output
      const size_t start = r.text.size();
      r.text += r.detok->push(r.output_token_ids.back());
      if (!r.request.params.include_stop_str_in_output) r.text.resize(start);
      r.text += r.detok->flush();
    }
    r.finish_reason = FinishReason::Stop;
    scheduler_->finish_request(&r);
  } else {
    check_stop(r, r.output_token_ids.back());
  }
  outs.push_back(make_output(r, 1));
  return s.num_tokens;
}

std::optional<SampleResult> LLMEngine::sample_or_end(RequestState& r, const float* logits, const GreedyPick* picks, int row,
                                                     size_t num_new_tokens, std::vector<RequestOutput>& outs) {
  try {
    return sample_row(r, logits, picks, row);
  } catch (const Error& e) {
    // A row whose own masks leave nothing to sample (a grammar with no way on, allowed_token_ids outside it, bad_words
    // banning what is left, or all held back by min_tokens) ends its own request (finish_reason abort), not the step:
    // the other requests go on. Without such masks an error is the model's (NaN logits) and fails the step.
    const SamplingParams& sp = r.request.params;
    if (!r.grammar && sp.allowed_token_ids.empty() && sp.bad_words_token_ids.empty()) throw;
    spdlog::warn("request {} ends (abort): {}", r.request.request_id, e.what());
    r.finish_reason = FinishReason::Abort;
    scheduler_->finish_request(&r);
    outs.push_back(make_output(r, num_new_tokens));
    return std::nullopt;
  }
}

void LLMEngine::append_sample(RequestState& r, const SampleResult& s) {
  r.output_token_ids.push_back(s.token);
  // The grammar follows every output token after the reasoning (sampled under its mask, so it is accepted).
  if (r.grammar && r.in_reasoning) {
    if (s.token == reasoning_end_id_) r.in_reasoning = false;  // the marker itself is not part of the constrained text
  } else if (r.grammar)
    SSM_CHECK(r.grammar->accept_token(s.token), "structured outputs: request {}: token {} is outside its grammar",
              r.request.request_id, s.token);
  if (r.request.params.logprobs) {
    std::vector<TokenLogprob> entry{{s.token, s.logprob, s.rank}};
    for (const auto& t : s.top)
      if (t.id != s.token) entry.push_back(t);
    r.logprobs.push_back(std::move(entry));
  }
}

void LLMEngine::check_stop(RequestState& r, int token) {
  const size_t new_start = r.text.size();
  if (r.detok) r.text += r.detok->push(token);
  StopDecision d = r.stop->on_token(token, r.text, new_start, static_cast<int>(r.output_token_ids.size()));
  if (d.reason != FinishReason::None) {
    r.text.resize(d.keep_chars);
    if (r.detok && d.stop_str.empty()) r.text += r.detok->flush();  // complete any held-back bytes
    r.finish_reason = d.reason;
    r.stop_reason = d.stop_str;
    r.stop_reason_token = d.stop_reason_token;
    scheduler_->finish_request(&r);
  }
}

int LLMEngine::multi_step_count(const SchedulerOutput& sched, const std::vector<ScheduledRequest>& order,
                                bool plain_greedy) const {
  const int K = cfg_.num_scheduler_steps;
  // Hybrids (KV blocks) are excluded: the scheduler allocates KV blocks for one token per decode step.
  if (K <= 1 || !plain_greedy || !sched.prefills.empty() || model_->kv_block_size() > 0) return 1;
  // A request that stops inside the K steps keeps only its tokens up to there (the extra steps advanced a state
  // that is freed with it). So that no step runs for nothing, a burst is at most the fewest tokens any request
  // still needs before max_tokens, rounded down to a power of two below K (a few graph shapes for the tails).
  int left = K;
  for (const ScheduledRequest& o : order) {
    const RequestState& r = *o.req;
    // Speculative decoding: a step with a verify row runs one model step (the verify pass); the burst is for
    // steps in which no request has drafts (none proposed or fitted, or the adaptive draft length at 0).
    if (o.num_draft_tokens > 0) return 1;
    const bool decode = o.num_tokens == 1 && r.num_computed_tokens + 1 == r.num_tokens() && r.num_computed_tokens > 0;
    if (!decode) return 1;
    left = std::min(left, r.request.params.max_tokens - static_cast<int>(r.output_token_ids.size()));
    // Prefix caching: a burst ends on the next block boundary at the latest, so the state there can be cached.
    if (const int bs = scheduler_->prefix_config().block_size; scheduler_->prefix_config().enabled())
      left = std::min(left, bs - r.num_computed_tokens % bs);
  }
  if (left >= K) return K;
  int steps = 1;
  while (steps * 2 <= left) steps *= 2;
  return steps;
}

void LLMEngine::process_request_steps(RequestState& r, int steps, size_t n_logits, const RowPlan& plan,
                                      std::vector<RequestOutput>& outs) {
  std::vector<int> delta;
  for (int j = 0; j < steps && !r.finished(); ++j) {
    const GreedyPick& g = picks_.at(static_cast<size_t>(j) * n_logits + static_cast<size_t>(plan.first_logit_row));
    const SampleResult s = device_pick_result(g, r);
    r.num_computed_tokens += 1;
    append_sample(r, s);
    delta.push_back(s.token);
    check_stop(r, s.token);
  }
  outs.push_back(make_output(r, delta.size()));
}

}  // namespace ssmserve
