// Owns the runtime values of ssmserve's Jinja engine (internal to src/server/jinja*.cpp): Value (JSON data,
// Undefined, namespace objects, macros) and the Python semantics the evaluator needs: str() / repr() rendering,
// json.dumps, truthiness, iteration, string and number helpers.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_ast.h"

namespace ssmserve::server::jinja {

using json = nlohmann::ordered_json;

/// A runtime value: JSON data, Jinja's Undefined, a namespace() object (mutable, shared) or a macro.
/// The key of the object that stands for a macro inside a container (`[handle_documents]`): its value is the index of
/// the macro in the rendering's macro list. A forged marker can only name one of the template's own macros.
inline constexpr const char* kMacroMarker = "\x01ssmserve-macro";

struct Value {
  enum Kind { Undefined, Json, Namespace, Macro } kind = Undefined;
  json j;
  std::shared_ptr<json> ns;
  const Stmt* macro = nullptr;
  bool tuple = false;   // Json array made by a tuple literal: str() gives (1, 2) (the flag is not kept inside containers)
  bool markup = false;  // markupsafe.Markup (from |safe or |escape): escaping it again leaves it as it is
  static Value of(json v) {
    Value x;
    x.kind = Json;
    x.j = std::move(v);
    return x;
  }
  bool undefined() const { return kind == Undefined; }
  /// The JSON view (namespaces as their attribute object, undefined as null, a macro as its marker object
  /// {kMacroMarker: index} so that it survives inside lists: see Renderer::as_macro).
  const json& data() const {
    static const json null_json;
    return kind == Json || kind == Macro ? j : kind == Namespace ? *ns : null_json;
  }
};

/// Python's str() of a float (repr: shortest round-trip digits, "inf", "nan", "1.0").
std::string py_float(double d);
/// Python's repr() of a string (single quotes unless the text has one and no double quote).
std::string py_str_quote(const std::string& s);
/// Python's repr() of a JSON value (True, None, ['a', 1], {'k': 2}).
std::string py_repr(const json& v);
/// Python's str() of a value: strings as-is, undefined as "", the rest as py_repr.
std::string py_str(const Value& v);
/// json.dumps options (transformers' tojson filter: ensure_ascii, indent, separators, sort_keys).
struct JsonDumpOptions {
  int indent = -1;                // < 0: one line (Python's indent=None)
  std::string item_sep, key_sep;  // empty item_sep: Python's defaults (", " or "," when indented; ": ")
  bool sort_keys = false;         // object keys in code point order
  bool ensure_ascii = false;      // non-ASCII as \uXXXX escapes
};
/// json.dumps(v, ...) with Python's formatting, appended to out. `depth` is the current indent level.
void py_json(const json& v, std::string& out, const JsonDumpOptions& opt, int depth = 0);
/// Python's a < b for sorting: numbers (booleans as 0 / 1), strings by code point, lists element-wise. Throws Error
/// for other pairs (Python's TypeError: '<' not supported).
bool py_less(const json& a, const json& b);
/// markupsafe.escape(s): & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string html_escape(const std::string& s);
/// Python truthiness (undefined, none, 0, "", [] and {} are false; namespaces and macros true).
bool truthy(const Value& v);
/// The items a for loop (or a filter) walks: list items, dict keys, string characters (bytes of UTF-8 sequences
/// kept together), nothing for undefined / none.
std::vector<json> iterate(const Value& v);
/// How many items iterate(v) gives, without building them (code points of a string).
size_t item_count(const Value& v);
/// str.strip / lstrip / rstrip with `chars` (empty = whitespace).
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right);
/// str.replace(from, to) (every occurrence; empty `from` leaves s unchanged).
std::string replace_all(std::string s, const std::string& from, const std::string& to);
/// A number operand (booleans as 0 / 1). Throws Error naming `what` otherwise.
double num(const json& v, const char* what);
/// An integer operand (a number truncated like Python's int()); throws Error naming `what` if it is not finite or
/// beyond +-2^53 (where doubles stop being exact and loop arithmetic could overflow).
long long to_int(const json& v, const char* what);

/// Resource bounds for one render, so that a hostile template (the checkpoint's or a request's chat_template) ends in
/// an Error instead of exhausting memory, the stack or the CPU:
constexpr size_t kMaxStringBytes = size_t{64} << 20;  // any string the template builds, and the output
constexpr size_t kMaxListItems = size_t{1} << 20;     // any list the template builds
constexpr int kMaxDataDepth = 512;                    // containers in containers in a stored (set / macro argument) value
constexpr long long kMaxLoopIterations = 1'000'000;  // for-loop items, summed over the render (counted as a loop starts)
/// Any list or dict the template builds or stores, charged 64 bytes per JSON value (about what a nested one takes in
/// memory) plus the bytes of its strings and keys: values are copied, not shared, so a loop that nests a value in
/// itself (`ns.x + [ns.x]`) doubles it each pass.
constexpr size_t kMaxDataBytes = kMaxStringBytes + (size_t{1} << 20);  // room for one string of the largest size
/// Throws Error if a string of `bytes` bytes would pass kMaxStringBytes.
void check_string_size(size_t bytes);
/// The bytes `v` is charged against kMaxDataBytes (iterative; stops counting once past `limit`).
size_t data_bytes(const json& v, size_t limit = kMaxDataBytes);
/// Throws Error if a value of `bytes` charged bytes would pass kMaxDataBytes.
void check_data_size(size_t bytes);
/// A value about to be stored (set, a macro argument): throws Error if it nests containers deeper than kMaxDataDepth
/// or is charged more than kMaxDataBytes (iterative: safe on any depth).
void check_stored_data(const json& v);
/// An arithmetic result: an integer when both operands were integers, else a float.
json number_result(double d, bool integral);

/// Thrown by {% break %} / {% continue %} to the enclosing loop.
struct BreakSignal {};
struct ContinueSignal {};

}  // namespace ssmserve::server::jinja
