// Owns the conversion of a request's engine state into the RequestOutput handed to callers (LLMEngine::make_output),
// and the delta form of outputs (to_delta, append_delta, output_bytes) the server streams.
#include "engine/llm_engine.h"

#include <algorithm>
#include <iterator>

namespace ssmserve {

RequestOutput LLMEngine::make_output(RequestState& r, size_t num_new_tokens) {
  const bool delta = output_kind_ == OutputKind::Delta;
  const size_t num_out = r.output_token_ids.size();
  num_new_tokens = std::min(num_new_tokens, num_out);
  const bool first = num_out == num_new_tokens;  // the request's first output (its first sampled tokens)
  RequestOutput o;
  o.request_id = r.request.request_id;
  if (!delta || first) {
    o.prompt = r.request.prompt;
    o.prompt_token_ids = r.request.prompt_token_ids;
  }
  o.finished = r.finished();
  o.num_cached_tokens = std::max(0, r.num_cached_tokens);
  if (first || (o.finished && !delta)) o.prompt_logprobs = r.prompt_logprobs;
  o.delta_token_ids.assign(r.output_token_ids.end() - static_cast<std::ptrdiff_t>(num_new_tokens), r.output_token_ids.end());
  const size_t safe = o.finished ? r.text.size() : r.stop->streamable_chars(r.text);
  if (safe > r.streamed_chars) {
    o.delta_text = r.text.substr(r.streamed_chars, safe - r.streamed_chars);
    r.streamed_chars = safe;
  }
  CompletionOutput c;
  if (delta) {  // only the new part: no copy of the whole output per step
    c.text = o.delta_text;
    c.token_ids = o.delta_token_ids;
    const size_t n_lp = std::min(num_new_tokens, r.logprobs.size());  // one entry per token, when requested
    c.logprobs.assign(r.logprobs.end() - static_cast<std::ptrdiff_t>(n_lp), r.logprobs.end());
  } else {
    c.text = r.text;
    c.token_ids = r.output_token_ids;
    c.logprobs = r.logprobs;
  }
  c.finish_reason = r.finish_reason;
  c.stop_reason = r.stop_reason;
  c.stop_reason_token = r.stop_reason_token;
  o.outputs.push_back(std::move(c));
  return o;
}

void to_delta(RequestOutput& o, bool first) {
  const size_t n_new = o.delta_token_ids.size();
  if (!first) {
    o.prompt.clear();
    o.prompt.shrink_to_fit();
    std::vector<int>().swap(o.prompt_token_ids);
    std::vector<std::optional<PromptLogprob>>().swap(o.prompt_logprobs);
  }
  for (CompletionOutput& c : o.outputs) {
    c.text = o.delta_text;
    if (c.token_ids.size() > n_new) c.token_ids.assign(c.token_ids.end() - static_cast<std::ptrdiff_t>(n_new), c.token_ids.end());
    if (c.logprobs.size() > n_new) {
      std::vector<std::vector<TokenLogprob>> tail(std::make_move_iterator(c.logprobs.end() - static_cast<std::ptrdiff_t>(n_new)),
                                                  std::make_move_iterator(c.logprobs.end()));
      c.logprobs.swap(tail);
    }
  }
}

void append_delta(RequestOutput& acc, RequestOutput&& next) {
  if (acc.prompt_token_ids.empty() && !next.prompt_token_ids.empty()) {
    acc.prompt = std::move(next.prompt);
    acc.prompt_token_ids = std::move(next.prompt_token_ids);
  }
  if (acc.prompt_logprobs.empty()) acc.prompt_logprobs = std::move(next.prompt_logprobs);
  acc.finished = next.finished;
  acc.num_cached_tokens = std::max(acc.num_cached_tokens, next.num_cached_tokens);
  acc.delta_text += next.delta_text;
  acc.delta_token_ids.insert(acc.delta_token_ids.end(), next.delta_token_ids.begin(), next.delta_token_ids.end());
  if (next.outputs.empty()) return;
  if (acc.outputs.empty()) {
    acc.outputs = std::move(next.outputs);
    return;
  }
  CompletionOutput& a = acc.outputs[0];
  CompletionOutput& n = next.outputs[0];
  a.text += n.text;
  a.token_ids.insert(a.token_ids.end(), n.token_ids.begin(), n.token_ids.end());
  a.logprobs.insert(a.logprobs.end(), std::make_move_iterator(n.logprobs.begin()), std::make_move_iterator(n.logprobs.end()));
  a.finish_reason = n.finish_reason;
  a.stop_reason = std::move(n.stop_reason);
  a.stop_reason_token = n.stop_reason_token;
}

size_t output_bytes(const RequestOutput& o) {
  constexpr size_t kVec = sizeof(std::vector<int>);
  size_t b = sizeof(RequestOutput) + o.prompt.size() + o.prompt_token_ids.size() * sizeof(int) + o.delta_text.size() +
             o.delta_token_ids.size() * sizeof(int);
  for (const auto& p : o.prompt_logprobs)
    b += sizeof(p) + (p ? p->top.size() * sizeof(TokenLogprob) : 0);
  for (const auto& c : o.outputs) {
    b += sizeof(CompletionOutput) + c.text.size() + c.token_ids.size() * sizeof(int) + c.stop_reason.size();
    for (const auto& e : c.logprobs) b += kVec + e.size() * sizeof(TokenLogprob);
  }
  return b;
}

}  // namespace ssmserve
