// Owns the tool-call parsers (see tool_parsers.h).
#include "server/tool_parsers.h"

#include "config/hf_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <random>

#include "core/error.h"

namespace ssmserve::server {

using ojson = nlohmann::ordered_json;  // parsed calls keep the model's key order, as Python's json does

namespace {

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

/// One call object {"name": string, "arguments" | "parameters": object | string} into `out`.
bool call_from_json(const ojson& j, std::vector<ToolCall>& out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  ToolCall c;
  c.id = new_tool_call_id();
  c.name = j["name"].get<std::string>();
  const ojson* args = j.contains("arguments") ? &j["arguments"] : j.contains("parameters") ? &j["parameters"] : nullptr;
  if (!args || args->is_null()) c.arguments = "{}";
  else if (args->is_string()) c.arguments = args->get<std::string>();  // already JSON text (some models write it so)
  else c.arguments = python_json_dumps(*args);
  out.push_back(std::move(c));
  return true;
}


constexpr size_t kMaxJsonDepth = 256;

}  // namespace

std::string new_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32)};
  return fmt::format("chatcmpl-tool-{:016x}{:016x}", rng(), rng());
}

std::optional<ojson> parse_json_bounded(std::string_view text) {
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) return std::nullopt;
  ojson j = ojson::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

ojson ToolCall::to_json(int index) const {
  ojson j = ojson::object();  // vLLM's (Delta)ToolCall order: id, type, index, function
  j["id"] = id;
  j["type"] = "function";
  if (index >= 0) j["index"] = index;
  j["function"] = {{"name", name}, {"arguments", arguments}};
  return j;
}

std::string python_json_dumps(const ojson& x) {
  switch (x.type()) {
    case ojson::value_t::object: {
      std::string s = "{";
      bool first = true;
      for (auto it = x.begin(); it != x.end(); ++it) {
        if (!first) s += ", ";
        first = false;
        s += ojson(it.key()).dump(-1, ' ', false, ojson::error_handler_t::replace) + ": " + python_json_dumps(it.value());
      }
      return s + "}";
    }
    case ojson::value_t::array: {
      std::string s = "[";
      for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + python_json_dumps(x[i]);
      return s + "]";
    }
    default:
      return x.dump(-1, ' ', false, ojson::error_handler_t::replace);
  }
}

JsonToolParser::JsonToolParser(std::string name, std::string start_tag, std::string end_tag, Rules rules)
    : ToolParser(std::move(name)), start_(std::move(start_tag)), end_(std::move(end_tag)), rules_(rules) {}

bool JsonToolParser::parse_block(std::string_view body, std::vector<ToolCall>& out) const {
  std::vector<ToolCall> calls;
  const std::string_view t = trim(body);
  if (json_nesting_depth(t, kMaxJsonDepth) > kMaxJsonDepth) return false;  // not parsed (too deep): stays content
  const ojson j = ojson::parse(t.begin(), t.end(), nullptr, /*allow_exceptions=*/false);
  if (rules_ == Rules::Granite4) {  // one {"name", "arguments"} object, nothing else
    if (j.is_discarded() || !j.is_object() || !j.contains("arguments") || j["arguments"].is_null() ||
        !call_from_json(j, calls))
      return false;
    for (auto& c : calls) out.push_back(std::move(c));
    return true;
  }
  if (!j.is_discarded()) {
    if (j.is_array()) {
      for (const auto& e : j)
        if (!call_from_json(e, calls)) return false;
    } else if (!call_from_json(j, calls)) {
      return false;
    }
  } else {  // one object per line (MiniMax)
    size_t pos = 0;
    while (pos < t.size()) {
      size_t nl = t.find('\n', pos);
      if (nl == std::string_view::npos) nl = t.size();
      const std::string_view line = trim(t.substr(pos, nl - pos));
      pos = nl + 1;
      if (line.empty()) continue;
      const ojson e = ojson::parse(line.begin(), line.end(), nullptr, false);
      if (e.is_discarded() || !call_from_json(e, calls)) return false;
    }
    if (calls.empty()) return false;
  }
  for (auto& c : calls) out.push_back(std::move(c));
  return true;
}

ExtractedToolCalls JsonToolParser::extract(const std::string& text) const {
  ExtractedToolCalls r;
  r.content = text;
  const size_t first = text.find(start_);
  if (first == std::string::npos) return r;
  std::vector<ToolCall> calls;
  std::string around = text.substr(0, first);  // the text outside the calls
  for (size_t pos = first; pos != std::string::npos && pos < text.size();) {
    const size_t body = pos + start_.size();
    const size_t end = end_.empty() ? std::string::npos : text.find(end_, body);
    if (end == std::string::npos && rules_ == Rules::Granite4) return r;  // an unclosed call: the whole text is content
    const std::string_view block = std::string_view(text).substr(body, end == std::string::npos ? std::string::npos : end - body);
    if (!parse_block(block, calls)) return r;  // as vLLM: not a call after all, the whole text is content
    if (end == std::string::npos) break;
    pos = text.find(start_, end + end_.size());
    around.append(text, end + end_.size(), pos == std::string::npos ? std::string::npos : pos - end - end_.size());
  }
  r.tools_called = !calls.empty();
  if (!r.tools_called) return r;
  r.calls = std::move(calls);
  r.content = rules_ == Rules::Granite4 ? std::move(around) : text.substr(0, first);
  r.has_content = !r.content.empty();
  return r;
}

ToolParser::Delta JsonToolParser::feed(std::string_view text, bool final) {
  Delta d;
  buf_.append(text);
  while (true) {
    if (!in_call_) {
      const size_t pos = buf_.find(start_);
      if (pos != std::string::npos) {
        d.content.append(buf_, 0, pos);
        buf_.erase(0, pos + start_.size());
        in_call_ = true;
        continue;
      }
      // Hold back a tail that may be the start of a tag.
      size_t keep = 0;
      if (!final)
        for (size_t k = std::min(buf_.size(), start_.size() - 1); k > 0; --k)
          if (buf_.compare(buf_.size() - k, k, start_, 0, k) == 0) {
            keep = k;
            break;
          }
      d.content.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return d;
    }
    const size_t end = end_.empty() ? std::string::npos : buf_.find(end_);
    if (end == std::string::npos && !final) return d;  // the call is still being written
    const std::string body = buf_.substr(0, end);
    std::vector<ToolCall> calls;
    const bool unclosed_counts = !(end == std::string::npos && rules_ == Rules::Granite4);  // granite4: content
    if (unclosed_counts && parse_block(body, calls)) {
      num_calls_ += static_cast<int>(calls.size());
      for (auto& c : calls) d.calls.push_back(std::move(c));
    } else {  // not a call after all: its text is content
      d.content += start_ + body + (end == std::string::npos ? "" : end_);
    }
    buf_.erase(0, end == std::string::npos ? std::string::npos : end + end_.size());
    in_call_ = false;
    if (buf_.empty()) return d;
  }
}

namespace {

using ParserFactory = std::function<std::unique_ptr<ToolParser>(const std::string& name, const ojson& tools)>;

ParserFactory json_format(std::string start_tag, std::string end_tag,
                          JsonToolParser::Rules rules = JsonToolParser::Rules::Hermes) {
  return [start_tag, end_tag, rules](const std::string& name, const ojson&) {
    return std::make_unique<JsonToolParser>(name, start_tag, end_tag, rules);
  };
}

/// Registered formats: name -> a new parser.
const std::map<std::string, ParserFactory>& registry() {
  static const std::map<std::string, ParserFactory> r = {
      {"hermes", json_format("<tool_call>", "</tool_call>")},      // Hermes 2 Pro / Qwen2.5-3 / Granite 4.0: one object per block
      {"granite4", json_format("<tool_call>", "</tool_call>", JsonToolParser::Rules::Granite4)},  // Granite 4.0 (vLLM's granite4)
      {"granite", json_format("<|tool_call|>", "")},               // Granite 3.x: a list after the tag (no end tag)
      {"jamba", json_format("<tool_calls>", "</tool_calls>")},     // Jamba: a list
      {"minimax", json_format("<tool_calls>", "</tool_calls>")},   // MiniMax-Text-01: one object per line
      {"nemotron_json", json_format("<TOOLCALL>", "</TOOLCALL>")},  // Nemotron-H / Nano v2 templates: a list
      {"qwen3_coder", make_qwen3_coder_tool_parser},  // Qwen3-Coder / Qwen3.5 / Qwen3.6 / Qwen3-Next: XML <function=NAME><parameter=ARG>
      {"qwen3_xml", make_qwen3_coder_tool_parser},    // vLLM's other parser of the same format
  };
  return r;
}

}  // namespace

std::unique_ptr<ToolParser> make_tool_parser(const std::string& name, const ojson& tools) {
  const auto& r = registry();
  const auto it = r.find(name);
  if (it == r.end()) {
    std::string known;
    for (const auto& [k, v] : r) known += (known.empty() ? "" : ", ") + k;
    fail("unknown tool-call parser \"{}\" (--tool-call-parser); known: {}", name, known);
  }
  return it->second(name, tools);
}

std::vector<std::string> tool_parser_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : registry()) names.push_back(k);
  return names;
}

}  // namespace ssmserve::server
