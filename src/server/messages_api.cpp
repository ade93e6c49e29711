// Owns Anthropic's Messages API's translation over the chat completions path (see messages_api.h).
#include "server/messages_api.h"

#include <fmt/format.h>

#include <utility>

#include "server/http_responses.h"
#include "server/json_fields.h"

namespace ssmserve::server {

using json = nlohmann::ordered_json;

namespace {

/// The text of a string or a list of text blocks (system, tool_result content).
std::string block_text(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad_request(where, where + " must be a string or a list of content blocks");
  std::string s;
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string at = fmt::format("{}[{}]", where, j);
    if (!c[j].is_object()) bad_request(at, at + " must be an object");
    const std::string& type = string_field(c[j], "type", at);
    if (type != "text")
      bad_request(at + ".type", fmt::format("{}.type \"{}\" is not supported here (text blocks)", at, type));
    if (!s.empty()) s += "\n";
    s += string_field(c[j], "text", at);
  }
  return s;
}

/// One Messages message as chat messages: a user turn's tool_result blocks become tool messages (first, in order),
/// its text the user message; an assistant turn's tool_use blocks its tool calls.
void add_message(const json& m, const std::string& at, json& out) {
  if (!m.is_object()) bad_request(at, at + " must be an object");
  const std::string& role = string_field(m, "role", at);
  if (role != "user" && role != "assistant")
    bad_request(at + ".role", fmt::format("{}.role must be user or assistant (got \"{}\")", at, role));
  if (!m.contains("content")) bad_request(at + ".content", at + ".content is required");
  const json& c = m["content"];
  if (c.is_string()) {
    out.push_back({{"role", role}, {"content", c}});
    return;
  }
  if (!c.is_array()) bad_request(at + ".content", at + ".content must be a string or a list of content blocks");
  if (c.empty()) bad_request(at + ".content", at + ".content must hold at least one content block");  // Anthropic's
  json parts = json::array(), calls = json::array();
  for (size_t j = 0; j < c.size(); ++j) {
    const std::string bt = fmt::format("{}.content[{}]", at, j);
    const json& b = c[j];
    if (!b.is_object()) bad_request(bt, bt + " must be an object");
    const std::string& type = string_field(b, "type", bt);
    if (type == "text") {
      parts.push_back({{"type", "text"}, {"text", string_field(b, "text", bt)}});
    } else if (type == "tool_use" && role == "assistant") {
      const json input = b.contains("input") ? b["input"] : json::object();
      if (!input.is_object()) bad_request(bt + ".input", bt + ".input must be an object");
      calls.push_back({{"id", string_field(b, "id", bt)},
                       {"type", "function"},
                       {"function", {{"name", string_field(b, "name", bt)}, {"arguments", dump(input)}}}});
    } else if (type == "tool_result" && role == "user") {
      std::string text = b.contains("content") && !b["content"].is_null() ? block_text(b["content"], bt + ".content") : "";
      out.push_back({{"role", "tool"}, {"tool_call_id", string_field(b, "tool_use_id", bt)}, {"content", std::move(text)}});
    } else if (type == "thinking" || type == "redacted_thinking") {
      // An earlier turn's thinking: not fed back (chat templates drop past reasoning).
    } else {
      bad_request(bt + ".type", fmt::format("{}.type \"{}\" is not supported in {} message (text{})", bt, type,
                                            role == "user" ? "a user" : "an assistant",
                                            role == "user" ? ", tool_result" : ", tool_use, thinking"));
    }
  }
  if (!parts.empty() || !calls.empty()) {
    json msg = {{"role", role}, {"content", parts.empty() ? json("") : parts}};
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
  }
}

/// Anthropic's stop_reason for a chat choice's finish_reason (and its stop_reason: a matched stop string).
/// `tool_use`: the reply holds tool_use blocks, so a plain stop is "tool_use" (Anthropic's: the model invoked tools;
/// a forced or named tool call finishes as "stop" on the chat path).
std::pair<std::string, json> stop_of(const std::string& finish, const json& stop_reason, bool tool_use) {
  if (finish == "length") return {"max_tokens", nullptr};
  if (finish == "tool_calls") return {"tool_use", nullptr};
  if (stop_reason.is_string()) return {"stop_sequence", stop_reason};
  return {tool_use ? "tool_use" : "end_turn", nullptr};
}

/// Anthropic's usage: input_tokens is the prompt's part not read from the cache (the total input is input_tokens +
/// cache_creation_input_tokens + cache_read_input_tokens).
json usage_of(const json& u) {
  if (!u.is_object()) return {{"input_tokens", 0}, {"output_tokens", 0}};
  const long long cached = cached_prompt_tokens(u);
  return {{"input_tokens", u.value("prompt_tokens", 0LL) - cached}, {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", cached}, {"output_tokens", u.value("completion_tokens", 0LL)}};
}

/// A tool call's arguments as the tool_use block's input object ({} for arguments that are not a JSON object).
json tool_input(const std::string& arguments) {
  const json j = json::parse(arguments, nullptr, false);
  return j.is_object() ? j : json::object();
}

}  // namespace

json messages_to_chat_request(const json& b, bool require_max_tokens) {
  if (!b.is_object()) bad_request("", "the request body must be a JSON object");
  if (require_max_tokens && !given(b, "max_tokens")) bad_request("max_tokens", "max_tokens is required");
  if (!given(b, "messages") || !b["messages"].is_array()) bad_request("messages", "messages must be a list of messages");
  json messages = json::array();
  if (given(b, "system"))  // an empty system prompt adds no system turn (vLLM skips it too)
    if (std::string system = block_text(b["system"], "system"); !system.empty())
      messages.push_back({{"role", "system"}, {"content", std::move(system)}});
  for (size_t i = 0; i < b["messages"].size(); ++i) add_message(b["messages"][i], fmt::format("messages[{}]", i), messages);
  // Prefill (Anthropic's): a final assistant message is the start of the reply, continued (vLLM's
  // continue_final_message); an empty one is no prefill.
  bool prefill = false;
  if (!messages.empty() && messages.back()["role"] == "assistant" && !messages.back().contains("tool_calls")) {
    const json& content = messages.back()["content"];
    if ((content.is_string() && content.get_ref<const std::string&>().empty()) || (content.is_array() && content.empty()))
      messages.erase(messages.size() - 1);
    else
      prefill = true;
  }
  json c = {{"messages", std::move(messages)}};
  if (prefill) c["continue_final_message"] = true, c["add_generation_prompt"] = false;
  if (b.contains("max_tokens")) c["max_tokens"] = b["max_tokens"];
  // The sampling fields both APIs share, and vLLM's extra ones (a client's extra_body).
  for (const char* k : {"model", "stream", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                        "presence_penalty", "frequency_penalty", "seed", "min_tokens", "cache_salt", "request_id",
                        "logit_bias", "bad_words", "chat_template_kwargs", "structured_outputs", "response_format",
                        "include_reasoning", "skip_special_tokens"})
    if (b.contains(k)) c[k] = b[k];
  if (given(b, "stop_sequences")) c["stop"] = b["stop_sequences"];
  if (given(b, "tools")) {
    if (!b["tools"].is_array()) bad_request("tools", "tools must be a list");
    json tools = json::array();
    for (size_t i = 0; i < b["tools"].size(); ++i) {
      const std::string at = fmt::format("tools[{}]", i);
      const json& t = b["tools"][i];
      if (!t.is_object()) bad_request(at, at + " must be an object");
      if (given(t, "type") && t["type"] != "custom")
        bad_request(at + ".type", fmt::format("{}.type {} is not supported: only client tools (name, input_schema) run here",
                                              at, dump(t["type"])));
      json fn = {{"name", string_field(t, "name", at)}};
      if (fn["name"].get_ref<const std::string&>().empty()) bad_request(at + ".name", at + ".name must not be empty");
      if (given(t, "description")) fn["description"] = t["description"];
      fn["parameters"] = given(t, "input_schema") ? t["input_schema"] : json{{"type", "object"}};
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) c["tools"] = std::move(tools);
  }
  if (given(b, "tool_choice")) {
    const json& tc = b["tool_choice"];
    if (!tc.is_object()) bad_request("tool_choice", "tool_choice must be an object");
    const std::string& type = string_field(tc, "type", "tool_choice");
    if (type == "auto") c["tool_choice"] = "auto";
    else if (type == "any") c["tool_choice"] = "required";
    else if (type == "none") c["tool_choice"] = "none";
    else if (type == "tool") c["tool_choice"] = {{"type", "function"}, {"function", {{"name", string_field(tc, "name", "tool_choice")}}}};
    else bad_request("tool_choice.type", "tool_choice.type must be auto, any, tool or none");
    if (tc.contains("disable_parallel_tool_use") && tc["disable_parallel_tool_use"] == true) c["parallel_tool_calls"] = false;
  }
  if (given(b, "output_config")) {  // structured outputs and effort (vLLM's mapping)
    const json& oc = b["output_config"];
    if (!oc.is_object()) bad_request("output_config", "output_config must be an object");
    if (given(oc, "format")) {
      const json& f = oc["format"];
      if (!f.is_object()) bad_request("output_config.format", "output_config.format must be an object");
      const std::string& type = string_field(f, "type", "output_config.format");
      if (type != "json_schema")
        bad_request("output_config.format.type", fmt::format("output_config.format.type must be json_schema (got \"{}\")", type));
      if (!given(f, "schema")) bad_request("output_config.format.schema", "output_config.format.schema is required");
      c["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", f["schema"]}}}};
    }
    if (given(oc, "effort")) c["reasoning_effort"] = oc["effort"];
  }
  if (given(b, "thinking")) {
    const json& th = b["thinking"];
    if (!th.is_object()) bad_request("thinking", "thinking must be an object");
    const std::string& type = string_field(th, "type", "thinking");
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      bad_request("thinking.type", "thinking.type must be enabled, disabled or adaptive");
    if (!c.contains("chat_template_kwargs") || !c["chat_template_kwargs"].is_object()) c["chat_template_kwargs"] = json::object();
    if (!c["chat_template_kwargs"].contains("enable_thinking")) c["chat_template_kwargs"]["enable_thinking"] = type != "disabled";
  }
  return c;
}

std::string messages_field(const std::string& f) {
  if (f == "stop") return "stop_sequences";
  if (f == "max_completion_tokens") return "max_tokens";
  if (f == "response_format" || f.rfind("response_format.", 0) == 0) return "output_config.format";
  if (f == "reasoning_effort") return "output_config.effort";
  if (const auto p = f.find(".function.parameters"); f.rfind("tools[", 0) == 0 && p != std::string::npos)
    return f.substr(0, p) + ".input_schema" + f.substr(p + 20);
  return f;
}

json anthropic_error_body(const ApiError& e) {
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

json MessagesStream::whole(const json& chat) const {
  const json& choice = chat.at("choices").at(0);
  const json& msg = choice.at("message");
  json content = json::array();
  if (msg.contains("reasoning") && msg["reasoning"].is_string() && !msg["reasoning"].get_ref<const std::string&>().empty())
    content.push_back({{"type", "thinking"}, {"thinking", msg["reasoning"]}, {"signature", ""}});
  const bool calls = msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
  // Beside tool calls, blank text (the separators between calls) is no block, as the stream sends none.
  if (msg.contains("content") && msg["content"].is_string() &&
      (calls ? !blank(msg["content"].get<std::string>()) : (!msg["content"].get_ref<const std::string&>().empty() || content.empty())))
    content.push_back({{"type", "text"}, {"text", msg["content"]}});
  if (calls)
    for (const json& tc : msg["tool_calls"])
      content.push_back({{"type", "tool_use"},
                         {"id", tc.value("id", "")},
                         {"name", tc.at("function").value("name", "")},
                         {"input", tool_input(tc.at("function").value("arguments", ""))}});
  if (content.empty()) content.push_back({{"type", "text"}, {"text", ""}});
  const json& finish = choice.contains("finish_reason") ? choice["finish_reason"] : json(nullptr);
  const auto [stop, seq] = stop_of(finish.is_string() ? finish.get<std::string>() : "stop", choice.value("stop_reason", json(nullptr)), calls);
  return {{"id", id_},        {"type", "message"},     {"role", "assistant"}, {"model", model_}, {"content", std::move(content)},
          {"stop_reason", stop}, {"stop_sequence", seq}, {"usage", usage_of(chat.value("usage", json(nullptr)))}};
}

std::string MessagesStream::event(const json& e) {
  return "event: " + e["type"].get<std::string>() + "\ndata: " + dump(e) + "\n\n";
}

std::string MessagesStream::open(const json& usage) {
  json u = usage_of(usage);  // the prompt's tokens, known when the stream opens (as Anthropic's message_start has them)
  u["output_tokens"] = 0;
  const json message = {{"id", id_},           {"type", "message"},      {"role", "assistant"},
                        {"model", model_},     {"content", json::array()}, {"stop_reason", nullptr},
                        {"stop_sequence", nullptr}, {"usage", std::move(u)}};
  return event({{"type", "message_start"}, {"message", message}}) + event({{"type", "ping"}});
}

std::string MessagesStream::open_block(Block kind, const json& call) {
  std::string s = close_block();
  open_ = kind;
  json block;
  if (kind == Block::Thinking) {
    block = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
  } else if (kind == Block::Text) {
    block = {{"type", "text"}, {"text", ""}};
  } else {
    call_index_ = call.value("index", 0);
    block = {{"type", "tool_use"},
             {"id", call.value("id", "")},
             {"name", call.contains("function") ? call["function"].value("name", "") : ""},
             {"input", json::object()}};
  }
  s += event({{"type", "content_block_start"}, {"index", blocks_}, {"content_block", block}});
  ++blocks_;
  return s;
}

std::string MessagesStream::close_block() {
  if (open_ == Block::None) return "";
  open_ = Block::None;
  return event({{"type", "content_block_stop"}, {"index", blocks_ - 1}});
}

std::string MessagesStream::on_chunk(const json& chunk) {
  const auto ch = chunk.find("choices");
  if (ch == chunk.end() || !ch->is_array() || ch->empty()) return "";
  const json& choice = (*ch)[0];
  std::string s;
  if (const auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) {
    finish_reason_ = f->get<std::string>();
    stop_reason_ = choice.value("stop_reason", json(nullptr));
  }
  const auto d = choice.find("delta");
  if (d == choice.end() || !d->is_object()) return s;
  auto delta = [&](const json& dl) { return event({{"type", "content_block_delta"}, {"index", blocks_ - 1}, {"delta", dl}}); };
  if (const auto r = d->find("reasoning"); r != d->end() && r->is_string() && !r->get_ref<const std::string&>().empty()) {
    if (open_ != Block::Thinking) s += open_block(Block::Thinking);
    s += delta({{"type", "thinking_delta"}, {"thinking", *r}});
  }
  if (const auto c = d->find("content"); c != d->end() && c->is_string() && !c->get_ref<const std::string&>().empty()) {
    std::string text = c->get<std::string>();
    if (open_ != Block::Text && seen_call_ && blank(held_ + text)) {
      held_ += text;  // blank text after a tool call (the separator before the next one): no block unless more follows
    } else {
      text = std::exchange(held_, "") + text;
      if (open_ != Block::Text) s += open_block(Block::Text);
      s += delta({{"type", "text_delta"}, {"text", text}});
    }
  }
  if (const auto t = d->find("tool_calls"); t != d->end() && t->is_array())
    for (const json& tc : *t) {
      if (!tc.is_object()) continue;
      if (open_ != Block::ToolUse || tc.value("index", 0) != call_index_) s += open_block(Block::ToolUse, tc);
      seen_call_ = true;
      held_.clear();
      const auto fn = tc.find("function");
      if (fn == tc.end() || !fn->is_object()) continue;
      if (const auto a = fn->find("arguments"); a != fn->end() && a->is_string() && !a->get_ref<const std::string&>().empty())
        s += delta({{"type", "input_json_delta"}, {"partial_json", *a}});
    }
  return s;
}

std::string MessagesStream::finish(const json& usage) {
  std::string s = blocks_ == 0 ? open_block(Block::Text) : "";  // an empty reply: an empty text block
  s += close_block();
  const auto [stop, seq] = stop_of(finish_reason_, stop_reason_, seen_call_);
  s += event({{"type", "message_delta"}, {"delta", {{"stop_reason", stop}, {"stop_sequence", seq}}}, {"usage", usage_of(usage)}});
  return s + event({{"type", "message_stop"}});
}

std::string MessagesStream::error(const ApiError& e) { return event(anthropic_error_body(e)); }

}  // namespace ssmserve::server
