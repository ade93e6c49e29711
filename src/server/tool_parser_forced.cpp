// Owns the tool calls of a forced tool_choice (vLLM's serving_chat.py): the output was decoded under the JSON schema
// of tool_choice_json_schema (structured_request.h), and these parsers turn that JSON into tool_calls, whole or
// while it streams.
#include <fmt/format.h>

#include "server/tool_parsers.h"

namespace ssmserve::server {
namespace {

using ojson = nlohmann::ordered_json;

/// A named tool_choice: the whole output (the function's arguments, JSON the parameters schema shaped) is one call of
/// that function, content "" (vLLM). Streamed: the first piece begins the call (id, name, the text so far), each later
/// piece appends its text to the arguments (vLLM's DeltaToolCall per delta).
class NamedToolCallParser final : public ToolParser {
 public:
  explicit NamedToolCallParser(std::string function) : ToolParser("tool_choice"), function_(std::move(function)) {}

  ExtractedToolCalls extract(const std::string& text) const override {
    ExtractedToolCalls r;
    r.tools_called = true;
    r.content = "";
    r.calls.push_back(ToolCall{new_tool_call_id(), function_, text});
    return r;
  }

  Delta feed(std::string_view text, bool final) override {
    Delta d;
    if (num_calls_ == 0) {
      if (text.empty() && !final) return d;
      d.calls.push_back(ToolCall{new_tool_call_id(), function_, std::string(text)});
      num_calls_ = 1;
    } else if (!text.empty()) {
      d.calls.push_back(ToolCall{"", "", std::string(text)});
    }
    return d;
  }

  bool finish_as_tool_calls(bool) const override { return false; }  // vLLM (and OpenAI): a named choice ends "stop"

 private:
  std::string function_;
};

/// One item {"name": string, "parameters": object} of a "required" output as a call (arguments: Python's json.dumps
/// of the parameters, as vLLM); false when the item is not of that shape.
bool call_from_item(const ojson& item, std::vector<ToolCall>& out) {
  if (!item.is_object() || !item.contains("name") || !item["name"].is_string()) return false;
  const ojson* params = item.contains("parameters") ? &item["parameters"] : nullptr;
  out.push_back(ToolCall{new_tool_call_id(), item["name"].get<std::string>(),
                         params && !params->is_null() ? python_json_dumps(*params) : "{}"});
  return true;
}

/// tool_choice "required": the output is a JSON list [{"name", "parameters"}, ...], each item one call, content ""
/// (vLLM validates it as list[FunctionDefinition]). Each complete item is a call also when the list is cut short
/// (max_tokens), so the whole and the streamed response agree; an output without a complete item (cut before the
/// first call's closing brace) has no calls and content "" (the partial JSON is not content, whole or streamed).
/// Streamed: each call goes out whole once its item's closing brace arrives (the auto JSON parsers' convention).
/// finish_reason is "tool_calls" only when the output stopped (vLLM's whole response; its stream says "tool_calls"
/// after a cut too).
class RequiredToolCallParser final : public ToolParser {
 public:
  RequiredToolCallParser() : ToolParser("tool_choice") {}

  ExtractedToolCalls extract(const std::string& text) const override {
    RequiredToolCallParser scan;
    Delta d = scan.feed(text, /*final=*/true);
    ExtractedToolCalls r;
    r.tools_called = !d.calls.empty();
    r.content = "";
    r.calls = std::move(d.calls);
    return r;
  }

  bool finish_as_tool_calls(bool stopped) const override { return stopped; }

  Delta feed(std::string_view text, bool /*final*/) override {
    // A scan of the list's text: string state and nesting depth; an item is the text of a `{` at depth 1 up to its
    // matching `}`.
    Delta d;
    text_.append(text);
    for (; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (in_string_) {
        if (escaped_) escaped_ = false;
        else if (c == '\\') escaped_ = true;
        else if (c == '"') in_string_ = false;
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '[' || c == '{') {
        if (c == '{' && depth_ == 1) item_start_ = pos_;
        ++depth_;
      } else if ((c == ']' || c == '}') && depth_ > 0) {
        --depth_;
        if (c == '}' && depth_ == 1) {
          const auto item = parse_json_bounded(std::string_view(text_).substr(item_start_, pos_ + 1 - item_start_));
          std::vector<ToolCall> calls;
          if (item && call_from_item(*item, calls)) {
            ++num_calls_;
            d.calls.push_back(std::move(calls.front()));
          }
        }
      }
    }
    return d;
  }

 private:
  std::string text_;   // the output so far
  size_t pos_ = 0;     // scanned up to here
  size_t item_start_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false;
};

}  // namespace

std::unique_ptr<ToolParser> make_forced_tool_parser(const std::string& function_name) {
  if (function_name.empty()) return std::make_unique<RequiredToolCallParser>();
  return std::make_unique<NamedToolCallParser>(function_name);
}

}  // namespace ssmserve::server
