// Owns the Python value semantics of ssmserve's Jinja engine (see jinja_value.h).
#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ssmserve::server::jinja {

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
  if (v.tuple && d.is_array()) {  // Python's tuple repr: (), (1,), (1, 2)
    std::string s = "(";
    for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + py_repr(d[i]);
    return s + (d.size() == 1 ? ",)" : ")");
  }
  return py_repr(d);
}

/// json.dumps(v, ...) with Python's formatting.
void py_json(const json& v, std::string& out, const JsonDumpOptions& opt, int depth) {
  const int indent = opt.indent;
  auto newline = [&](int d) {
    if (indent >= 0) out.append(1, '\n').append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  const std::string item_sep = !opt.item_sep.empty() ? opt.item_sep : indent >= 0 ? "," : ", ";
  const std::string key_sep = !opt.key_sep.empty() ? opt.key_sep : ": ";
  auto scalar = [&](const json& x) { return x.dump(-1, ' ', opt.ensure_ascii, json::error_handler_t::replace); };
  if (v.is_array()) {
    if (v.empty()) return void(out += "[]");
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += item_sep;
      newline(depth + 1);
      py_json(v[i], out, opt, depth + 1);
    }
    newline(depth);
    out += "]";
  } else if (v.is_object()) {
    if (v.empty()) return void(out += "{}");
    out += "{";
    std::vector<json::const_iterator> items;
    for (auto it = v.begin(); it != v.end(); ++it) items.push_back(it);
    if (opt.sort_keys)  // UTF-8 byte order is code point order
      std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.key() < b.key(); });
    bool first = true;
    for (const auto& it : items) {
      if (!first) out += item_sep;
      first = false;
      newline(depth + 1);
      out += scalar(json(it.key())) + key_sep;
      py_json(it.value(), out, opt, depth + 1);
    }
    newline(depth);
    out += "}";
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float(d);
  } else {
    out += scalar(v);
  }
}

bool py_less(const json& a, const json& b) {
  const bool an = a.is_number() || a.is_boolean(), bn = b.is_number() || b.is_boolean();
  if (an && bn) {
    if (a.is_number_integer() && b.is_number_integer()) return a.get<long long>() < b.get<long long>();
    return num(a, "<") < num(b, "<");
  }
  if (a.is_string() && b.is_string()) return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (py_less(a[i], b[i])) return true;
      if (py_less(b[i], a[i])) return false;
    }
    return a.size() < b.size();
  }
  fail("template: '<' not supported between {} and {}", py_repr(a), py_repr(b));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
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

size_t item_count(const Value& v) {
  const json& d = v.data();
  if (d.is_array() || d.is_object()) return d.size();
  if (!d.is_string()) return 0;
  size_t n = 0;
  for (const char c : d.get_ref<const std::string&>()) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // lead bytes
  return n;
}

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
  std::string out;
  size_t p = 0;
  for (size_t q; (q = s.find(from, p)) != std::string::npos; p = q + from.size()) {
    out.append(s, p, q - p).append(to);
    check_string_size(out.size());
  }
  return out.append(s, p);
}

double num(const json& v, const char* what) {
  SSM_CHECK(v.is_number() || v.is_boolean(), "template: {} needs a number, got {}", what, py_repr(v));
  return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>();
}

json number_result(double d, bool integral) {
  if (integral) {
    SSM_CHECK(std::fabs(d) < 9.2e18, "template: integer result {} out of range", py_float(d));
    return static_cast<long long>(d);
  }
  return d;
}

long long to_int(const json& v, const char* what) {
  if (v.is_number_integer()) {
    const long long x = v.get<long long>();
    SSM_CHECK(x >= -(1LL << 53) && x <= (1LL << 53), "template: {} argument {} out of range", what, x);
    return x;
  }
  const double d = num(v, what);
  SSM_CHECK(std::isfinite(d) && std::fabs(d) <= 9007199254740992.0, "template: {} argument {} out of range", what, py_float(d));
  return static_cast<long long>(d);
}

void check_string_size(size_t bytes) {
  SSM_CHECK(bytes <= kMaxStringBytes, "template: string too long ({} bytes; the limit is {} MiB)", bytes, kMaxStringBytes >> 20);
}

namespace {
/// What one JSON value is charged against kMaxDataBytes by itself (its children are charged on their own): 64 bytes,
/// plus a string's bytes or an object's key bytes.
size_t own_bytes(const json& p) {
  size_t bytes = 64;
  if (p.is_string()) bytes += p.get_ref<const std::string&>().size();
  if (p.is_object())
    for (auto it = p.begin(); it != p.end(); ++it) bytes += it.key().size();
  return bytes;
}
}  // namespace

size_t data_bytes(const json& v, size_t limit) {
  size_t bytes = 0;
  std::vector<const json*> todo{&v};
  while (!todo.empty() && bytes <= limit) {
    const json* p = todo.back();
    todo.pop_back();
    bytes += own_bytes(*p);
    if (p->is_structured())
      for (const auto& c : *p) todo.push_back(&c);
  }
  return bytes;
}

void check_data_size(size_t bytes) {
  SSM_CHECK(bytes <= kMaxDataBytes, "template: value too large (more than {} MiB of lists, dicts and strings)",
            kMaxDataBytes >> 20);
}

void check_stored_data(const json& v) {
  size_t bytes = 0;  // one walk for both bounds
  std::vector<std::pair<const json*, int>> todo{{&v, 1}};
  while (!todo.empty()) {
    const auto [p, d] = todo.back();
    todo.pop_back();
    SSM_CHECK(d <= kMaxDataDepth, "template: value nested too deep (more than {} levels)", kMaxDataDepth);
    check_data_size(bytes += own_bytes(*p));
    if (p->is_structured())
      for (const auto& c : *p) todo.emplace_back(&c, d + 1);
  }
}

}  // namespace ssmserve::server::jinja
