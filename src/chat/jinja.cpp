// Owns the Jinja evaluator's statements and expressions: renders parsed templates (jinja_ast.h) over JSON values
// with Python/Jinja2 semantics for the subset chat templates use: output, if/elif/else, for (loop.*, else, inline
// if, break/continue), set (incl. namespace attributes), macros, calls, raise_exception. Methods, filters and tests
// are in jinja_builtins.cpp; values render as Python's str() does (jinja_value.cpp: True, None, ['a', 1]).
#include "chat/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <new>
#include <string>

#include "core/error.h"
#include "chat/jinja_render.h"

namespace ssmserve::server::jinja {
namespace {

/// Deepest statement + expression nesting one render may reach (the parser bounds each template's nesting to 256
/// levels; recursive macros stack those up to 64 times). Past it rendering raises an Error, not a stack overflow.
constexpr int kMaxRenderDepth = 1024;

/// transformers' strftime_now(format): the local time now, as Python's datetime.now().strftime(format) (C locale)
/// gives it; chat templates put today's date in the system prompt with it (Granite 3, Llama 3.x, SmolLM3).
std::string strftime_now(const std::string& format) {
  SSM_CHECK(format.find('\0') == std::string::npos, "template: strftime_now() format has an embedded null character");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  SSM_CHECK(localtime_r(&now, &local) != nullptr, "template: strftime_now(): the local time is not available");
  // A trailing space tells an empty result from a buffer too small (std::strftime returns 0 for both).
  const std::string f = format + " ";
  for (size_t cap = 2 * f.size() + 64;; cap *= 4) {
    check_string_size(cap);
    std::string out(cap, '\0');
    if (const size_t n = std::strftime(out.data(), out.size(), f.c_str(), &local); n > 0) {
      out.resize(n - 1);
      return out;
    }
  }
}

/// Indexable items of a list or a string (a string's characters as iterate() splits them) without copying a list or
/// building one JSON string per character: subscripts and slices of long message contents stay cheap.
class Sequence {
 public:
  explicit Sequence(const json& d) : d_(d) {
    if (!d.is_string()) return;
    const std::string& s = d.get_ref<const std::string&>();
    if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return;
    for (size_t i = 0; i < s.size();) {  // UTF-8 sequences by their lead byte, as iterate() does
      offsets_.push_back(static_cast<uint32_t>(i));
      const auto c = static_cast<unsigned char>(s[i]);
      i += c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    }
    offsets_.push_back(static_cast<uint32_t>(s.size()));
  }
  long long size() const {
    if (!d_.is_string()) return static_cast<long long>(d_.size());
    return static_cast<long long>(offsets_.empty() ? d_.get_ref<const std::string&>().size() : offsets_.size() - 1);
  }
  /// Item k (0 <= k < size()): a list element or a one-character string.
  json at(long long k) const {
    const auto i = static_cast<size_t>(k);
    if (!d_.is_string()) return d_[i];
    const std::string& s = d_.get_ref<const std::string&>();
    if (offsets_.empty()) return s.substr(i, 1);
    return s.substr(offsets_[i], std::min<size_t>(offsets_[i + 1], s.size()) - offsets_[i]);
  }

 private:
  const json& d_;
  std::vector<uint32_t> offsets_;  // non-ASCII strings: byte offset of each character, then the size
};

}  // namespace

Renderer::Renderer(const json& ctx) {
  scopes_.emplace_back();
  if (ctx.is_object())
    for (auto it = ctx.begin(); it != ctx.end(); ++it) scopes_.back()[it.key()] = Value::of(it.value());
}

void Renderer::exec(const Body& body, std::string& out) {
  for (const auto& st : body) exec(*st, out);
}

void Renderer::exec(const Stmt& st, std::string& out) {
  DepthGuard guard(render_depth_, kMaxRenderDepth, -1);
  switch (st.kind) {
    case Stmt::Text: out += st.text; return check_string_size(out.size());
    case Stmt::Output: out += py_str(eval(*st.expr)); return check_string_size(out.size());
    case Stmt::If:
      for (const auto& [cond, body] : st.branches)
        if (truthy(eval(*cond))) return exec(body, out);
      return exec(st.else_body, out);
    case Stmt::For: return exec_for(st, out);
    case Stmt::Set: {
      Value v = eval(*st.expr);
      check_stored_data(v.data());  // stored values are what a loop could wrap without bound
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
      m.j = json::object({{kMacroMarker, macros_.size()}});
      macros_.push_back(&st);
      scopes_.back()[st.text] = m;
      return;
    }
  }
}

void Renderer::exec_for(const Stmt& st, std::string& out) {
  const Value iterable = eval(*st.expr);
  loop_iterations_ += static_cast<long long>(item_count(iterable));  // before building the items
  SSM_CHECK(loop_iterations_ <= kMaxLoopIterations, "template: too many loop iterations (more than {})", kMaxLoopIterations);
  std::vector<json> items = iterate(iterable);
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

void Renderer::bind(const Stmt& st, const json& item) {
  if (st.vars.size() == 1) return void(scopes_.back()[st.vars[0]] = Value::of(item));
  SSM_CHECK(item.is_array() && item.size() == st.vars.size(), "template: cannot unpack {} into {} loop variables", py_repr(item),
            st.vars.size());
  for (size_t k = 0; k < st.vars.size(); ++k) scopes_.back()[st.vars[k]] = Value::of(item[k]);
}

Value* Renderer::lookup(const std::string& name) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return &f->second;
  }
  return nullptr;
}

Value Renderer::eval(const Expr& e) {
  DepthGuard guard(render_depth_, kMaxRenderDepth, -1);
  switch (e.kind) {
    case Expr::Literal: return Value::of(e.value);
    case Expr::Name: {
      Value* v = lookup(e.name);
      return v ? *v : Value{};
    }
    case Expr::List:
    case Expr::Tuple: {
      json a = json::array();
      size_t bytes = 64;  // charged as it grows (kMaxDataBytes): `[x, x, x, ...]` copies x each time
      for (const auto& x : e.args) {
        Value item = eval(*x);
        check_data_size(bytes += data_bytes(item.data()));
        a.push_back(item.data());
      }
      Value v = Value::of(std::move(a));
      v.tuple = e.kind == Expr::Tuple;
      return v;
    }
    case Expr::Dict: {
      json o = json::object();
      size_t bytes = 64;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        std::string key = py_str(eval(*e.args[k]));
        Value item = eval(*e.args[k + 1]);
        check_data_size(bytes += key.size() + data_bytes(item.data()));
        o[std::move(key)] = item.data();
      }
      return Value::of(std::move(o));
    }
    case Expr::Attr:
    case Expr::Index: {
      // Jinja2's Undefined raises on any attribute or item access (`knobs.is_set` with no knobs); a missing
      // attribute of a defined value is undefined without an error.
      const Value obj = eval(*e.args[0]);
      if (obj.undefined()) {
        const Expr& o = *e.args[0];
        if (o.kind == Expr::Name) fail("template: '{}' is undefined", o.name);
        fail("template: cannot read {} of an undefined value", e.kind == Expr::Attr ? "attribute '" + e.name + "'" : "an item");
      }
      return subscript(obj, e.kind == Expr::Attr ? json(e.name) : eval(*e.args[1]).data());
    }
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
      SSM_CHECK(e.name != "*", "template: *{} is only allowed as a call argument", "args");
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

Value Renderer::subscript(const Value& obj, const json& key) {
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
    const Sequence items(d);
    long long i = key.get<long long>();
    if (i < 0) i += items.size();
    if (i < 0 || i >= items.size()) return Value{};
    return Value::of(items.at(i));
  }
  return Value{};
}

Value Renderer::slice(const Value& obj, const Expr& e) {
  const json& d = obj.data();
  const json keys = d.is_array() || d.is_string() ? json() : json(iterate(obj));  // dict keys; nothing for undefined
  const Sequence items(d.is_array() || d.is_string() ? d : keys);
  const long long n = items.size();
  auto get = [&](int k, long long def) {
    if (!e.args[static_cast<size_t>(k)]) return def;
    return to_int(eval(*e.args[static_cast<size_t>(k)]).data(), "slice");
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
    if (d.is_string()) s += items.at(i).get<std::string>();
    else out.push_back(items.at(i));
  }
  return d.is_string() ? Value::of(s) : Value::of(out);
}

Value Renderer::binary(const Expr& e) {
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
  if (op == "~") {
    std::string s = py_str(av);
    const std::string t = py_str(bv);
    check_string_size(s.size() + t.size());
    return Value::of(s + t);
  }
  const bool same_kind = av.tuple == bv.tuple || !a.is_array() || !b.is_array();  // (1, 2) != [1, 2]
  if (op == "==") return Value::of(same_kind && equal(a, b));
  if (op == "!=") return Value::of(!(same_kind && equal(a, b)));
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
    if (a.is_string() && b.is_string()) {
      check_string_size(a.get_ref<const std::string&>().size() + b.get_ref<const std::string&>().size());
      return Value::of(a.get<std::string>() + b.get<std::string>());
    }
    if (a.is_array() && b.is_array()) {
      SSM_CHECK(a.size() + b.size() <= kMaxListItems, "template: list too long (more than {} items)", kMaxListItems);
      check_data_size(data_bytes(a) + data_bytes(b));
      json r = a;
      for (const auto& x : b) r.push_back(x);
      return Value::of(r);
    }
  }
  if (op == "*" && a.is_string() && b.is_number_integer()) {
    const std::string& s = a.get_ref<const std::string&>();
    const long long n = std::max(0LL, b.get<long long>());
    if (s.empty() || n == 0) return Value::of(std::string());
    SSM_CHECK(static_cast<double>(n) * static_cast<double>(s.size()) <= static_cast<double>(kMaxStringBytes),
              "template: string too long ({} * {} bytes; the limit is {} MiB)", n, s.size(), kMaxStringBytes >> 20);
    const size_t total = static_cast<size_t>(n) * s.size();
    std::string r = s;
    while (r.size() < total) r.append(r, 0, std::min(r.size(), total - r.size()));  // doubling
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

bool Renderer::equal(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

std::vector<Value> Renderer::args(const Expr& e, size_t first) {
  std::vector<Value> v;
  for (size_t k = first; k < e.args.size(); ++k) {
    const Expr& x = *e.args[k];
    if (x.kind == Expr::Unary && x.name == "*") {  // f(*items): the items as positional arguments
      const Value items = eval(*x.args[0]);
      SSM_CHECK(!items.undefined() && !items.data().is_null(), "template: argument after * must be an iterable");
      for (json& item : iterate(items)) v.push_back(Value::of(std::move(item)));
      SSM_CHECK(v.size() <= kMaxListItems, "template: too many call arguments");
      continue;
    }
    v.push_back(eval(x));
  }
  return v;
}

const Stmt* Renderer::as_macro(const Value& v) const {
  if (v.kind == Value::Macro) return v.macro;
  const json& d = v.data();
  if (!d.is_object() || d.size() != 1) return nullptr;
  const auto it = d.find(kMacroMarker);
  if (it == d.end() || !it->is_number_unsigned() || it->get<size_t>() >= macros_.size()) return nullptr;
  return macros_[it->get<size_t>()];
}

Value Renderer::kwarg(const Expr& e, const std::string& name, const std::vector<Value>& pos, size_t index, Value def) {
  for (const auto& [k, x] : e.kwargs)
    if (k == name) return eval(*x);
  return index < pos.size() ? pos[index] : def;
}

Value Renderer::call(const Expr& e) {
  const Expr& callee = *e.args[0];
  std::vector<Value> a = args(e, 1);
  if (callee.kind == Expr::Name) {
    const std::string& f = callee.name;
    if (Value* m = lookup(f); m && m->kind == Value::Macro) return call_macro(*m->macro, e, a);
    if (f == "raise_exception") fail("template raised an exception: {}", a.empty() ? "" : py_str(a[0]));
    if (f == "range") {
      long long start = 0, stop = 0, step = 1;
      if (a.size() == 1) stop = to_int(a[0].data(), "range");
      else if (a.size() >= 2) start = to_int(a[0].data(), "range"), stop = to_int(a[1].data(), "range");
      if (a.size() >= 3) step = to_int(a[2].data(), "range");
      SSM_CHECK(step != 0, "template: range() step cannot be zero");
      json r = json::array();
      for (long long i = start; step > 0 ? i < stop : i > stop; i += step) {
        r.push_back(i);
        SSM_CHECK(r.size() <= 100000, "template: range() too big: the sandbox allows at most 100000 items (Jinja2's MAX_RANGE)");
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
    if (f == "strftime_now") {
      SSM_CHECK(a.size() == 1 && a[0].data().is_string(), "template: strftime_now() takes one format string");
      return Value::of(strftime_now(a[0].data().get<std::string>()));
    }
    fail("template: unknown function {}()", f);
  }
  if (callee.kind == Expr::Attr) return method(eval(*callee.args[0]), callee.name, a, e);
  if (const Stmt* m = as_macro(eval(callee))) return call_macro(*m, e, a);  // macros[i](...)
  fail("template: this expression cannot be called");
}

Value Renderer::call_macro(const Stmt& m, const Expr& e, const std::vector<Value>& a) {
  std::unordered_map<std::string, Value> frame;
  for (size_t k = 0; k < m.vars.size(); ++k) {
    Value v = k < a.size() ? a[k] : m.defaults[k] ? eval(*m.defaults[k]) : Value{};
    for (const auto& [name, x] : e.kwargs)
      if (name == m.vars[k]) v = eval(*x);
    check_stored_data(v.data());  // a recursive macro could wrap its argument at each call
    frame[m.vars[k]] = v;
  }
  SSM_CHECK(++depth_ < 64, "template: macro recursion too deep");
  scopes_.push_back(std::move(frame));
  std::string out;
  try {
    exec(m.body, out);
  } catch (const BreakSignal&) {
    fail("template: break outside a loop (in macro {})", m.text);
  } catch (const ContinueSignal&) {
    fail("template: continue outside a loop (in macro {})", m.text);
  }
  scopes_.pop_back();
  --depth_;
  return Value::of(out);
}

struct Template::Impl {
  Body body;
};

Template::Template(std::string source) : source_(std::move(source)) {
  auto impl = std::make_shared<Impl>();
  impl->body = parse_template(source_);
  impl_ = std::move(impl);
}

const Body& Template::statements() const { return impl_->body; }

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
  } catch (const std::bad_alloc&) {  // past the bounds above: the process's memory, not the template's, ran out
    fail("template: out of memory while rendering");
  }
  return out;
}

}  // namespace ssmserve::server::jinja
