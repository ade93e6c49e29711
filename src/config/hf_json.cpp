// Owns reading Hugging Face JSON files: the non-standard Infinity/NaN tokens, {"__float__": ...} objects, and
// error positions reported against the original text.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "config/model_config.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::json;

/// Decodes a __float__ string ("Infinity", "-Infinity", "NaN", or a decimal number); false if unrecognized.
bool decode_float_string(const std::string& s, double* out) {
  if (s == "Infinity" || s == "+Infinity" || s == "inf" || s == "+inf") *out = std::numeric_limits<double>::infinity();
  else if (s == "-Infinity" || s == "-inf") *out = -std::numeric_limits<double>::infinity();
  else if (s == "NaN" || s == "nan" || s == "-NaN" || s == "-nan") *out = std::numeric_limits<double>::quiet_NaN();
  else {
    if (s.empty()) return false;
    char* end = nullptr;
    *out = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size();
  }
  return true;
}

bool is_float_object(const json& v) {
  return v.is_object() && v.size() == 1 && v.contains("__float__") && v["__float__"].is_string();
}

/// Replaces every recognizable {"__float__": "..."} object in `v` by a number, recursively.
void replace_float_objects(json& v) {
  double d = 0;
  if (is_float_object(v) && decode_float_string(v["__float__"].get<std::string>(), &d)) {
    v = d;
    return;
  }
  if (v.is_structured())
    for (auto& child : v) replace_float_objects(child);
}

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/// One rewrite: text [orig, orig + orig_len) became [out, out + out_len).
struct Edit {
  size_t orig, orig_len, out, out_len;
};

/// Rewrites bare Infinity / -Infinity / NaN tokens outside string literals as {"__float__": ...} objects.
std::string normalize_bare_tokens(std::string_view text, std::vector<Edit>* edits) {
  static constexpr std::string_view kTokens[] = {"-Infinity", "Infinity", "NaN"};
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) out += text[++i];
      else if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    if (i == 0 || !is_word_char(text[i - 1])) {
      for (const std::string_view tok : kTokens) {
        const size_t end = i + tok.size();
        if (text.substr(i, tok.size()) == tok && (end == text.size() || !is_word_char(text[end]))) {
          const std::string rep = "{\"__float__\":\"" + std::string(tok) + "\"}";
          edits->push_back({i, tok.size(), out.size(), rep.size()});
          out += rep;
          i = end;
          replaced = true;
          break;
        }
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

/// Maps a byte offset in the rewritten text back to the original text.
size_t original_offset(size_t pos, const std::vector<Edit>& edits) {
  long delta = 0;
  for (const Edit& e : edits) {
    if (pos < e.out) break;
    if (pos < e.out + e.out_len) return e.orig;  // inside a rewritten token
    delta += static_cast<long>(e.out_len) - static_cast<long>(e.orig_len);
  }
  return static_cast<size_t>(static_cast<long>(pos) - delta);
}

}  // namespace

json parse_hf_json(std::string_view text, const std::string& what) {
  std::vector<Edit> edits;
  const std::string normalized = normalize_bare_tokens(text, &edits);
  json v;
  try {
    v = json::parse(normalized);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based (the character that failed); report a 0-based offset plus line:column of the original.
    const size_t pos = std::min(original_offset(e.byte > 0 ? e.byte - 1 : 0, edits), text.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos; ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    std::string msg = e.what();
    if (const auto p = msg.find("syntax error"); p != std::string::npos) msg = msg.substr(p);
    fail("{}: invalid JSON at byte {} (line {}, column {}): {}", what, pos, line, col, msg);
  }
  replace_float_objects(v);
  return v;
}

double json_float(const json& v, const std::string& field) {
  if (v.is_number()) return v.get<double>();
  double d = 0;
  if (is_float_object(v) && decode_float_string(v["__float__"].get<std::string>(), &d)) return d;
  std::string shown = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  fail("field \"{}\" must be a number (got {})", field, shown);
}

std::string read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  SSM_CHECK(std::filesystem::is_regular_file(path, ec), "{}: file not found", path.string());
  std::ifstream in(path, std::ios::binary);
  SSM_CHECK(in.good(), "{}: cannot open for reading", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  SSM_CHECK(!in.bad(), "{}: read error", path.string());
  return ss.str();
}

}  // namespace ssmserve
