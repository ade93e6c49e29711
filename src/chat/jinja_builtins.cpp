// Owns the built-in callables of ssmserve's Jinja engine: string / dict / list methods, filters and tests, with
// Python / Jinja2 semantics (see jinja_render.h); tojson matches transformers' (ensure_ascii=False, ", " / ": ").
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "chat/jinja_render.h"

namespace ssmserve::server::jinja {

Value Renderer::method(const Value& obj, const std::string& name, const std::vector<Value>& a, const Expr& e) {
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

Value Renderer::filter(const Expr& e) {
  Value x = eval(*e.args[0]);
  return filter_named(e.name, x, args(e, 1), e);
}

Value Renderer::filter_named(const std::string& f, const Value& x, const std::vector<Value>& a, const Expr& e) {
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
  if (f == "length" || f == "count") return Value::of(static_cast<long long>(item_count(x)));
  if (f == "list" || f == "reverse" || f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject" || f == "map" ||
      f == "unique" || f == "join" || f == "sum")  // lists built from a string's characters
    SSM_CHECK(item_count(x) <= kMaxListItems, "template: {} of {} items (the limit is {})", f, item_count(x), kMaxListItems);
  if (f == "tojson") {  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    JsonDumpOptions opt;
    opt.ensure_ascii = truthy(kwarg(e, "ensure_ascii", a, 0, Value::of(false)));
    const json ind = kwarg(e, "indent", a, 1, Value::of(nullptr)).data();
    SSM_CHECK(ind.is_null() || ind.is_number_integer(), "template: tojson indent must be an integer, got {}", py_repr(ind));
    if (ind.is_number_integer()) opt.indent = static_cast<int>(std::clamp(ind.get<long long>(), 0LL, 1000LL));
    const json sep = kwarg(e, "separators", a, 2, Value::of(nullptr)).data();
    if (!sep.is_null()) {
      SSM_CHECK(sep.is_array() && sep.size() == 2 && sep[0].is_string() && sep[1].is_string(),
                "template: tojson separators must be an (item_separator, key_separator) pair of strings, got {}", py_repr(sep));
      opt.item_sep = sep[0].get<std::string>(), opt.key_sep = sep[1].get<std::string>();
    }
    opt.sort_keys = truthy(kwarg(e, "sort_keys", a, 3, Value::of(false)));
    std::string out;
    py_json(d, out, opt);
    return Value::of(out);
  }
  if (f == "string") return Value::of(py_str(x));
  if (f == "escape" || f == "e" || f == "safe") {  // Markup: escaped once, however often |e is applied
    if (x.markup) return x;
    Value r = f == "safe" ? x : Value::of(html_escape(py_str(x)));
    r.markup = true;
    return r;
  }
  if (f == "default" || f == "d") {
    const bool boolean = a.size() > 1 && truthy(a[1]);
    if (x.undefined() || (boolean && !truthy(x))) return a.empty() ? Value::of(std::string("")) : a[0];
    return x;
  }
  if (f == "first" || f == "last") {
    if (d.is_array() || d.is_string()) return subscript(x, json(f == "first" ? 0 : -1));
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
      check_string_size(out.size());
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
    return Value::of(d.is_number() || d.is_boolean() ? to_int(d, "int") : 0LL);
  }
  if (f == "float") return Value::of(d.is_number() ? d.get<double>() : 0.0);
  if (f == "abs") return Value::of(number_result(std::fabs(num(d, "abs")), d.is_number_integer()));
  if (f == "round") return Value::of(std::round(num(d, "round")));
  if (f == "replace") return Value::of(replace_all(py_str(x), a.size() > 0 ? py_str(a[0]) : "", a.size() > 1 ? py_str(a[1]) : ""));
  if (f == "indent") {
    const long long width = a.empty() ? 4 : to_int(a[0].data(), "indent");
    check_string_size(static_cast<size_t>(std::max(0LL, width)));
    const std::string pad(static_cast<size_t>(std::max(0LL, width)), ' ');
    std::string s = py_str(x), out;
    for (size_t i = 0; i < s.size(); ++i) {
      out += s[i];
      if (s[i] == '\n' && i + 1 < s.size()) out += pad, check_string_size(out.size());
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
  if (f == "dictsort") {  // Jinja2's dictsort(value, case_sensitive=False, by='key', reverse=False); stable like sorted()
    const bool case_sensitive = truthy(kwarg(e, "case_sensitive", a, 0, Value::of(false)));
    const std::string by = py_str(kwarg(e, "by", a, 1, Value::of(std::string("key"))));
    SSM_CHECK(by == "key" || by == "value", "template: dictsort: you can only sort by either 'key' or 'value'");
    const bool reverse = truthy(kwarg(e, "reverse", a, 2, Value::of(false)));
    SSM_CHECK(d.is_object() || x.kind == Value::Namespace, "template: dictsort needs a dict, got {}", py_repr(d));
    std::vector<json> items;
    for (auto it = d.begin(); it != d.end(); ++it) items.push_back(json::array({it.key(), it.value()}));
    const size_t k = by == "key" ? 0 : 1;
    auto key = [&](const json& v) { return case_sensitive || !v.is_string() ? v : method(Value::of(v), "lower", {}, e).data(); };
    std::stable_sort(items.begin(), items.end(), [&](const json& p, const json& q) {
      return reverse ? py_less(key(q[k]), key(p[k])) : py_less(key(p[k]), key(q[k]));
    });
    return Value::of(json(items));
  }
  fail("template: unknown filter '{}'", f);
}

bool Renderer::test(const Expr& e) {
  Value x = eval(*e.args[0]);
  return test_named(e.name, x, args(e, 1));
}

bool Renderer::test_named(const std::string& t, const Value& x, const std::vector<Value>& a) {
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
  if (t == "callable") return as_macro(x) != nullptr;
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

}  // namespace ssmserve::server::jinja
