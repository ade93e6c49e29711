// Owns the Jinja evaluator: renders parsed templates (jinja_ast.h) over JSON values with Python/Jinja2 semantics
// for the subset chat templates use: output, if/elif/else, for (loop.*, else, inline if, break/continue), set
// (incl. namespace attributes), macros, filters, tests, string/dict methods, raise_exception. Values render as
// Python's str() does (True, None, ['a', 1]); tojson matches transformers' (ensure_ascii=False, ", " / ": ").
#include "server/jinja.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "server/jinja_ast.h"

namespace ssmserve::server::jinja {
namespace {

using json = nlohmann::ordered_json;

/// A runtime value: JSON data, Jinja's Undefined, a namespace() object (mutable, shared) or a macro.
struct Value {
  enum Kind { Undefined, Json, Namespace, Macro } kind = Undefined;
  json j;
  std::shared_ptr<json> ns;
  const Stmt* macro = nullptr;
  static Value of(json v) {
    Value x;
    x.kind = Json;
    x.j = std::move(v);
    return x;
  }
  bool undefined() const { return kind == Undefined; }
  /// The JSON view (namespaces as their attribute object, undefined as null).
  const json& data() const {
    static const json null_json;
    return kind == Json ? j : kind == Namespace ? *ns : null_json;
  }
};

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == std::floor(d) && std::fabs(d) < 1e16) return fmt::format("{:.1f}", d);
  return fmt::format("{}", d);
}

std::string py_str_quote(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\';
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out + q;
}

/// Python's repr() of a JSON value (used inside containers).
std::string py_repr(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "None";
    case json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case json::value_t::string: return py_str_quote(v.get<std::string>());
    case json::value_t::number_float: return py_float(v.get<double>());
    case json::value_t::array: {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + py_repr(v[i]);
      return s + "]";
    }
    case json::value_t::object: {
      std::string s = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it, first = false) s += (first ? "" : ", ") + py_str_quote(it.key()) + ": " + py_repr(it.value());
      return s + "}";
    }
    default: return v.dump();
  }
}

/// Python's str().
std::string py_str(const Value& v) {
  if (v.undefined()) return "";
  const json& d = v.data();
  if (d.is_string()) return d.get<std::string>();
  return py_repr(d);
}

/// json.dumps(v, ensure_ascii=False, indent=indent) with Python's separators.
void py_json(const json& v, std::string& out, int indent, int depth) {
  auto newline = [&](int d) {
    if (indent >= 0) out += "\n" + std::string(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  if (v.is_array()) {
    if (v.empty()) return void(out += "[]");
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      py_json(v[i], out, indent, depth + 1);
    }
    newline(depth);
    out += "]";
  } else if (v.is_object()) {
    if (v.empty()) return void(out += "{}");
    out += "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it, first = false) {
      if (!first) out += item_sep;
      newline(depth + 1);
      out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ": ";
      py_json(it.value(), out, indent, depth + 1);
    }
    newline(depth);
    out += "}";
  } else if (v.is_number_float()) {
    out += py_float(v.get<double>());
  } else {
    out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

bool truthy(const Value& v) {
  if (v.kind == Value::Undefined) return false;
  if (v.kind != Value::Json) return true;
  const json& j = v.j;
  switch (j.type()) {
    case json::value_t::null: return false;
    case json::value_t::boolean: return j.get<bool>();
    case json::value_t::string: return !j.get_ref<const std::string&>().empty();
    case json::value_t::array:
    case json::value_t::object: return !j.empty();
    case json::value_t::number_float: return j.get<double>() != 0.0;
    default: return j.get<long long>() != 0;
  }
}

/// The items a for loop (or a filter) walks: list items, dict keys, string characters (bytes of UTF-8 sequences kept
/// together), nothing for undefined / none.
std::vector<json> iterate(const Value& v) {
  std::vector<json> out;
  const json& d = v.data();
  if (d.is_array()) {
    for (const auto& e : d) out.push_back(e);
  } else if (d.is_object()) {
    for (auto it = d.begin(); it != d.end(); ++it) out.push_back(it.key());
  } else if (d.is_string()) {
    const std::string& s = d.get_ref<const std::string&>();
    for (size_t i = 0; i < s.size();) {
      size_t n = 1;
      const auto c = static_cast<unsigned char>(s[i]);
      if (c >= 0xF0) n = 4;
      else if (c >= 0xE0) n = 3;
      else if (c >= 0xC0) n = 2;
      out.push_back(s.substr(i, n));
      i += n;
    }
  } else if (!v.undefined() && !d.is_null()) {
    fail("template: {} is not iterable", py_repr(d));
  }
  return out;
}

struct BreakSignal {};
struct ContinueSignal {};

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t a = 0, b = s.size();
  auto is_strip = [&](char c) { return chars.empty() ? (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') : chars.find(c) != std::string::npos; };
  if (left)
    while (a < b && is_strip(s[a])) ++a;
  if (right)
    while (b > a && is_strip(s[b - 1])) --b;
  return s.substr(a, b - a);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

double num(const json& v, const char* what) {
  SSM_CHECK(v.is_number() || v.is_boolean(), "template: {} needs a number, got {}", what, py_repr(v));
  return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
}

json number_result(double d, bool integral) {
  if (integral) return static_cast<long long>(d);
  return d;
}

/// Renders one template call: scopes, output, macros.
class Renderer {
 public:
  explicit Renderer(const json& ctx) {
    scopes_.emplace_back();
    if (ctx.is_object())
      for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_.back()[it.key()] = Value::of(it.value());
  }

  void exec(const Body& body, std::string& out) {
    for (const auto& st : body) exec(*st, out);
  }

 private:
  void exec(const Stmt& st, std::string& out) {
    switch (st.kind) {
      case Stmt::Text: out += st.text; return;
      case Stmt::Output: out += py_str(eval(*st.expr)); return;
      case Stmt::If:
        for (const auto& [cond, body] : st.branches)
          if (truthy(eval(*cond))) return exec(body, out);
        return exec(st.else_body, out);
      case Stmt::For: return exec_for(st, out);
      case Stmt::Set: {
        Value v = eval(*st.expr);
        if (st.attr.empty()) return void(scopes_.back()[st.text] = std::move(v));
        Value* target = lookup(st.text);
        SSM_CHECK(target && target->kind == Value::Namespace, "template: cannot set {}.{}: {} is not a namespace", st.text, st.attr, st.text);
        (*target->ns)[st.attr] = v.data();
        return;
      }
      case Stmt::Break: throw BreakSignal{};
      case Stmt::Continue: throw ContinueSignal{};
      case Stmt::Macro: {
        Value m;
        m.kind = Value::Macro;
        m.macro = &st;
        scopes_.back()[st.text] = m;
        return;
      }
    }
  }

  void exec_for(const Stmt& st, std::string& out) {
    std::vector<json> items = iterate(eval(*st.expr));
    if (st.cond) {  // the inline filter sees each item bound to the loop variables
      std::vector<json> kept;
      for (auto& it : items) {
        scopes_.emplace_back();
        bind(st, it);
        if (truthy(eval(*st.cond))) kept.push_back(it);
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(st.else_body, out);
    const long long n = static_cast<long long>(items.size());
    for (long long i = 0; i < n; ++i) {
      scopes_.emplace_back();
      bind(st, items[static_cast<size_t>(i)]);
      json loop = {{"index", i + 1}, {"index0", i}, {"revindex", n - i}, {"revindex0", n - i - 1}, {"first", i == 0},
                   {"last", i == n - 1}, {"length", n}};
      loop["previtem"] = i > 0 ? items[static_cast<size_t>(i - 1)] : json(nullptr);
      loop["nextitem"] = i + 1 < n ? items[static_cast<size_t>(i + 1)] : json(nullptr);
      scopes_.back()["loop"] = Value::of(std::move(loop));
      bool stop = false;
      try {
        exec(st.body, out);
      } catch (const BreakSignal&) {
        stop = true;
      } catch (const ContinueSignal&) {
      }
      scopes_.pop_back();
      if (stop) break;
    }
  }

  void bind(const Stmt& st, const json& item) {
    if (st.vars.size() == 1) return void(scopes_.back()[st.vars[0]] = Value::of(item));
    SSM_CHECK(item.is_array() && item.size() == st.vars.size(), "template: cannot unpack {} into {} loop variables", py_repr(item),
              st.vars.size());
    for (size_t k = 0; k < st.vars.size(); ++k) scopes_.back()[st.vars[k]] = Value::of(item[k]);
  }

  Value* lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Literal: return Value::of(e.value);
      case Expr::Name: {
        Value* v = lookup(e.name);
        return v ? *v : Value{};
      }
      case Expr::List: {
        json a = json::array();
        for (const auto& x : e.args) a.push_back(eval(*x).data());
        return Value::of(std::move(a));
      }
      case Expr::Dict: {
        json o = json::object();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) o[py_str(eval(*e.args[k]))] = eval(*e.args[k + 1]).data();
        return Value::of(std::move(o));
      }
      case Expr::Attr: return subscript(eval(*e.args[0]), json(e.name));
      case Expr::Index: return subscript(eval(*e.args[0]), eval(*e.args[1]).data());
      case Expr::Slice: return slice(eval(*e.args[0]), e);
      case Expr::Call: return call(e);
      case Expr::Filter: return filter(e);
      case Expr::Test: {
        const bool r = test(e);
        return Value::of(e.negated ? !r : r);
      }
      case Expr::Unary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(v));
        const json& d = v.data();
        const double x = num(d, "unary -");
        return Value::of(number_result(e.name == "-" ? -x : x, d.is_number_integer()));
      }
      case Expr::Binary: return binary(e);
      case Expr::Cond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args.size() > 2 ? eval(*e.args[2]) : Value{};
    }
    return Value{};
  }

  Value subscript(const Value& obj, const json& key) {
    if (obj.kind == Value::Namespace) {
      auto it = obj.ns->find(key.is_string() ? key.get<std::string>() : py_str(Value::of(key)));
      return it == obj.ns->end() ? Value{} : Value::of(*it);
    }
    const json& d = obj.data();
    if (d.is_object() && key.is_string()) {
      auto it = d.find(key.get<std::string>());
      return it == d.end() ? Value{} : Value::of(*it);
    }
    if ((d.is_array() || d.is_string()) && key.is_number_integer()) {
      const std::vector<json> items = d.is_array() ? d.get<std::vector<json>>() : iterate(obj);
      long long i = key.get<long long>();
      if (i < 0) i += static_cast<long long>(items.size());
      if (i < 0 || i >= static_cast<long long>(items.size())) return Value{};
      return Value::of(items[static_cast<size_t>(i)]);
    }
    return Value{};
  }

  Value slice(const Value& obj, const Expr& e) {
    const json& d = obj.data();
    std::vector<json> items = d.is_array() ? d.get<std::vector<json>>() : iterate(obj);
    const long long n = static_cast<long long>(items.size());
    auto get = [&](int k, long long def) {
      if (!e.args[static_cast<size_t>(k)]) return def;
      return static_cast<long long>(num(eval(*e.args[static_cast<size_t>(k)]).data(), "slice"));
    };
    const long long step = get(3, 1);
    SSM_CHECK(step != 0, "template: slice step cannot be zero");
    auto clamp = [&](long long x, bool is_stop) {
      if (x < 0) x += n;
      if (step > 0) return std::clamp(x, 0LL, n);
      return std::clamp(x, -1LL, n - 1 + (is_stop ? 0 : 0));
    };
    long long start = e.args[1] ? clamp(get(1, 0), false) : (step > 0 ? 0 : n - 1);
    long long stop = e.args[2] ? clamp(get(2, 0), true) : (step > 0 ? n : -1);
    json out = json::array();
    std::string s;
    for (long long i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (d.is_string()) s += items[static_cast<size_t>(i)].get<std::string>();
      else out.push_back(items[static_cast<size_t>(i)]);
    }
    return d.is_string() ? Value::of(s) : Value::of(out);
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    const Value av = eval(*e.args[0]), bv = eval(*e.args[1]);
    const json &a = av.data(), &b = bv.data();
    if (op == "~") return Value::of(py_str(av) + py_str(bv));
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "in" || op == "not in") {
      bool r = false;
      if (b.is_string()) r = b.get_ref<const std::string&>().find(py_str(av)) != std::string::npos;
      else if (b.is_array()) r = std::any_of(b.begin(), b.end(), [&](const json& x) { return equal(x, a); });
      else if (b.is_object()) r = a.is_string() && b.contains(a.get<std::string>());
      return Value::of(op == "in" ? r : !r);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (a.is_string() && b.is_string()) c = a.get<std::string>().compare(b.get<std::string>());
      else {
        const double x = num(a, op.c_str()), y = num(b, op.c_str());
        c = x < y ? -1 : x > y ? 1 : 0;
      }
      return Value::of(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::of(a.get<std::string>() + b.get<std::string>());
      if (a.is_array() && b.is_array()) {
        json r = a;
        for (const auto& x : b) r.push_back(x);
        return Value::of(r);
      }
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      std::string r;
      for (long long i = 0; i < b.get<long long>(); ++i) r += a.get<std::string>();
      return Value::of(r);
    }
    const double x = num(a, op.c_str()), y = num(b, op.c_str());
    const bool ints = (a.is_number_integer() || a.is_boolean()) && (b.is_number_integer() || b.is_boolean());
    if (op == "+") return Value::of(number_result(x + y, ints));
    if (op == "-") return Value::of(number_result(x - y, ints));
    if (op == "*") return Value::of(number_result(x * y, ints));
    if (op == "**") return Value::of(number_result(std::pow(x, y), ints && y >= 0));
    SSM_CHECK(y != 0, "template: division by zero");
    if (op == "/") return Value::of(x / y);
    if (op == "//") return Value::of(number_result(std::floor(x / y), ints));
    if (op == "%") return Value::of(number_result(x - y * std::floor(x / y), ints));
    fail("template: unknown operator {}", op);
  }

  static bool equal(const json& a, const json& b) {
    if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
    return a == b;
  }

  std::vector<Value> args(const Expr& e, size_t first) {
    std::vector<Value> v;
    for (size_t k = first; k < e.args.size(); ++k) v.push_back(eval(*e.args[k]));
    return v;
  }
  Value kwarg(const Expr& e, const std::string& name, const std::vector<Value>& pos, size_t index, Value def = {}) {
    for (const auto& [k, x] : e.kwargs)
      if (k == name) return eval(*x);
    return index < pos.size() ? pos[index] : def;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> a = args(e, 1);
    if (callee.kind == Expr::Name) {
      const std::string& f = callee.name;
      if (Value* m = lookup(f); m && m->kind == Value::Macro) return call_macro(*m->macro, e, a);
      if (f == "raise_exception") fail("template raised an exception: {}", a.empty() ? "" : py_str(a[0]));
      if (f == "range") {
        long long start = 0, stop = 0, step = 1;
        if (a.size() == 1) stop = static_cast<long long>(num(a[0].data(), "range"));
        else if (a.size() >= 2) start = static_cast<long long>(num(a[0].data(), "range")), stop = static_cast<long long>(num(a[1].data(), "range"));
        if (a.size() >= 3) step = static_cast<long long>(num(a[2].data(), "range"));
        SSM_CHECK(step != 0, "template: range() step cannot be zero");
        json r = json::array();
        for (long long i = start; step > 0 ? i < stop : i > stop; i += step) {
          r.push_back(i);
          SSM_CHECK(r.size() <= 1000000, "template: range() too long");
        }
        return Value::of(r);
      }
      if (f == "namespace") {
        Value v;
        v.kind = Value::Namespace;
        v.ns = std::make_shared<json>(json::object());
        if (!a.empty() && a[0].data().is_object()) *v.ns = a[0].data();
        for (const auto& [k, x] : e.kwargs) (*v.ns)[k] = eval(*x).data();
        return v;
      }
      if (f == "dict") {
        json o = json::object();
        for (const auto& [k, x] : e.kwargs) o[k] = eval(*x).data();
        return Value::of(o);
      }
      if (f == "strftime_now") return Value::of(std::string(""));
      fail("template: unknown function {}()", f);
    }
    if (callee.kind == Expr::Attr) return method(eval(*callee.args[0]), callee.name, a, e);
    fail("template: this expression cannot be called");
  }

  Value call_macro(const Stmt& m, const Expr& e, const std::vector<Value>& a) {
    std::unordered_map<std::string, Value> frame;
    for (size_t k = 0; k < m.vars.size(); ++k) {
      Value v = k < a.size() ? a[k] : m.defaults[k] ? eval(*m.defaults[k]) : Value{};
      for (const auto& [name, x] : e.kwargs)
        if (name == m.vars[k]) v = eval(*x);
      frame[m.vars[k]] = v;
    }
    SSM_CHECK(++depth_ < 64, "template: macro recursion too deep");
    scopes_.push_back(std::move(frame));
    std::string out;
    exec(m.body, out);
    scopes_.pop_back();
    --depth_;
    return Value::of(out);
  }

  Value method(const Value& obj, const std::string& name, const std::vector<Value>& a, const Expr& e) {
    const json& d = obj.data();
    auto arg_str = [&](size_t i, const std::string& def = "") { return i < a.size() ? py_str(a[i]) : def; };
    if (d.is_string()) {
      const std::string& s = d.get_ref<const std::string&>();
      if (name == "strip") return Value::of(strip_chars(s, arg_str(0), true, true));
      if (name == "lstrip") return Value::of(strip_chars(s, arg_str(0), true, false));
      if (name == "rstrip") return Value::of(strip_chars(s, arg_str(0), false, true));
      if (name == "upper" || name == "lower") {
        std::string r = s;
        for (auto& c : r) c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
        return Value::of(r);
      }
      if (name == "startswith") return Value::of(s.rfind(arg_str(0), 0) == 0);
      if (name == "endswith") {
        const std::string x = arg_str(0);
        return Value::of(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
      }
      if (name == "replace") return Value::of(replace_all(s, arg_str(0), arg_str(1)));
      if (name == "split") {
        json r = json::array();
        const std::string sep = arg_str(0);
        if (sep.empty()) {
          std::string cur;
          for (char c : s) {
            if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
              if (!cur.empty()) r.push_back(cur), cur.clear();
            } else {
              cur += c;
            }
          }
          if (!cur.empty()) r.push_back(cur);
        } else {
          size_t p = 0;
          for (size_t q; (q = s.find(sep, p)) != std::string::npos; p = q + sep.size()) r.push_back(s.substr(p, q - p));
          r.push_back(s.substr(p));
        }
        return Value::of(r);
      }
      if (name == "title" || name == "capitalize") return filter_named(name, obj, {}, e);
      if (name == "format") {
        std::string r = s;
        for (const auto& x : a) {
          const size_t p = r.find("%s");
          if (p == std::string::npos) break;
          r.replace(p, 2, py_str(x));
        }
        return Value::of(r);
      }
    }
    if (d.is_object() || obj.kind == Value::Namespace) {
      if (name == "items") {
        json r = json::array();
        for (auto it = d.begin(); it != d.end(); ++it) r.push_back(json::array({it.key(), it.value()}));
        return Value::of(r);
      }
      if (name == "keys" || name == "values") {
        json r = json::array();
        for (auto it = d.begin(); it != d.end(); ++it) r.push_back(name == "keys" ? json(it.key()) : it.value());
        return Value::of(r);
      }
      if (name == "get") {
        auto it = d.find(arg_str(0));
        return it != d.end() ? Value::of(*it) : (a.size() > 1 ? a[1] : Value::of(nullptr));
      }
    }
    if (d.is_array() && name == "index") {
      for (size_t i = 0; i < d.size(); ++i)
        if (!a.empty() && equal(d[i], a[0].data())) return Value::of(static_cast<long long>(i));
      fail("template: value not in list");
    }
    fail("template: unknown method .{}() on {}", name, py_repr(d));
  }

  Value filter(const Expr& e) {
    Value x = eval(*e.args[0]);
    return filter_named(e.name, x, args(e, 1), e);
  }

  Value filter_named(const std::string& f, const Value& x, const std::vector<Value>& a, const Expr& e) {
    const json& d = x.data();
    if (f == "trim") return Value::of(strip_chars(py_str(x), a.empty() ? "" : py_str(a[0]), true, true));
    if (f == "upper" || f == "lower") return method(Value::of(py_str(x)), f, {}, e);
    if (f == "capitalize" || f == "title") {
      std::string s = py_str(x);
      bool start = true;
      for (auto& c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (f == "capitalize") c = static_cast<char>(start ? std::toupper(u) : std::tolower(u)), start = false;
        else c = static_cast<char>(start ? std::toupper(u) : std::tolower(u)), start = !std::isalnum(u);
      }
      return Value::of(s);
    }
    if (f == "length" || f == "count") {
      if (d.is_string()) return Value::of(static_cast<long long>(iterate(x).size()));
      return Value::of(static_cast<long long>(d.is_array() || d.is_object() ? d.size() : 0));
    }
    if (f == "tojson") {
      const Value ind = kwarg(e, "indent", a, 0, Value::of(nullptr));
      std::string out;
      py_json(d, out, ind.data().is_number() ? static_cast<int>(ind.data().get<double>()) : -1, 0);
      return Value::of(out);
    }
    if (f == "string") return Value::of(py_str(x));
    if (f == "safe" || f == "escape" || f == "e") return x;
    if (f == "default" || f == "d") {
      const bool boolean = a.size() > 1 && truthy(a[1]);
      if (x.undefined() || (boolean && !truthy(x))) return a.empty() ? Value::of(std::string("")) : a[0];
      return x;
    }
    if (f == "first" || f == "last") {
      std::vector<json> items = iterate(x);
      if (items.empty()) return Value{};
      return Value::of(f == "first" ? items.front() : items.back());
    }
    if (f == "join") {
      const std::string sep = a.empty() ? "" : py_str(a[0]);
      const Value attr = kwarg(e, "attribute", a, 1);
      std::string out;
      bool first = true;
      for (const auto& it : iterate(x)) {
        out += (first ? "" : sep) + py_str(attr.undefined() ? Value::of(it) : subscript(Value::of(it), attr.data()));
        first = false;
      }
      return Value::of(out);
    }
    if (f == "list") {
      json r = json::array();
      for (auto& it : iterate(x)) r.push_back(it);
      return Value::of(r);
    }
    if (f == "reverse") {
      if (d.is_string()) {
        std::vector<json> items = iterate(x);
        std::string s;
        for (auto it = items.rbegin(); it != items.rend(); ++it) s += it->get<std::string>();
        return Value::of(s);
      }
      json r = json::array();
      std::vector<json> items = iterate(x);
      for (auto it = items.rbegin(); it != items.rend(); ++it) r.push_back(*it);
      return Value::of(r);
    }
    if (f == "items") return method(x, "items", {}, e);
    if (f == "int") {
      if (d.is_string()) {
        try {
          return Value::of(std::stoll(d.get<std::string>()));
        } catch (const std::exception&) {
          return Value::of(0);
        }
      }
      return Value::of(d.is_number() || d.is_boolean() ? static_cast<long long>(num(d, "int")) : 0LL);
    }
    if (f == "float") return Value::of(d.is_number() ? d.get<double>() : 0.0);
    if (f == "abs") return Value::of(number_result(std::fabs(num(d, "abs")), d.is_number_integer()));
    if (f == "round") return Value::of(std::round(num(d, "round")));
    if (f == "replace") return Value::of(replace_all(py_str(x), a.size() > 0 ? py_str(a[0]) : "", a.size() > 1 ? py_str(a[1]) : ""));
    if (f == "indent") {
      const int width = a.empty() ? 4 : static_cast<int>(num(a[0].data(), "indent"));
      const std::string pad(static_cast<size_t>(std::max(0, width)), ' ');
      std::string s = py_str(x), out;
      for (size_t i = 0; i < s.size(); ++i) {
        out += s[i];
        if (s[i] == '\n' && i + 1 < s.size()) out += pad;
      }
      return Value::of(kwarg(e, "first", a, 1, Value::of(false)).data() == true ? pad + out : out);
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject" || f == "map") {
      json r = json::array();
      for (const auto& it : iterate(x)) {
        if (f == "map") {
          const Value attr = kwarg(e, "attribute", {}, 0);
          if (!attr.undefined()) r.push_back(subscript(Value::of(it), attr.data()).data());
          else if (!a.empty()) r.push_back(filter_named(py_str(a[0]), Value::of(it), {}, e).data());
          continue;
        }
        const bool attr_form = f == "selectattr" || f == "rejectattr";
        Value subject = attr_form ? subscript(Value::of(it), a.empty() ? json("") : a[0].data()) : Value::of(it);
        const size_t ti = attr_form ? 1 : 0;
        bool ok = ti < a.size() ? test_named(py_str(a[ti]), subject, std::vector<Value>(a.begin() + static_cast<long>(ti) + 1, a.end()))
                                : truthy(subject);
        if (f == "rejectattr" || f == "reject") ok = !ok;
        if (ok) r.push_back(it);
      }
      return Value::of(r);
    }
    if (f == "unique") {
      json r = json::array();
      for (const auto& it : iterate(x))
        if (std::none_of(r.begin(), r.end(), [&](const json& y) { return equal(y, it); })) r.push_back(it);
      return Value::of(r);
    }
    if (f == "sum") {
      double s = 0;
      bool ints = true;
      for (const auto& it : iterate(x)) s += num(it, "sum"), ints = ints && it.is_number_integer();
      return Value::of(number_result(s, ints));
    }
    if (f == "dictsort") {
      json r = json::array();
      for (auto it = d.begin(); d.is_object() && it != d.end(); ++it) r.push_back(json::array({it.key(), it.value()}));
      return Value::of(r);  // nlohmann objects iterate in key order already
    }
    fail("template: unknown filter '{}'", f);
  }

  bool test(const Expr& e) {
    Value x = eval(*e.args[0]);
    return test_named(e.name, x, args(e, 1));
  }

  bool test_named(const std::string& t, const Value& x, const std::vector<Value>& a) {
    const json& d = x.data();
    if (t == "defined") return !x.undefined();
    if (t == "undefined") return x.undefined();
    if (t == "none") return !x.undefined() && d.is_null();
    if (t == "string") return d.is_string();
    if (t == "number") return d.is_number();
    if (t == "integer") return d.is_number_integer();
    if (t == "float") return d.is_number_float();
    if (t == "boolean") return d.is_boolean();
    if (t == "true") return d.is_boolean() && d.get<bool>();
    if (t == "false") return d.is_boolean() && !d.get<bool>();
    if (t == "mapping") return d.is_object() || x.kind == Value::Namespace;
    if (t == "sequence" || t == "iterable") return d.is_array() || d.is_string() || d.is_object();
    if (t == "callable") return x.kind == Value::Macro;
    if (t == "even" || t == "odd") return d.is_number_integer() && (d.get<long long>() % 2 == 0) == (t == "even");
    if (t == "divisibleby") return d.is_number_integer() && !a.empty() && a[0].data().is_number_integer() && a[0].data().get<long long>() != 0 &&
                                   d.get<long long>() % a[0].data().get<long long>() == 0;
    if (t == "equalto" || t == "eq" || t == "sameas" || t == "==") return !a.empty() && equal(d, a[0].data());
    if (t == "ne" || t == "!=") return !a.empty() && !equal(d, a[0].data());
    if (t == "in") return !a.empty() && a[0].data().is_array() && std::any_of(a[0].data().begin(), a[0].data().end(), [&](const json& y) { return equal(y, d); });
    if (t == "lower") return d.is_string() && py_str(x) == method(x, "lower", {}, Expr(Expr::Literal)).data().get<std::string>();
    if (t == "upper") return d.is_string() && py_str(x) == method(x, "upper", {}, Expr(Expr::Literal)).data().get<std::string>();
    fail("template: unknown test '{}'", t);
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int depth_ = 0;
};

}  // namespace

struct Template::Impl {
  Body body;
};

Template::Template(std::string source) : source_(std::move(source)) {
  auto impl = std::make_shared<Impl>();
  impl->body = parse_template(source_);
  impl_ = std::move(impl);
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  Renderer r(context);
  std::string out;
  try {
    r.exec(impl_->body, out);
  } catch (const BreakSignal&) {
    fail("template: break outside a loop");
  } catch (const ContinueSignal&) {
    fail("template: continue outside a loop");
  } catch (const nlohmann::ordered_json::exception& e) {
    fail("template: {}", e.what());
  }
  return out;
}

}  // namespace ssmserve::server::jinja
