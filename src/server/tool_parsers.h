// Owns the tool-call parsers of the chat endpoint (vLLM's --tool-call-parser): they find the tool calls a model
// wrote in its output text (e.g. Hermes / Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), whole
// or while the text streams, and split them from the message content.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve::server {

/// One tool call: the OpenAI `{"id", "type": "function", "function": {"name", "arguments"}}` (arguments: a JSON text).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
  /// The OpenAI object; with `index` (streaming deltas) when index >= 0.
  nlohmann::json to_json(int index = -1) const;
};

/// What a parser found in a whole output text.
struct ExtractedToolCalls {
  bool tools_called = false;
  std::string content;       ///< the text outside the tool calls (the whole text when none were found)
  bool has_content = true;   ///< false: "content" is null (nothing but tool calls)
  std::vector<ToolCall> calls;
};

/// A tool-call format: calls written as JSON after a start tag, up to an end tag (or the end of the text when the
/// format has none). The JSON is one call `{"name", "arguments" | "parameters"}` or a list of them. Stateless but
/// for the streaming position, so use one per choice.
class ToolParser {
 public:
  /// A streamed piece: content to send and calls completed by it.
  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  ToolParser(std::string name, std::string start_tag, std::string end_tag);
  /// The calls in a whole output (vLLM's extract_tool_calls): the content is the text before the first start tag
  /// (null when empty). A call that is not valid JSON leaves the whole text as content with no calls, as vLLM.
  ExtractedToolCalls extract(const std::string& text) const;
  /// Streaming: takes the next piece of the output; returns the content it can send now (text that may begin a
  /// start tag is held back) and the calls whose end tag arrived. `final`: the output ended (an unterminated call
  /// is parsed as it is; if it is not valid JSON its text is sent as content).
  Delta feed(std::string_view text, bool final);
  /// Whether feed() returned any call so far.
  bool called() const { return num_calls_ > 0; }
  const std::string& name() const { return name_; }

 private:
  /// Parses the JSON of one tagged block into calls; false when it is not a call or a list of calls.
  bool parse_block(std::string_view body, std::vector<ToolCall>& out) const;

  std::string name_, start_, end_;
  std::string buf_;        // streamed text not yet sent or parsed
  bool in_call_ = false;   // buf_ holds the inside of a call (after its start tag)
  int num_calls_ = 0;
};

/// A new parser of the format `name` (hermes, granite, nemotron: see tool_parser_names()). Throws Error for an
/// unknown name, listing the known ones.
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name);
/// The registered parser names.
std::vector<std::string> tool_parser_names();
/// JSON text as Python's json.dumps(x, ensure_ascii=False) writes it (", " and ": " separators), which is how vLLM
/// renders a call's arguments.
std::string python_json_dumps(const nlohmann::ordered_json& x);

}  // namespace ssmserve::server
