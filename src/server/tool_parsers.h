// Owns the tool-call parsers of the chat endpoint (vLLM's --tool-call-parser): they find the tool calls a model
// wrote in its output text (e.g. Hermes / Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, or the
// Qwen3-Coder / Qwen3.5 XML form `<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>`),
// whole or while the text streams, and split them from the message content; and the calls of a forced tool_choice
// (the JSON its schema shaped).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
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
  nlohmann::ordered_json to_json(int index = -1) const;
};

/// What a parser found in a whole output text.
struct ExtractedToolCalls {
  bool tools_called = false;
  std::string content;       ///< the text outside the tool calls (the whole text when none were found)
  bool has_content = true;   ///< false: "content" is null (nothing but tool calls)
  std::vector<ToolCall> calls;
};

/// A tool-call parser (one per output: it keeps the streaming position). Subclasses are the formats registered in
/// tool_parsers.cpp (make_tool_parser).
class ToolParser {
 public:
  /// A streamed piece: content to send and call pieces. A piece with an id begins a call (its id, name and the
  /// start of its arguments); a piece without one (empty id and name) appends `arguments` text to the last begun
  /// call. Formats that send calls whole send one piece per call; qwen3_coder sends the name, then the arguments as
  /// they complete. The concatenated arguments of a call are its JSON text.
  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  virtual ~ToolParser() = default;
  /// The calls in a whole output (vLLM's extract_tool_calls): the content is the text before the first call
  /// (has_content false when empty); without any valid call the whole text is content.
  virtual ExtractedToolCalls extract(const std::string& text) const = 0;
  /// Streaming: takes the next piece of the output; returns the content it can send now (text that may begin a
  /// tag is held back) and call pieces. `final`: the output ended (unterminated calls are closed, or sent as
  /// content when they are not calls).
  virtual Delta feed(std::string_view text, bool final) = 0;
  /// Whether feed() began any call so far.
  bool called() const { return num_calls_ > 0; }
  /// Whether an output with calls finishes with reason "tool_calls", given whether the engine `stopped` it (EOS or a
  /// stop string, not max_tokens): true for the auto parsers; for a forced tool_choice "required" when stopped; never
  /// for a named tool_choice (vLLM).
  virtual bool finish_as_tool_calls(bool stopped) const { return true; }
  const std::string& name() const { return name_; }

 protected:
  explicit ToolParser(std::string name) : name_(std::move(name)) {}
  std::string name_;
  int num_calls_ = 0;  // calls begun by feed()
};

/// A tag + JSON format (hermes, granite4, granite, jamba, minimax, nemotron_json): calls written as JSON after a start tag,
/// up to an end tag (or the end of the text when the format has none). The JSON is one call
/// `{"name", "arguments" | "parameters"}` or a list of them (or one per line). Streamed calls go out whole once
/// their end tag arrived.
class JsonToolParser : public ToolParser {
 public:
  /// Hermes: vLLM's hermes rules (and the others'): a whole output's content is the text before the first call; a
  /// block may be one call, a list of them, or one per line, with "arguments" or "parameters"; a call still open at
  /// the end is parsed as it is. Granite4: vLLM's granite4 rules: the content is all the text outside the calls, a
  /// block must be one {"name", "arguments"} object and every call closed; otherwise the whole output is content
  /// (streamed: such a block is content).
  enum class Rules { Hermes, Granite4 };
  JsonToolParser(std::string name, std::string start_tag, std::string end_tag, Rules rules = Rules::Hermes);
  /// As ToolParser::extract; a call that is not valid JSON leaves the whole text as content with no calls, as vLLM.
  ExtractedToolCalls extract(const std::string& text) const override;
  /// As ToolParser::feed; an unterminated call at `final` is parsed as it is (not valid JSON: sent as content).
  Delta feed(std::string_view text, bool final) override;

 private:
  /// Parses the JSON of one tagged block into calls; false when it is not a call or a list of calls.
  bool parse_block(std::string_view body, std::vector<ToolCall>& out) const;

  std::string start_, end_;
  Rules rules_ = Rules::Hermes;
  std::string buf_;        // streamed text not yet sent or parsed
  bool in_call_ = false;   // buf_ holds the inside of a call (after its start tag)
};

/// A new parser of the format `name` (hermes, granite4, granite, jamba, minimax, nemotron_json, qwen3_coder / qwen3_xml: see
/// tool_parser_names()). `tools`: the request's tools (OpenAI `[{"type": "function", "function": {"name",
/// "parameters"}}]`, or null); qwen3_coder converts parameter values by their JSON-schema types there, the others
/// ignore it. Throws Error for an unknown name, listing the known ones.
std::unique_ptr<ToolParser> make_tool_parser(const std::string& name,
                                             const nlohmann::ordered_json& tools = nlohmann::ordered_json());
/// The qwen3_coder / qwen3_xml parser (tool_parser_qwen3_coder.cpp), as make_tool_parser("qwen3_coder", tools).
std::unique_ptr<ToolParser> make_qwen3_coder_tool_parser(const std::string& name, const nlohmann::ordered_json& tools);
/// The parser of a forced tool_choice (tool_parser_forced.cpp), whose output was decoded under
/// tool_choice_json_schema: `function_name` empty = "required" (a JSON list of {"name", "parameters"}, each one call),
/// else a named function (the whole output is that function's arguments).
std::unique_ptr<ToolParser> make_forced_tool_parser(const std::string& function_name);
/// The registered parser names.
std::vector<std::string> tool_parser_names();
/// JSON text as Python's json.dumps(x, ensure_ascii=False) writes it (", " and ": " separators), which is how vLLM
/// renders a call's arguments.
std::string python_json_dumps(const nlohmann::ordered_json& x);
/// A new tool-call id, as vLLM's: "chatcmpl-tool-" and 32 random hex digits.
std::string new_tool_call_id();
/// `text` parsed as JSON, or nullopt when it is not JSON or nests deeper than 256 [ / { levels (parsing and
/// rendering recurse; vLLM's json.loads stops at Python's recursion limit too).
std::optional<nlohmann::ordered_json> parse_json_bounded(std::string_view text);

}  // namespace ssmserve::server
