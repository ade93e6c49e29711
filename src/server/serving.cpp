// Owns the OpenAI response rendering of a generation job (see serving.h).
#include "server/serving.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

namespace ssmserve::server {

using json = nlohmann::ordered_json;  // keys in the order written: OpenAI's field order, vLLM's top_logprobs order

std::unique_ptr<ToolParser> job_tool_parser(const GenerationJob& job) {
  if (job.forced_tool) return make_forced_tool_parser(*job.forced_tool);
  return make_tool_parser(job.tool_parser, job.tools);
}

ReasoningParser job_reasoning_parser(const GenerationJob& job) {
  if (!job.reasoning) throw std::logic_error("job_reasoning_parser: the job has no reasoning format");
  return ReasoningParser(*job.reasoning, job.prompt_reasoning);
}

json stop_reason_json(const CompletionOutput& c) {
  if (!c.stop_reason.empty()) return c.stop_reason;
  if (c.stop_reason_token) return *c.stop_reason_token;
  return nullptr;
}

ResponseBuilder::ResponseBuilder(std::shared_ptr<GenerationJob> job) : job_(std::move(job)) {
  const size_t choices = job_->request_ids.size();
  acc_.resize(choices);
  finished_.assign(choices, 0);
  num_tokens_.assign(choices, 0);
  num_cached_.assign(choices, 0);
  next_offset_.assign(choices, 0);
  sent_prompt_logprobs_.assign(choices, 0);
  sent_prompt_ids_.assign(choices, 0);
  num_tool_calls_.assign(choices, 0);
  placeholder_ = fmt::format("ssm-lp-{:016x}-", std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}());
  if (job_->chat && job_->stream && job_->has_tool_parser())
    for (size_t i = 0; i < choices; ++i) tool_parsers_.push_back(job_tool_parser(*job_));
  if (job_->chat && job_->stream && job_->reasoning) reasoning_parsers_.assign(choices, job_reasoning_parser(*job_));
}

std::string ResponseBuilder::token_text(int id) const {
  if (!job_->tokenizer) return "";
  const int ids[1] = {id};
  return job_->tokenizer->decode(ids);
}

std::string ResponseBuilder::logprob_token(int id) const {
  return job_->return_tokens_as_token_ids ? "token_id:" + std::to_string(id) : token_text(id);
}

size_t ResponseBuilder::token_chars(int id) const {
  const Tokenizer* tok = job_->tokenizer;
  return tok && tok->has_id(id) ? utf8_char_count(tok->token_bytes(id)) : 0;
}

json ResponseBuilder::chunk(json choice) const {
  return {{"id", job_->id},
          {"object", job_->chat ? "chat.completion.chunk" : "text_completion"},
          {"created", job_->created},
          {"model", job_->model},
          {"choices", json::array({std::move(choice)})}};
}

size_t utf8_char_count(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

json ResponseBuilder::completion_logprobs(const std::vector<std::vector<TokenLogprob>>& lps, size_t from,
                                          size_t& text_offset) const {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t t = from; t < lps.size(); ++t) {
    const auto& entry = lps[t];
    if (entry.empty()) continue;
    const std::string tok = logprob_token(entry[0].id);
    tokens.push_back(tok);
    token_lps.push_back(json_logprob(entry[0].logprob));
    json top = json::object();
    for (const auto& e : entry) top[logprob_token(e.id)] = json_logprob(e.logprob);
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += token_chars(entry[0].id);
  }
  return {{"text_offset", offsets}, {"token_logprobs", token_lps}, {"tokens", tokens}, {"top_logprobs", tops}};
}

json ResponseBuilder::chat_logprobs(const std::vector<std::vector<TokenLogprob>>& lps, size_t from) const {
  json content = json::array();
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  for (size_t t = from; t < lps.size(); ++t) {
    const auto& entry = lps[t];
    if (entry.empty()) continue;
    const std::string tok = logprob_token(entry[0].id);
    // entry = [sampled, top-k without the sampled token]: sorted, its first k are the distribution's top-k.
    std::vector<TokenLogprob> ranked(entry.begin(), entry.end());
    std::stable_sort(ranked.begin(), ranked.end(), [](const TokenLogprob& a, const TokenLogprob& b) { return a.logprob > b.logprob; });
    ranked.resize(std::min(ranked.size(), static_cast<size_t>(job_->logprobs.value_or(0))));
    json top = json::array();
    for (const auto& t2 : ranked) {
      const std::string s = logprob_token(t2.id);
      top.push_back({{"token", s}, {"logprob", json_logprob(t2.logprob)}, {"bytes", bytes(s)}});
    }
    content.push_back({{"token", tok}, {"logprob", json_logprob(entry[0].logprob)}, {"bytes", bytes(tok)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

std::vector<json> ResponseBuilder::opening_chunks() {
  std::vector<json> out;
  for (size_t i = 0; i < finished_.size(); ++i) {
    const int idx = static_cast<int>(i);
    const std::vector<int>& prompt_ids = job_->prompts[i / static_cast<size_t>(job_->n)].token_ids;
    if (job_->chat) {
      out.push_back(chunk({{"index", idx}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                           {"finish_reason", nullptr}}));
      if (job_->return_token_ids) {  // vLLM: the prompt's ids on the response of each choice's first chunk
        out.back()["prompt_token_ids"] = prompt_ids;
        sent_prompt_ids_[i] = 1;
      }
      if (!job_->chat_echo.empty())  // vLLM: the echoed content in a chunk of its own after the role
        out.push_back(chunk({{"index", idx}, {"delta", {{"content", job_->chat_echo}}}, {"logprobs", nullptr},
                             {"finish_reason", nullptr}}));
    } else if (job_->echo) {
      const std::string& text = job_->prompts[i / job_->n].text;
      out.push_back(chunk({{"index", idx}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}, {"stop_reason", nullptr}}));
      if (job_->return_token_ids) {
        json& choice = out.back()["choices"][0];
        choice["prompt_token_ids"] = prompt_ids;
        choice["token_ids"] = json::array();
        sent_prompt_ids_[i] = 1;
      }
      next_offset_[i] = utf8_char_count(text);
    }
  }
  return out;
}

std::vector<json> ResponseBuilder::on_output(int index, RequestOutput&& out) {
  std::vector<json> chunks;
  if (index < 0 || static_cast<size_t>(index) >= finished_.size() || out.outputs.empty() || finished_[index]) return chunks;
  if (out.finished) finished_[index] = 1, ++num_finished_;
  num_tokens_[index] += out.outputs[0].token_ids.size();
  num_cached_[index] = std::max(num_cached_[index], out.num_cached_tokens);
  if (!job_->stream) {
    if (!acc_[index]) acc_[index] = std::move(out);
    else append_delta(*acc_[index], std::move(out));
    return chunks;
  }
  const CompletionOutput& c = out.outputs[0];
  json lp = nullptr;
  if (job_->logprobs && !c.logprobs.empty())
    lp = job_->chat ? chat_logprobs(c.logprobs, 0) : completion_logprobs(c.logprobs, 0, next_offset_[index]);
  if (job_->echo && job_->logprobs && !sent_prompt_logprobs_[index] && !out.prompt_logprobs.empty()) {
    // The prompt's logprobs (known once it is prefilled) go first, as in the non-streaming response; the prompt
    // text itself went out in the opening chunk.
    size_t offset = 0;
    json merged = prompt_logprobs_json(job_->prompts[index / job_->n], out, offset);
    if (!lp.is_null())
      for (const char* k : {"text_offset", "token_logprobs", "tokens", "top_logprobs"})
        for (const auto& v : lp[k]) merged[k].push_back(v);
    lp = std::move(merged);
    sent_prompt_logprobs_[index] = 1;
  }
  const bool new_ids = job_->return_token_ids && !c.token_ids.empty();  // a chunk for them, text or not (vLLM)
  if (out.delta_text.empty() && lp.is_null() && !out.finished && !new_ids) return chunks;
  json finish = out.finished ? json(std::string(finish_reason_name(c.finish_reason))) : json(nullptr);
  const json stop = out.finished ? stop_reason_json(c) : json(nullptr);
  if (job_->chat) {
    // 1. Reasoning (--reasoning-parser): the piece's reasoning and content; a possible marker held back. Without
    // include_reasoning the reasoning is dropped, and the logprobs with it (vLLM: they would show the reasoning).
    std::string reasoning;
    ToolParser::Delta d;
    d.content = out.delta_text;
    if (!reasoning_parsers_.empty()) {
      ReasoningDelta rd = reasoning_parsers_[index].feed(out.delta_text, out.finished);
      d.content = std::move(rd.content);
      if (job_->include_reasoning) reasoning = std::move(rd.reasoning);
      else lp = nullptr;
    }
    // 2. Tool calls, in the content only: content streams as it comes (a possible start tag held back). A call
    // begins with a piece that has its id and name; JSON formats send it whole, in one delta once its end tag
    // arrived (vLLM streams the arguments in pieces; the accumulated message is the same); qwen3_coder sends the
    // arguments in later pieces ({"index", "function": {"arguments"}}), as vLLM.
    if (!tool_parsers_.empty()) {
      ToolParser& tp = *tool_parsers_[index];
      d = tp.feed(d.content, out.finished);
      if (out.finished && tp.called() && tp.finish_as_tool_calls(c.finish_reason == FinishReason::Stop)) finish = "tool_calls";
    }
    // The call pieces as delta entries, each with its call's index; parallel_tool_calls false drops every piece of
    // a call after the first (vLLM).
    json calls = json::array();
    for (const auto& call : d.calls) {
      const int call_index = call.id.empty() ? num_tool_calls_[index] - 1 : num_tool_calls_[index]++;
      if (call_index > 0 && !job_->parallel_tool_calls) continue;
      if (!call.id.empty()) calls.push_back(call.to_json(call_index));
      else calls.push_back({{"index", call_index}, {"function", {{"arguments", call.arguments}}}});
    }
    if (reasoning.empty() && d.content.empty() && calls.empty() && lp.is_null() && !out.finished && !new_ids) return chunks;
    // 3. The delta, in vLLM's DeltaMessage order: `content` (also "" in a chunk that carries nothing else but
    // logprobs, as before), `reasoning` (and its old name `reasoning_content`, still read by many clients),
    // `tool_calls`.
    json delta = json::object();
    if (!d.content.empty() || (reasoning.empty() && calls.empty() && !out.finished)) delta["content"] = d.content;
    if (!reasoning.empty()) {
      delta["reasoning"] = reasoning;
      delta["reasoning_content"] = reasoning;
    }
    if (!calls.empty()) delta["tool_calls"] = std::move(calls);
    chunks.push_back(chunk({{"index", index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish}, {"stop_reason", stop}}));
    if (job_->return_token_ids) chunks.back()["choices"][0]["token_ids"] = c.token_ids;
  } else {
    chunks.push_back(chunk({{"index", index}, {"text", out.delta_text}, {"logprobs", lp}, {"finish_reason", finish}, {"stop_reason", stop}}));
    if (job_->return_token_ids) {  // vLLM's stream choice: prompt_token_ids (its first chunk only), then token_ids
      json& choice = chunks.back()["choices"][0];
      if (!sent_prompt_ids_[index]) choice["prompt_token_ids"] = job_->prompts[index / job_->n].token_ids;
      choice["token_ids"] = job_->prompt_only ? std::vector<int>{} : c.token_ids;
      sent_prompt_ids_[index] = 1;
    }
  }
  return chunks;
}

json ResponseBuilder::usage() const {
  long long prompt = 0, completion = 0;
  for (const auto& p : job_->prompts) prompt += static_cast<long long>(p.token_ids.size());
  if (!job_->prompt_only)
    for (size_t n : num_tokens_) completion += static_cast<long long>(n);
  // Prompt tokens served from the prefix cache: each prompt counted once (its first choice), as prompt_tokens.
  long long cached = 0;
  for (size_t i = 0; i < num_cached_.size(); i += static_cast<size_t>(std::max(1, job_->n))) cached += num_cached_[i];
  return {{"prompt_tokens", prompt},  // vLLM's UsageInfo order
          {"total_tokens", prompt + completion},
          {"completion_tokens", completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json ResponseBuilder::choice_usage(int index) const {
  const auto& prompt = job_->prompts.at(static_cast<size_t>(index / std::max(1, job_->n)));
  const long long p = static_cast<long long>(prompt.token_ids.size());
  const long long c = job_->prompt_only ? 0 : static_cast<long long>(num_tokens_.at(static_cast<size_t>(index)));
  return {{"prompt_tokens", p}, {"total_tokens", p + c}, {"completion_tokens", c}};
}

json ResponseBuilder::usage_chunk() const {
  return {{"id", job_->id},
          {"object", job_->chat ? "chat.completion.chunk" : "text_completion"},
          {"created", job_->created},
          {"model", job_->model},
          {"choices", json::array()},
          {"usage", usage()}};
}

json ResponseBuilder::prompt_logprobs_json(const ReadyPrompt& p, const RequestOutput& o, size_t& text_offset) const {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t t = 0; t < p.token_ids.size(); ++t) {  // the first token has no logprob
    const std::string tok = logprob_token(p.token_ids[t]);
    tokens.push_back(tok);
    offsets.push_back(text_offset);
    text_offset += token_chars(p.token_ids[t]);
    const auto& e = t < o.prompt_logprobs.size() ? o.prompt_logprobs[t] : std::nullopt;
    if (!e) {
      token_lps.push_back(nullptr), tops.push_back(nullptr);
      continue;
    }
    token_lps.push_back(json_logprob(e->token_logprob));
    json top = json::object();
    top[tok] = json_logprob(e->token_logprob);
    // The engine's top-k may be prompt_logprobs' larger k: echo lists its own `logprobs` count.
    const size_t k = std::min(e->top.size(), static_cast<size_t>(job_->logprobs.value_or(0)));
    for (size_t j = 0; j < k; ++j) top[logprob_token(e->top[j].id)] = json_logprob(e->top[j].logprob);
    tops.push_back(std::move(top));
  }
  return {{"text_offset", offsets}, {"token_logprobs", token_lps}, {"tokens", tokens}, {"top_logprobs", tops}};
}

json ResponseBuilder::vllm_prompt_logprobs(const RequestOutput& o) const {
  json out = json::array();
  const size_t k_max = static_cast<size_t>(job_->prompt_logprobs.value_or(0));
  for (size_t t = 0; t < o.prompt_token_ids.size(); ++t) {
    const auto& e = t < o.prompt_logprobs.size() ? o.prompt_logprobs[t] : std::nullopt;
    if (!e) {  // position 0: nothing predicts it
      out.push_back(nullptr);
      continue;
    }
    const int id = o.prompt_token_ids[t];
    json entry = json::object();
    entry[std::to_string(id)] = {{"logprob", json_logprob(e->token_logprob)}, {"rank", e->rank}, {"decoded_token", token_text(id)}};
    const size_t k = std::min(e->top.size(), k_max);
    for (size_t j = 0; j < k; ++j) {
      const std::string key = std::to_string(e->top[j].id);
      if (e->top[j].id == id) {
        entry[key]["rank"] = e->rank;  // the prompt token is listed once, with its own rank
        continue;
      }
      entry[key] = {{"logprob", json_logprob(e->top[j].logprob)}, {"rank", static_cast<int>(j) + 1},
                    {"decoded_token", token_text(e->top[j].id)}};
    }
    out.push_back(std::move(entry));
  }
  return out;
}

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// Completions logprobs as four comma-joined element lists (text_offset, token_logprobs, tokens, top_logprobs),
/// so a prompt's part can be serialized once and spliced into each of its choices.
struct LogprobParts {
  std::string lists[4];
  void append(const json& lp) {
    static const char* kKeys[4] = {"text_offset", "token_logprobs", "tokens", "top_logprobs"};
    for (int k = 0; k < 4; ++k)
      for (const auto& v : lp[kKeys[k]]) {
        if (!lists[k].empty()) lists[k] += ',';
        lists[k] += dump(v);
      }
  }
  /// The logprobs object of `a` followed by `b` (keys in the order completion_logprobs writes them).
  static std::string join(const LogprobParts& a, const LogprobParts& b) {
    static const char* kOpen[4] = {"{\"text_offset\":[", "],\"token_logprobs\":[", "],\"tokens\":[", "],\"top_logprobs\":["};
    std::string out;
    size_t n = 16;
    for (int k = 0; k < 4; ++k) n += a.lists[k].size() + b.lists[k].size() + 24;
    out.reserve(n);
    for (int k = 0; k < 4; ++k) {
      out += kOpen[k];
      out += a.lists[k];
      if (!a.lists[k].empty() && !b.lists[k].empty()) out += ',';
      out += b.lists[k];
    }
    out += "]}";
    return out;
  }
};

}  // namespace

json ResponseBuilder::final_response() const { return build_final(nullptr); }

std::string ResponseBuilder::final_body() const {
  // Completions logprobs (echo: the prompt's, repeated in each of its n choices) can be tens of MB: each choice's
  // logprobs object is serialized apart, the prompt's part once per prompt, and spliced in where a placeholder
  // string stands in the response (a per-call random tag, so no text a client controls can match it).
  std::vector<std::string> fragments;
  const json r = build_final(&fragments);
  std::string body = dump(r);
  if (fragments.empty()) return body;
  std::string out;
  size_t total = body.size();
  for (const auto& f : fragments) total += f.size();
  out.reserve(total);
  size_t at = 0;
  for (size_t i = 0; i < fragments.size(); ++i) {
    const std::string needle = "\"logprobs\":\"" + placeholder_ + std::to_string(i) + "\"";
    const size_t pos = body.find(needle, at);
    if (pos == std::string::npos) throw std::runtime_error("response rendering: a logprobs placeholder is missing");
    out.append(body, at, pos - at);
    out += "\"logprobs\":";
    out += fragments[i];
    at = pos + needle.size();
  }
  out.append(body, at, std::string::npos);
  return out;
}

json ResponseBuilder::build_final(std::vector<std::string>* fragments) const {
  json choices = json::array();
  std::vector<std::optional<std::pair<LogprobParts, size_t>>> prompt_parts(job_->prompts.size());  // parts, offset after
  for (size_t i = 0; i < acc_.size(); ++i) {
    if (!acc_[i] || acc_[i]->outputs.empty()) continue;
    const RequestOutput& o = *acc_[i];
    const CompletionOutput& c = o.outputs[0];
    json finish = job_->prompt_only ? "length" : std::string(finish_reason_name(c.finish_reason));
    if (job_->chat) {
      json lp = job_->logprobs ? chat_logprobs(c.logprobs, 0) : json(nullptr);
      json message = {{"role", "assistant"}, {"content", job_->chat_echo + c.text}};
      std::string content = c.text;  // what a tool-call parser reads
      json reasoning;                // set with a reasoning parser: written after tool_calls (vLLM's ChatMessage order)
      if (job_->reasoning) {
        // vLLM: `reasoning` (and the old `reasoning_content`) and `content`, each null when empty; without
        // include_reasoning the reasoning is null and so are the logprobs (they would show it).
        ReasoningSplit split = job_reasoning_parser(*job_).extract(c.text);
        if (!job_->include_reasoning) {
          split.reasoning.reset();
          lp = nullptr;
        }
        content = split.content.value_or("");
        const bool has_content = split.content || !job_->chat_echo.empty();
        message["content"] = has_content ? json(job_->chat_echo + content) : json(nullptr);
        reasoning = split.reasoning ? json(*split.reasoning) : json(nullptr);
      }
      if (job_->has_tool_parser()) {  // vLLM: tool_calls (a list) and content before them, or null
        const std::unique_ptr<ToolParser> tp = job_tool_parser(*job_);
        const ExtractedToolCalls tc = tp->extract(content);
        json calls = json::array();
        for (const auto& call : tc.calls) {
          if (!calls.empty() && !job_->parallel_tool_calls) break;  // vLLM: tool_calls[:1]
          calls.push_back(call.to_json());
        }
        // A forced tool choice's output is the calls' JSON, never content: also when max_tokens cut it before a call.
        if (tc.tools_called || job_->forced_tool) {
          message["content"] = tc.has_content ? json(job_->chat_echo + tc.content) : json(nullptr);
          if (tp->finish_as_tool_calls(c.finish_reason == FinishReason::Stop)) finish = "tool_calls";
        }
        message["tool_calls"] = std::move(calls);
      }
      if (job_->reasoning) {
        message["reasoning"] = reasoning;
        message["reasoning_content"] = std::move(reasoning);
      }
      choices.push_back({{"index", i}, {"message", message}, {"logprobs", lp},
                         {"finish_reason", finish}, {"stop_reason", stop_reason_json(c)}});
      if (job_->return_token_ids) choices.back()["token_ids"] = c.token_ids;
      continue;
    }
    const size_t prompt = i / static_cast<size_t>(job_->n);
    const ReadyPrompt& p = job_->prompts[prompt];
    // The prompt's logprobs come with the prompt's first choice (the others share them; see generate()).
    const size_t first = prompt * static_cast<size_t>(job_->n);
    const RequestOutput& po = acc_[first] ? *acc_[first] : o;
    std::string text = job_->prompt_only ? p.text : job_->echo ? p.text + c.text : c.text;
    json lp = nullptr;
    if (job_->logprobs) {
      // text_offset: character offsets into the returned text, cumulative over the listed tokens (vLLM), so
      // monotonic even where a token holds part of a UTF-8 character.
      auto& pp = prompt_parts[prompt];
      if (!pp) {
        pp.emplace();
        size_t offset = job_->echo && po.prompt_logprobs.empty() ? utf8_char_count(p.text) : 0;
        if (job_->echo && !po.prompt_logprobs.empty()) pp->first.append(prompt_logprobs_json(p, po, offset));
        pp->second = offset;
      }
      size_t offset = pp->second;
      LogprobParts gen;
      gen.append(completion_logprobs(c.logprobs, job_->prompt_only ? c.logprobs.size() : 0, offset));
      std::string whole = LogprobParts::join(pp->first, gen);
      if (fragments) {
        lp = placeholder_ + std::to_string(fragments->size());
        fragments->push_back(std::move(whole));
      } else {
        lp = json::parse(whole);
      }
    }
    choices.push_back({{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish},
                       {"stop_reason", job_->prompt_only ? json(nullptr) : stop_reason_json(c)}});
    // vLLM's CompletionResponseChoice order: ..., token_ids, prompt_logprobs, prompt_token_ids.
    if (job_->return_token_ids) choices.back()["token_ids"] = job_->prompt_only ? std::vector<int>{} : c.token_ids;
    if (job_->prompt_logprobs) choices.back()["prompt_logprobs"] = vllm_prompt_logprobs(po);
    if (job_->return_token_ids) choices.back()["prompt_token_ids"] = p.token_ids;
  }
  json out = {{"id", job_->id},
              {"object", job_->chat ? "chat.completion" : "text_completion"},
              {"created", job_->created},
              {"model", job_->model},
              {"choices", choices},
              {"usage", usage()}};
  // vLLM's chat response carries the (one) prompt's logprobs at the top level; its first choice scored them.
  if (job_->chat && job_->prompt_logprobs && !acc_.empty() && acc_[0]) out["prompt_logprobs"] = vllm_prompt_logprobs(*acc_[0]);
  if (job_->chat && job_->return_token_ids && !job_->prompts.empty()) out["prompt_token_ids"] = job_->prompts[0].token_ids;
  return out;
}

}  // namespace ssmserve::server
