// Owns reading Hugging Face JSON files: the non-standard Infinity/NaN tokens, {"__float__": ...} objects, and
// error positions reported against the original text.
#include "config/hf_json.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

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

/// Replaces every recognizable {"__float__": "..."} object in `v` by a number, recursively (the recursion depth is
/// bounded by check_json_depth, which parse_hf_json runs first).
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
  check_json_depth(text, what);
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
    // nlohmann quotes the bytes it last read ("last read: '\xC3'"): a file that is not UTF-8 JSON (UTF-16, binary)
    // would put a stray or partial byte into the message, which Python cannot decode. Keep printable ASCII only.
    std::string printable;
    for (const char ch : msg) {
      const auto c = static_cast<unsigned char>(ch);
      if (c >= 0x20 && c < 0x7f) printable += ch;
      else printable += fmt::format("\\x{:02X}", c);
    }
    msg = std::move(printable);
    fail("{}: invalid JSON at byte {} (line {}, column {}): {}", what, pos, line, col, msg);
  }
  replace_float_objects(v);
  return v;
}

double json_float(const json& v, const std::string& field) {
  if (v.is_number()) return v.get<double>();
  double d = 0;
  if (is_float_object(v) && decode_float_string(v["__float__"].get<std::string>(), &d)) return d;
  fail("field \"{}\" must be a number (got {})", field, json_excerpt(v));
}

namespace {

namespace fs = std::filesystem;

/// What a non-regular file is, for "not a regular file" messages.
std::string file_kind(fs::file_type t) {
  switch (t) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::fifo: return "a fifo (named pipe)";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

std::string file_kind(mode_t m) {
  if (S_ISDIR(m)) return file_kind(fs::file_type::directory);
  if (S_ISCHR(m)) return file_kind(fs::file_type::character);
  if (S_ISBLK(m)) return file_kind(fs::file_type::block);
  if (S_ISFIFO(m)) return file_kind(fs::file_type::fifo);
  if (S_ISSOCK(m)) return file_kind(fs::file_type::socket);
  return file_kind(fs::file_type::unknown);
}

/// Closes a file descriptor on scope exit.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

/// Throws the Error for a path whose status could not be read (missing, dangling symlink, loop, ...).
[[noreturn]] void fail_status(const fs::path& path, const std::error_code& ec) {
  const std::string p = path.string();
  if (ec == std::errc::too_many_symbolic_link_levels)
    fail("{}: symlink loop (too many levels of symbolic links)", p);
  if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) {
    std::error_code lec;
    if (fs::is_symlink(fs::symlink_status(path, lec))) {
      std::error_code rec;
      const fs::path target = fs::read_symlink(path, rec);
      fail("{}: dangling symlink (its target {} does not exist)", p, rec ? std::string("?") : target.string());
    }
    fail("{}: file not found", p);
  }
  fail("{}: cannot access: {}", p, ec.message());
}

}  // namespace

bool path_entry_exists(const fs::path& path) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  return !ec && fs::exists(st);
}

std::string read_text_file(const fs::path& path, std::size_t max_bytes) {
  const std::string p = path.string();
  try {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st)) fail_status(path, ec ? ec : std::make_error_code(std::errc::no_such_file_or_directory));
    SSM_CHECK(fs::is_regular_file(st), "{}: is {}, not a regular file", p, file_kind(st.type()));
  } catch (const fs::filesystem_error& e) {
    fail("{}: cannot access: {}", p, e.code().message());
  }
  // O_NONBLOCK: should the path have been swapped for a fifo since the check, open must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP) fail("{}: symlink loop (too many levels of symbolic links)", p);
    fail("{}: cannot open for reading: {}", p, std::strerror(e));
  }
  const FdGuard guard{fd};
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) fail("{}: cannot stat: {}", p, std::strerror(errno));
  SSM_CHECK(S_ISREG(sb.st_mode), "{}: is {}, not a regular file", p, file_kind(sb.st_mode));
  SSM_CHECK(static_cast<std::uint64_t>(sb.st_size) <= max_bytes,
            "{}: file is {} bytes, larger than the {} byte limit for this file (corrupt or not the right file?)", p,
            static_cast<std::uint64_t>(sb.st_size), max_bytes);
  std::string out;
  out.resize(static_cast<std::size_t>(sb.st_size));
  std::size_t got = 0;
  // Read until EOF but never past max_bytes, in case the file grows (or st_size understates it, as in /proc).
  for (;;) {
    if (got == out.size()) {
      if (out.size() > max_bytes) break;
      out.resize(std::min<std::size_t>(max_bytes + 1, std::max<std::size_t>(out.size() * 2, 4096)));
    }
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("{}: read error: {}", p, std::strerror(errno));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  SSM_CHECK(got <= max_bytes, "{}: file is larger than the {} byte limit for this file (corrupt or not the right "
            "file?)", p, max_bytes);
  out.resize(got);
  return out;
}

namespace {

/// Calls f(i, c) for each byte c = text[i] outside JSON string literals (escapes skipped) until f returns false.
template <class F>
void for_each_structural_byte(std::string_view text, F&& f) {
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (!f(i, c)) {
      return;
    }
  }
}

}  // namespace

int json_nesting_depth(std::string_view text, int stop_above, std::size_t* where) {
  int depth = 0, deepest = 0;
  for_each_structural_byte(text, [&](std::size_t i, char c) {
    if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (depth > stop_above) {
        if (where) *where = i;
        return false;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;  // unbalanced input is left for the parser to report
    }
    return true;
  });
  return deepest;
}

std::size_t json_max_object_keys(std::string_view text, std::size_t stop_above, std::size_t* where) {
  std::vector<std::size_t> keys;  // per open bracket: the keys seen so far (arrays: unused)
  std::vector<bool> is_object;
  std::size_t most = 0;
  for_each_structural_byte(text, [&](std::size_t i, char c) {
    if (c == '{' || c == '[') {
      keys.push_back(0), is_object.push_back(c == '{');
    } else if ((c == '}' || c == ']') && !keys.empty()) {
      keys.pop_back(), is_object.pop_back();  // unbalanced input is left for the parser to report
    } else if (c == ':' && !keys.empty() && is_object.back()) {
      most = std::max(most, ++keys.back());
      if (most > stop_above) {
        if (where) *where = i;
        return false;
      }
    }
    return true;
  });
  return most;
}

void check_json_depth(std::string_view text, const std::string& what, int max_depth) {
  std::size_t at = 0;
  if (json_nesting_depth(text, max_depth, &at) > max_depth)
    fail("{}: JSON nests arrays/objects more than {} levels deep (at byte {}); refusing to parse it", what, max_depth,
         at);
}

namespace {

/// Appends a bounded rendering of `v` to `out`, stopping once `out` is longer than `limit`. Each nesting level
/// appends at least one character first, so the recursion depth is at most `limit` + 1.
void excerpt_into(const json& v, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  switch (v.type()) {
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
        if (!first) out += ',';
        first = false;
        excerpt_into(json(text_excerpt(it.key(), limit + 1)), out, limit);
        out += ':';
        excerpt_into(it.value(), out, limit);
      }
      out += '}';
      return;
    }
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
        if (!first) out += ',';
        first = false;
        excerpt_into(*it, out, limit);
      }
      out += ']';
      return;
    }
    case json::value_t::string: {
      const auto& s = v.get_ref<const std::string&>();
      const json cut = s.size() > limit + 1 ? json(s.substr(0, limit + 1)) : json();
      out += (cut.is_null() ? v : cut).dump(-1, ' ', false, json::error_handler_t::replace);
      return;
    }
    case json::value_t::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d > 0 ? "Infinity" : "-Infinity";
      else out += v.dump();
      return;
    }
    default:
      out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

}  // namespace

std::string text_excerpt(std::string_view s, std::size_t max_chars) {
  if (s.size() <= max_chars) return std::string(s);
  std::size_t cut = max_chars > 3 ? max_chars - 3 : 0;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // keep UTF-8 characters whole
  return std::string(s.substr(0, cut)) + "...";
}

std::string json_excerpt(const json& v, std::size_t max_chars) {
  std::string out;
  excerpt_into(v, out, max_chars);
  return text_excerpt(out, max_chars);
}

}  // namespace ssmserve
