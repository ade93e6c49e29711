// Owns the conversion of a request's engine state into the RequestOutput handed to callers (LLMEngine::make_output).
#include "engine/llm_engine.h"

#include <algorithm>

namespace ssmserve {

RequestOutput LLMEngine::make_output(RequestState& r) {
  RequestOutput o;
  o.request_id = r.request.request_id;
  o.prompt = r.request.prompt;
  o.prompt_token_ids = r.request.prompt_token_ids;
  o.finished = r.finished();
  o.num_cached_tokens = std::max(0, r.num_cached_tokens);
  if (o.finished || r.output_token_ids.size() == 1) o.prompt_logprobs = r.prompt_logprobs;
  CompletionOutput c;
  c.text = r.text;
  c.token_ids = r.output_token_ids;
  c.logprobs = r.logprobs;
  c.finish_reason = r.finish_reason;
  c.stop_reason = r.stop_reason;
  c.stop_reason_token = r.stop_reason_token;
  o.outputs.push_back(std::move(c));
  const size_t safe = o.finished ? r.text.size() : r.stop->streamable_chars(r.text);
  if (safe > r.streamed_chars) {
    o.delta_text = r.text.substr(r.streamed_chars, safe - r.streamed_chars);
    r.streamed_chars = safe;
  }
  return o;
}

}  // namespace ssmserve
