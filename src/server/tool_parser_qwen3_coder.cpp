// Owns the qwen3_coder tool-call parser (vLLM's --tool-call-parser qwen3_coder / qwen3_xml): the XML calls of the
// Qwen3-Coder / Qwen3.5 / Qwen3.6 / Qwen3-Next chat templates, values typed by the request's tool schemas.
#include "server/tool_parsers.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

namespace ssmserve::server {

using ojson = nlohmann::ordered_json;

namespace {

constexpr std::string_view kToolCall = "<tool_call>", kToolCallEnd = "</tool_call>", kFunction = "<function=",
                           kFunctionEnd = "</function>", kParameter = "<parameter=", kParameterEnd = "</parameter>";

/// Python's str.strip() whitespace.
std::string_view py_strip(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\n\r\f\v") - b + 1);
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return r;
}

/// `s` without the '_' that Python allows between digits; nullopt for any other '_'.
std::optional<std::string> without_digit_underscores(std::string_view s) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') r += s[i];
    else if (i == 0 || i + 1 == s.size() || !digit(s[i - 1]) || !digit(s[i + 1])) return std::nullopt;
  }
  return r;
}

/// Python's int(s) (sign, digits, '_' between digits, surrounding whitespace); nullopt when it is not one or does
/// not fit 64 bits (the value then stays a string).
std::optional<ojson> py_int(std::string_view s) {
  s = py_strip(s);
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    neg = s[0] == '-';
    s.remove_prefix(1);
  }
  const auto digits = without_digit_underscores(s);
  if (!digits || digits->empty() || digits->find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  uint64_t v = 0;
  if (std::from_chars(digits->data(), digits->data() + digits->size(), v).ec != std::errc()) return std::nullopt;
  if (!neg) return ojson(v);
  constexpr uint64_t kMinMagnitude = uint64_t{1} << 63;
  if (v > kMinMagnitude) return std::nullopt;
  return ojson(v == kMinMagnitude ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(v));
}

/// vLLM's number conversion: Python's float(s), an integer when it has no fraction; nullopt when it is not a
/// finite number (vLLM keeps "nan" as the string too).
std::optional<ojson> py_number(std::string_view s) {
  s = py_strip(s);
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  const auto text = without_digit_underscores(s);
  if (!text || text->empty()) return std::nullopt;
  double v = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, v, std::chars_format::general);
  if (ec != std::errc() || ptr != end || !std::isfinite(v)) return std::nullopt;
  if (v == std::trunc(v) && std::fabs(v) < 9.2e18) return ojson(static_cast<int64_t>(v));
  return ojson(v);
}

/// vLLM's fallback, Python's ast.literal_eval, approximated: True / False / None, else the text as JSON (numbers,
/// double-quoted strings, lists and objects of them). Single-quoted Python strings / tuples are not recognized.
std::optional<ojson> py_literal(std::string_view s) {
  if (s == "True") return ojson(true);
  if (s == "False") return ojson(false);
  if (s == "None") return ojson(nullptr);
  return parse_json_bounded(s);
}

/// A parameter's value converted by its JSON-schema type in `props` (the function's `parameters.properties`), as
/// vLLM's Qwen3CoderToolParser._convert_param_value: "null" (any case) is null; a parameter not in the schema, or
/// of a string type, stays the text; integer / number / boolean types are parsed (booleans: "true" is true, any
/// other text false); object / array types are parsed as JSON; other types as a Python literal. A value that does
/// not parse stays the text.
ojson convert_param(const std::string& value, const std::string& name, const ojson& props) {
  if (lower(value) == "null") return nullptr;
  const auto spec = props.is_object() ? props.find(name) : props.end();
  if (!props.is_object() || spec == props.end()) return value;
  std::string type = "string";
  if (spec->is_object() && spec->contains("type")) {
    const ojson& t = (*spec)["type"];
    type = t.is_string() ? lower(py_strip(t.get<std::string>())) : "";  // e.g. ["integer", "null"]: a literal
  }
  auto starts = [&](std::string_view p) { return type.rfind(p, 0) == 0; };
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" || type == "enum")
    return value;
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned"))
    return py_int(value).value_or(ojson(value));
  if (starts("num") || starts("float")) return py_number(value).value_or(ojson(value));
  if (type == "boolean" || type == "bool" || type == "binary") return lower(value) == "true";
  if (type == "object" || type == "array" || type == "arr" || starts("dict") || starts("list"))
    if (auto j = parse_json_bounded(value)) return *j;
  return py_literal(value).value_or(ojson(value));
}

/// Function name -> its parameter schemas (vLLM's _get_arguments_config: `parameters.properties`, or `parameters`
/// itself when it has no "properties"), from the request's tools; the first tool of a name counts.
using ToolSchemas = std::map<std::string, ojson>;

std::shared_ptr<const ToolSchemas> tool_schemas(const ojson& tools) {
  auto r = std::make_shared<ToolSchemas>();
  if (!tools.is_array()) return r;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function")) continue;
    const ojson& f = t["function"];
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    const ojson params = f.contains("parameters") ? f["parameters"] : ojson();
    ojson props = ojson::object();
    if (params.is_object()) props = params.contains("properties") ? params["properties"] : params;
    r->emplace(f["name"].get<std::string>(), std::move(props));
  }
  return r;
}

/// The qwen3_coder format (vLLM's --tool-call-parser qwen3_coder; qwen3_xml is the same format):
///   content<tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
/// One state machine serves whole outputs and streams, so that both agree in every split. Each byte is scanned a
/// bounded number of times (O(n) over a stream; a tag split across pieces is searched again from its start).
///  - The content is the text before the first `<tool_call>` or bare `<function=` (vLLM also parses a function
///    without `<tool_call>`); text after it that is not inside a function is dropped, as vLLM.
///  - A function ends at `</function>`, `</tool_call>` or the end of the output; several per `<tool_call>` and
///    several `<tool_call>`s are fine. A parameter's value ends at `</parameter>`, the next `<parameter=`, the
///    function's end or the end of the output; one leading and one trailing newline are removed.
///  - A function or parameter without a `>` after its name (truncated) is skipped; when no function begins at all,
///    the whole text is content (vLLM: the whole text is content when any of them is malformed).
///  - A repeated parameter name keeps its first value (vLLM's dict keeps the last; streamed arguments cannot take
///    a sent value back).
///  - Streamed: a call begins (id, name) once `<function=NAME>` is complete; its arguments then come as
///    `{`, `"ARG": VALUE` pieces as each parameter completes, and `}` at its end, adding up to the whole-output
///    arguments (json.dumps of the converted values, in the model's order).
class Qwen3CoderToolParser : public ToolParser {
 public:
  Qwen3CoderToolParser(std::string name, std::shared_ptr<const ToolSchemas> schemas)
      : ToolParser(std::move(name)), schemas_(std::move(schemas)) {}

  ExtractedToolCalls extract(const std::string& text) const override {
    Qwen3CoderToolParser p(name_, schemas_);
    Delta d = p.feed(text, /*final=*/true);
    ExtractedToolCalls r;
    if (!p.called()) {
      r.content = text;
      return r;
    }
    r.tools_called = true;
    r.content = std::move(d.content);
    r.has_content = !r.content.empty();
    for (auto& c : d.calls) {
      if (!c.id.empty()) r.calls.push_back(std::move(c));
      else r.calls.back().arguments += c.arguments;  // a begun call comes first
    }
    return r;
  }

  Delta feed(std::string_view text, bool final) override {
    Delta d;
    if (done_) return d;
    out_ = &d;
    buf_.append(text);
    while (step(final)) {
    }
    if (final) finish();
    buf_.erase(0, pos_);  // what is left is unscanned or a possible tag: a few bytes, or a value being written
    scan_ -= pos_;
    pos_ = 0;
    out_ = nullptr;
    return d;
  }

 private:
  enum class State { Text, Calls, Name, Params, ParamName, ParamValue };
  static constexpr size_t kGt = 100;  // Hit::tag of a '>'
  struct Hit {
    size_t pos = std::string::npos;  // in buf_; npos: none yet
    size_t tag = 0;                  // index in the tags searched, or kGt
  };

  /// The first of `tags` (or '>' when `gt`) in buf_ from the scan position. When there is none, the scan position
  /// moves past the text searched, but not past a tail that may begin a tag.
  Hit find(std::initializer_list<std::string_view> tags, bool gt) {
    const std::string_view b(buf_);
    for (size_t i = std::max(scan_, pos_); i < b.size(); ++i) {
      if (gt && b[i] == '>') return {i, kGt};
      if (b[i] != '<') continue;
      const std::string_view rest = b.substr(i);
      size_t t = 0;
      bool partial = false;
      for (const std::string_view tag : tags) {
        if (rest.substr(0, tag.size()) == tag) return {i, t};
        partial = partial || (rest.size() < tag.size() && tag.substr(0, rest.size()) == rest);
        ++t;
      }
      if (partial) {
        scan_ = i;
        return {};
      }
    }
    scan_ = b.size();
    return {};
  }

  /// Marks buf_ up to `to` as handled (kept as fallback content while no call has begun).
  void consume(size_t to) {
    if (in_region_ && !resolved_) pending_.append(buf_, pos_, to - pos_);
    pos_ = to;
    scan_ = std::max(scan_, to);
  }

  /// One state transition; false when more text is needed.
  bool step(bool final) {
    switch (state_) {
      case State::Text: {
        const Hit h = find({kToolCall, kFunction}, false);
        if (h.pos == std::string::npos) {
          const size_t to = final ? buf_.size() : scan_;
          out_->content.append(buf_, pos_, to - pos_);
          consume(to);
          return false;
        }
        out_->content.append(buf_, pos_, h.pos - pos_);
        consume(h.pos);
        in_region_ = true;
        consume(h.pos + (h.tag == 0 ? kToolCall : kFunction).size());
        state_ = h.tag == 0 ? State::Calls : State::Name;
        return true;
      }
      case State::Calls: {  // between functions: only a function counts
        const Hit h = find({kFunction}, false);
        if (h.pos == std::string::npos) {
          consume(scan_);
          return false;
        }
        consume(h.pos + kFunction.size());
        state_ = State::Name;
        return true;
      }
      case State::Name: {
        const Hit h = find({kFunctionEnd, kToolCallEnd}, true);
        if (h.pos == std::string::npos) return false;
        if (h.tag != kGt) {  // no name: not a call
          consume(h.pos + (h.tag == 0 ? kFunctionEnd : kToolCallEnd).size());
          state_ = State::Calls;
          return true;
        }
        std::string name = buf_.substr(pos_, h.pos - pos_);
        consume(h.pos + 1);
        if (name.empty()) {
          state_ = State::Calls;
        } else {
          begin_call(std::move(name));
          state_ = State::Params;
        }
        return true;
      }
      case State::Params: {  // inside a function, between parameters
        const Hit h = find({kParameter, kFunctionEnd, kToolCallEnd}, false);
        if (h.pos == std::string::npos) {
          consume(scan_);
          return false;
        }
        consume(h.pos + (h.tag == 0 ? kParameter : h.tag == 1 ? kFunctionEnd : kToolCallEnd).size());
        if (h.tag == 0) {
          state_ = State::ParamName;
        } else {
          emit_arguments("}");
          state_ = State::Calls;
        }
        return true;
      }
      case State::ParamName: {
        const Hit h = find({kParameterEnd, kParameter, kFunctionEnd, kToolCallEnd}, true);
        if (h.pos == std::string::npos) return false;
        if (h.tag == kGt) {
          param_ = buf_.substr(pos_, h.pos - pos_);
          consume(h.pos + 1);
          state_ = State::ParamValue;
        } else {  // no '>': not a parameter; the tag that ended it is handled between parameters
          consume(h.tag == 0 ? h.pos + kParameterEnd.size() : h.pos);
          state_ = State::Params;
        }
        return true;
      }
      case State::ParamValue: {
        const Hit h = find({kParameterEnd, kParameter, kFunctionEnd, kToolCallEnd}, false);
        if (h.pos == std::string::npos) return false;
        add_param(std::string_view(buf_).substr(pos_, h.pos - pos_));
        consume(h.tag == 0 ? h.pos + kParameterEnd.size() : h.pos);
        state_ = State::Params;
        return true;
      }
    }
    return false;
  }

  /// The output ended: closes an open call; with no call begun, the text from the first tag on is content.
  void finish() {
    if (state_ == State::ParamValue) {
      std::string_view v = std::string_view(buf_).substr(pos_);
      if (!v.empty() && v.back() == '\n') v.remove_suffix(1);  // vLLM's regex `$` stops before a final newline
      add_param(v);
    }
    if (state_ == State::Params || state_ == State::ParamName || state_ == State::ParamValue) emit_arguments("}");
    consume(buf_.size());
    if (in_region_ && !resolved_) out_->content += pending_;
    pending_.clear();
    done_ = true;
  }

  void begin_call(std::string name) {
    ToolCall c;
    c.id = new_tool_call_id();
    c.name = std::move(name);
    c.arguments.push_back('{');  // (not = "{": GCC 12 warns falsely, -Wrestrict)
    const auto it = schemas_->find(c.name);
    props_ = it == schemas_->end() ? nullptr : &it->second;
    out_->calls.push_back(std::move(c));
    ++num_calls_;
    resolved_ = true;
    pending_.clear();
    num_params_ = 0;
    params_seen_.clear();
  }

  /// Appends arguments text to the open call (a continuation piece unless this delta began the call).
  void emit_arguments(std::string_view s) {
    if (out_->calls.empty()) out_->calls.emplace_back();
    out_->calls.back().arguments += s;
  }

  /// A complete parameter value (the raw text after `<parameter=NAME>`) into the open call's arguments.
  void add_param(std::string_view v) {
    if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
    if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
    if (!params_seen_.insert(param_).second) return;  // a repeated name: the first value counts
    static const ojson kNoSchema = ojson::object();
    const ojson value = convert_param(std::string(v), param_, props_ ? *props_ : kNoSchema);
    emit_arguments(fmt::format("{}{}: {}", num_params_++ ? ", " : "", python_json_dumps(ojson(param_)),
                               python_json_dumps(value)));
  }

  std::shared_ptr<const ToolSchemas> schemas_;
  State state_ = State::Text;
  std::string buf_;          // text not yet handled, from pos_ on
  size_t pos_ = 0;           // handled up to here
  size_t scan_ = 0;          // searched for tags up to here (>= pos_)
  bool in_region_ = false;   // a <tool_call> or <function= was seen: no more content
  bool resolved_ = false;    // a call began: the region is calls, not content
  bool done_ = false;        // the final piece was fed
  std::string pending_;      // the region's text while no call began (content if none does)
  std::string param_;        // the name of the parameter being read
  int num_params_ = 0;       // parameters written into the open call's arguments
  std::set<std::string> params_seen_;
  const ojson* props_ = nullptr;  // the open call's parameter schemas (null: none, all values are strings)
  Delta* out_ = nullptr;     // the delta feed() is filling
};

}  // namespace

std::unique_ptr<ToolParser> make_qwen3_coder_tool_parser(const std::string& name, const ojson& tools) {
  return std::make_unique<Qwen3CoderToolParser>(name, tool_schemas(tools));
}

}  // namespace ssmserve::server
