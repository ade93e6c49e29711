// Owns the OpenAI Responses API's translation over the chat completions path (see responses_api.h).
#include "server/responses_api.h"

#include <fmt/format.h>

#include <utility>

#include "server/http_responses.h"
#include "server/json_fields.h"

namespace ssmserve::server {

using json = nlohmann::ordered_json;

namespace {

/// A message's content: a string, or its text parts as chat text parts (input_text / output_text / text, refusal).
json message_content(const json& c, const std::string& where) {
  if (c.is_string()) return c;
  if (!c.is_array()) bad_request(where, where + " must be a string or a list of content parts");
  json parts = json::array();
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string at = fmt::format("{}[{}]", where, j);
    if (!c[j].is_object()) bad_request(at, at + " must be an object");
    const std::string& type = string_field(c[j], "type", at);
    if (type == "input_text" || type == "output_text" || type == "text")
      parts.push_back({{"type", "text"}, {"text", string_field(c[j], "text", at)}});
    else if (type == "refusal")
      parts.push_back({{"type", "text"}, {"text", string_field(c[j], "refusal", at)}});
    else
      bad_request(at + ".type", fmt::format("{}.type \"{}\" is not supported: the models served here read text "
                                            "(input_text)", at, type));
  }
  return parts;
}

/// Text of a function_call_output's output (a string or text parts).
std::string output_text(const json& o, const std::string& where) {
  if (o.is_string()) return o.get<std::string>();
  const json parts = message_content(o, where);
  std::string s;
  for (const auto& p : parts) s += p["text"].get<std::string>();
  return s;
}

/// The chat messages of the Responses input (after `instructions`' system message).
void input_messages(const json& input, json& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) bad_request("input", "input must be a string or a list of input items");
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string at = fmt::format("input[{}]", i);
    const json& it = input[i];
    if (!it.is_object()) bad_request(at, at + " must be an object");
    const std::string type = it.contains("type") ? string_field(it, "type", at) : "message";
    if (type == "message") {
      const std::string& role = string_field(it, "role", at);
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        bad_request(at + ".role", fmt::format("{}.role must be user, system, developer or assistant (got \"{}\")", at, role));
      if (!it.contains("content")) bad_request(at + ".content", at + ".content is required");
      messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", message_content(it["content"], at + ".content")}});
    } else if (type == "function_call") {
      const json call = {{"id", string_field(it, "call_id", at)},
                         {"type", "function"},
                         {"function", {{"name", string_field(it, "name", at)}, {"arguments", string_field(it, "arguments", at)}}}};
      // Consecutive calls are one assistant turn (after its text, when the turn had some).
      if (!messages.empty() && messages.back()["role"] == "assistant") {
        json& last = messages.back();
        if (!last.contains("tool_calls")) last["tool_calls"] = json::array();
        last["tool_calls"].push_back(call);
      } else {
        messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
      }
    } else if (type == "function_call_output") {
      if (!it.contains("output")) bad_request(at + ".output", at + ".output is required");
      messages.push_back({{"role", "tool"}, {"tool_call_id", string_field(it, "call_id", at)},
                          {"content", output_text(it["output"], at + ".output")}});
    } else if (type == "reasoning") {
      // An earlier turn's reasoning: not fed back (chat templates drop past reasoning).
    } else {
      bad_request(at + ".type", fmt::format("{}.type \"{}\" is not supported (message, function_call, "
                                            "function_call_output, reasoning)", at, type));
    }
  }
}

}  // namespace

ResponsesRequest responses_to_chat_request(const json& b) {
  if (!b.is_object()) bad_request("", "the request body must be a JSON object");
  for (const char* k : {"previous_response_id", "prompt", "conversation"})
    if (given(b, k))
      bad_request(k, fmt::format("{} is not supported: ssmserve does not store responses or prompts; send the whole "
                                 "conversation in input", k));
  if (given(b, "background") && b["background"] != false) bad_request("background", "background responses are not supported");
  if (given(b, "top_logprobs") && b["top_logprobs"] != 0)
    bad_request("top_logprobs", "logprobs are not supported on /v1/responses (use /v1/chat/completions)");
  if (given(b, "include")) {
    if (!b["include"].is_array()) bad_request("include", "include must be a list of strings");
    for (const auto& v : b["include"]) {
      if (!v.is_string()) bad_request("include", "include must be a list of strings");
      if (v == "message.output_text.logprobs")
        bad_request("include", "message.output_text.logprobs is not supported on /v1/responses (use /v1/chat/completions)");
    }
  }
  if (given(b, "truncation") && b["truncation"] != "disabled") bad_request("truncation", "truncation must be \"disabled\"");
  ResponsesRequest r;
  json messages = json::array();
  if (given(b, "instructions")) {
    if (!b["instructions"].is_string()) bad_request("instructions", "instructions must be a string");
    messages.push_back({{"role", "system"}, {"content", b["instructions"]}});
  }
  if (!given(b, "input")) bad_request("input", "input is required");
  input_messages(b["input"], messages);
  json& c = r.chat;
  c["messages"] = std::move(messages);
  // The sampling fields both APIs share, and vLLM's extra ones.
  for (const char* k : {"model", "stream", "temperature", "top_p", "user", "parallel_tool_calls", "top_k", "min_p",
                        "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop", "min_tokens",
                        "cache_salt", "request_id", "logit_bias", "bad_words", "chat_template_kwargs", "structured_outputs",
                        "include_reasoning", "skip_special_tokens"})
    if (b.contains(k)) c[k] = b[k];
  if (given(b, "max_output_tokens")) c["max_tokens"] = b["max_output_tokens"];
  json format = {{"type", "text"}};
  if (given(b, "text")) {
    if (!b["text"].is_object()) bad_request("text", "text must be an object");
    if (given(b["text"], "format")) {
      format = b["text"]["format"];
      if (!format.is_object()) bad_request("text.format", "text.format must be an object");
      const std::string& type = string_field(format, "type", "text.format");
      if (type == "json_schema") {
        if (!given(format, "name")) format["name"] = "response";  // reported as used (the SDK's type requires one)
        json js = {{"name", string_field(format, "name", "text.format")}};
        if (!format.contains("schema")) bad_request("text.format.schema", "text.format.schema is required");
        js["schema"] = format["schema"];
        if (format.contains("strict")) js["strict"] = format["strict"];
        if (format.contains("description")) js["description"] = format["description"];
        c["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
      } else if (type == "json_object") {
        c["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        bad_request("text.format.type", fmt::format("text.format.type must be text, json_schema or json_object (got \"{}\")", type));
      }
    }
  }
  json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (given(b, "reasoning")) {
    if (!b["reasoning"].is_object()) bad_request("reasoning", "reasoning must be an object");
    if (given(b["reasoning"], "effort")) {
      reasoning["effort"] = b["reasoning"]["effort"];
      c["reasoning_effort"] = b["reasoning"]["effort"];
    }
  }
  json tools = json::array();
  if (given(b, "tools")) {
    if (!b["tools"].is_array()) bad_request("tools", "tools must be a list");
    json chat_tools = json::array();
    for (size_t i = 0; i < b["tools"].size(); ++i) {
      const std::string at = fmt::format("tools[{}]", i);
      const json& t = b["tools"][i];
      if (!t.is_object()) bad_request(at, at + " must be an object");
      const std::string& type = string_field(t, "type", at);
      if (type != "function")
        bad_request(at + ".type", fmt::format("{}.type \"{}\" is not supported: only function tools run here", at, type));
      json fn = {{"name", string_field(t, "name", at)}};
      if (fn["name"].get_ref<const std::string&>().empty()) bad_request(at + ".name", at + ".name must not be empty");
      for (const char* k : {"description", "parameters", "strict"})
        if (given(t, k)) fn[k] = t[k];
      chat_tools.push_back({{"type", "function"}, {"function", fn}});
    }
    tools = b["tools"];
    if (!chat_tools.empty()) c["tools"] = std::move(chat_tools);
  }
  json tool_choice = "auto";
  if (given(b, "tool_choice")) {
    tool_choice = b["tool_choice"];
    if (tool_choice.is_string()) {
      c["tool_choice"] = tool_choice;
    } else if (tool_choice.is_object() && string_field(tool_choice, "type", "tool_choice") == "function") {
      c["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_field(tool_choice, "name", "tool_choice")}}}};
    } else {
      bad_request("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
    }
  }
  if (given(b, "metadata") && !b["metadata"].is_object()) bad_request("metadata", "metadata must be an object");
  auto or_null = [&](const char* k) { return given(b, k) ? b[k] : json(nullptr); };
  r.reflect = {{"instructions", or_null("instructions")},
               {"max_output_tokens", or_null("max_output_tokens")},
               {"parallel_tool_calls", given(b, "parallel_tool_calls") ? b["parallel_tool_calls"] : json(true)},
               {"reasoning", reasoning},
               {"temperature", or_null("temperature")},
               {"text", {{"format", format}}},
               {"tool_choice", tool_choice},
               {"tools", tools},
               {"top_p", or_null("top_p")},
               {"user", or_null("user")},
               {"metadata", given(b, "metadata") ? b["metadata"] : json::object()}};
  return r;
}

std::string responses_field(const std::string& f) {
  if (f == "messages" || f.rfind("messages[", 0) == 0) return "input";
  if (f == "max_tokens" || f == "max_completion_tokens") return "max_output_tokens";
  if (f == "response_format" || f.rfind("response_format.", 0) == 0) return "text.format";
  if (f == "reasoning_effort") return "reasoning.effort";
  return f;
}

ResponsesStream::ResponsesStream(std::string id, long long created_at, json reflect)
    : id_(std::move(id)), created_at_(created_at), reflect_(std::move(reflect)) {}

void ResponsesStream::set_sampling(double temperature, double top_p, int max_tokens) {
  // vLLM's ResponsesResponse.from_request: the values used, where the request gave none.
  if (reflect_["temperature"].is_null()) reflect_["temperature"] = temperature;
  if (reflect_["top_p"].is_null()) reflect_["top_p"] = top_p;
  if (reflect_["max_output_tokens"].is_null()) reflect_["max_output_tokens"] = max_tokens;
}

json ResponsesStream::base(const char* status) const {
  const json& r = reflect_;
  return {{"id", id_},
          {"object", "response"},
          {"created_at", created_at_},
          {"status", status},
          {"background", false},
          {"error", nullptr},
          {"incomplete_details", nullptr},
          {"instructions", r["instructions"]},
          {"max_output_tokens", r["max_output_tokens"]},
          {"max_tool_calls", nullptr},
          {"model", model_},
          {"output", json::array()},
          {"parallel_tool_calls", r["parallel_tool_calls"]},
          {"previous_response_id", nullptr},
          {"reasoning", r["reasoning"]},
          {"service_tier", "auto"},
          {"store", false},
          {"temperature", r["temperature"]},
          {"text", r["text"]},
          {"tool_choice", r["tool_choice"]},
          {"tools", r["tools"]},
          {"top_logprobs", 0},
          {"top_p", r["top_p"]},
          {"truncation", "disabled"},
          {"usage", nullptr},
          {"user", r["user"]},
          {"metadata", r["metadata"]}};
}

json ResponsesStream::responses_usage(const json& u) {
  if (!u.is_object()) return nullptr;
  const long long cached = cached_prompt_tokens(u);
  return {{"input_tokens", u.value("prompt_tokens", 0LL)},
          {"input_tokens_details", {{"cached_tokens", cached}, {"cache_write_tokens", 0}}},
          {"output_tokens", u.value("completion_tokens", 0LL)},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", u.value("total_tokens", 0LL)}};
}

json ResponsesStream::whole(const json& chat) const {
  json out = json::array();
  const json& choice = chat.at("choices").at(0);
  const json& msg = choice.at("message");
  const std::string base_id = id_.substr(id_.find('_') + 1);
  if (msg.contains("reasoning") && msg["reasoning"].is_string() && !msg["reasoning"].get_ref<const std::string&>().empty())
    out.push_back({{"id", "rs_" + base_id},
                   {"type", "reasoning"},
                   {"summary", json::array()},
                   {"content", json::array({{{"type", "reasoning_text"}, {"text", msg["reasoning"]}}})},
                   {"encrypted_content", nullptr},
                   {"status", "completed"}});
  const bool calls = msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
  // Beside tool calls, blank text (the separators between calls) is no message, as the stream sends none.
  if (msg.contains("content") && msg["content"].is_string() && (!calls || !blank(msg["content"].get<std::string>())))
    out.push_back({{"id", "msg_" + base_id},
                   {"type", "message"},
                   {"status", "completed"},
                   {"role", "assistant"},
                   {"content", json::array({{{"type", "output_text"}, {"text", msg["content"]}, {"annotations", json::array()},
                                             {"logprobs", json::array()}}})}});
  if (calls)
    for (size_t i = 0; i < msg["tool_calls"].size(); ++i) {
      const json& tc = msg["tool_calls"][i];
      out.push_back({{"id", fmt::format("fc_{}_{}", base_id, i)},
                     {"type", "function_call"},
                     {"status", "completed"},
                     {"call_id", tc.value("id", "")},
                     {"name", tc.at("function").value("name", "")},
                     {"arguments", tc.at("function").value("arguments", "")}});
    }
  const bool incomplete = choice.value("finish_reason", json(nullptr)) == "length";
  // The text cut at max_output_tokens is incomplete (OpenAI); a parsed function call is whole.
  if (incomplete && !out.empty() && out.back()["type"] != "function_call") out.back()["status"] = "incomplete";
  json r = base(incomplete ? "incomplete" : "completed");
  if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["output"] = std::move(out);
  r["usage"] = responses_usage(chat.value("usage", json(nullptr)));
  return r;
}

std::string ResponsesStream::event(json e) {
  e["sequence_number"] = seq_++;
  return "event: " + e["type"].get<std::string>() + "\ndata: " + dump(e) + "\n\n";
}

std::string ResponsesStream::open(const json& /*usage: a Response reports it when completed*/) {
  json r = base("in_progress");
  std::string s = event({{"type", "response.created"}, {"response", r}});
  return s + event({{"type", "response.in_progress"}, {"response", r}});
}

std::string ResponsesStream::open_item(Item kind, const json& call) {
  std::string s = close_item();
  const std::string base_id = id_.substr(id_.find('_') + 1);
  const int index = items_;
  open_ = kind;
  text_.clear();
  json item;
  // The ids of the whole Response (ResponsesStream::whole): rs_ / msg_ + the base id (a second such item: + its
  // output index), fc_ + the base id + the call's index.
  const auto numbered = [&](const char* prefix, int& count) {
    return count++ == 0 ? fmt::format("{}_{}", prefix, base_id) : fmt::format("{}_{}_{}", prefix, base_id, index);
  };
  if (kind == Item::Reasoning) {
    item_id_ = numbered("rs", reasoning_items_);
    item = {{"id", item_id_}, {"type", "reasoning"}, {"summary", json::array()}, {"content", json::array()},
            {"encrypted_content", nullptr}, {"status", "in_progress"}};
  } else if (kind == Item::Message) {
    item_id_ = numbered("msg", message_items_);
    item = {{"id", item_id_}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"}, {"content", json::array()}};
  } else {
    call_index_ = call.value("index", 0);
    item_id_ = fmt::format("fc_{}_{}", base_id, call_index_);
    call_id_ = call.value("id", "");
    call_name_ = call.contains("function") ? call["function"].value("name", "") : "";
    item = {{"id", item_id_}, {"type", "function_call"}, {"status", "in_progress"}, {"call_id", call_id_},
            {"name", call_name_}, {"arguments", ""}};
  }
  s += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  if (kind == Item::Reasoning)
    s += event({{"type", "response.content_part.added"}, {"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  else if (kind == Item::Message)
    s += event({{"type", "response.content_part.added"}, {"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}}}});
  return s;
}

std::string ResponsesStream::close_item(const char* status) {
  if (open_ == Item::None) return "";
  const int index = items_++;
  std::string s;
  json item;
  if (open_ == Item::Reasoning) {
    const json part = {{"type", "reasoning_text"}, {"text", text_}};
    s += event({{"type", "response.reasoning_text.done"}, {"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                {"text", text_}});
    s += event({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                {"part", part}});
    item = {{"id", item_id_}, {"type", "reasoning"}, {"summary", json::array()}, {"content", json::array({part})},
            {"encrypted_content", nullptr}, {"status", status}};
  } else if (open_ == Item::Message) {
    const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}, {"logprobs", json::array()}};
    s += event({{"type", "response.output_text.done"}, {"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                {"text", text_}, {"logprobs", json::array()}});
    s += event({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", index}, {"content_index", 0},
                {"part", part}});
    item = {{"id", item_id_}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", json::array({part})}};
  } else {
    s += event({{"type", "response.function_call_arguments.done"}, {"item_id", item_id_}, {"output_index", index},
                {"name", call_name_}, {"arguments", text_}});
    item = {{"id", item_id_}, {"type", "function_call"}, {"status", "completed"}, {"call_id", call_id_},
            {"name", call_name_}, {"arguments", text_}};
  }
  s += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  open_ = Item::None;
  return s;
}

std::string ResponsesStream::on_chunk(const json& chunk) {
  const auto ch = chunk.find("choices");
  if (ch == chunk.end() || !ch->is_array() || ch->empty()) return "";
  const json& choice = (*ch)[0];
  std::string s;
  if (const auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) finish_reason_ = f->get<std::string>();
  const auto d = choice.find("delta");
  if (d == choice.end() || !d->is_object()) return s;
  if (const auto r = d->find("reasoning"); r != d->end() && r->is_string() && !r->get_ref<const std::string&>().empty()) {
    if (open_ != Item::Reasoning) s += open_item(Item::Reasoning);
    text_ += r->get<std::string>();
    s += event({{"type", "response.reasoning_text.delta"}, {"item_id", item_id_}, {"output_index", items_},
                {"content_index", 0}, {"delta", *r}});
  }
  if (const auto c = d->find("content"); c != d->end() && c->is_string() && !c->get_ref<const std::string&>().empty()) {
    std::string text = c->get<std::string>();
    if (open_ != Item::Message && seen_call_ && blank(held_ + text)) {
      held_ += text;  // blank text after a tool call (the separator before the next one): no message unless more follows
    } else {
      text = std::exchange(held_, "") + text;
      if (open_ != Item::Message) s += open_item(Item::Message);
      text_ += text;
      s += event({{"type", "response.output_text.delta"}, {"item_id", item_id_}, {"output_index", items_}, {"content_index", 0},
                  {"delta", text}, {"logprobs", json::array()}});
    }
  }
  if (const auto t = d->find("tool_calls"); t != d->end() && t->is_array())
    for (const json& tc : *t) {
      if (!tc.is_object()) continue;
      if (open_ != Item::FunctionCall || tc.value("index", 0) != call_index_) s += open_item(Item::FunctionCall, tc);
      seen_call_ = true;
      held_.clear();
      const auto fn = tc.find("function");
      if (fn == tc.end() || !fn->is_object()) continue;
      if (const auto a = fn->find("arguments"); a != fn->end() && a->is_string() && !a->get_ref<const std::string&>().empty()) {
        text_ += a->get<std::string>();
        s += event({{"type", "response.function_call_arguments.delta"}, {"item_id", item_id_}, {"output_index", items_},
                    {"delta", *a}});
      }
    }
  return s;
}

std::string ResponsesStream::finish(const json& usage) {
  std::string s = items_ == 0 && open_ == Item::None ? open_item(Item::Message) : "";  // an empty reply: an empty message
  const bool incomplete = finish_reason_ == "length";
  s += close_item(incomplete ? "incomplete" : "completed");  // text cut at max_output_tokens is incomplete (OpenAI)
  json r = base(incomplete ? "incomplete" : "completed");
  if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["output"] = output_;
  r["usage"] = responses_usage(usage);
  // response.completed whatever the status (as vLLM sends it; the OpenAI SDK's stream helper waits for it).
  return s + event({{"type", "response.completed"}, {"response", r}});
}

std::string ResponsesStream::error(const ApiError& e) {
  return event({{"type", "error"}, {"code", std::to_string(e.status)}, {"message", e.what()},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
}

}  // namespace ssmserve::server
