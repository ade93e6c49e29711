// Owns the Jinja lexer (see jinja_lex.h): splitting template source into segments, finding a tag's end past string
// literals and open brackets as Jinja2's lexer does, and tokenizing a tag's expression (names, numbers, strings,
// operators).
#include "chat/jinja_lex.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"

namespace ssmserve::server::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// The position of the tag's `close` ("}}" or "%}") from `body`, skipping string literals and closers met while a
/// bracket is open (as Jinja2's lexer does, so `{{ {'a': {'b': 1}} }}` and `{{ '}}' }}` work); npos if unclosed.
size_t find_tag_end(const std::string& src, size_t body, const char* close, int line) {
  std::string open;  // the open brackets' expected closers
  for (size_t i = body; i < src.size(); ++i) {
    const char c = src[i];
    if (open.empty() && src.compare(i, 2, close) == 0) return i;
    if (c == '\'' || c == '"') {
      for (++i; i < src.size() && src[i] != c; ++i)
        if (src[i] == '\\') ++i;
      if (i >= src.size()) return std::string::npos;
    } else if (c == '(' || c == '[' || c == '{') {
      SSM_CHECK(open.size() < kMaxNesting, "template line {}: template nesting too deep (more than {} levels)", line, kMaxNesting);
      open += c == '(' ? ')' : c == '[' ? ']' : '}';
    } else if (c == ')' || c == ']' || c == '}') {
      if (open.empty()) continue;  // the parser reports it
      SSM_CHECK(c == open.back(), "template line {}: unexpected '{}', expected '{}'", line, c, open.back());
      open.pop_back();
    }
  }
  return std::string::npos;
}

}  // namespace

std::vector<Segment> split_segments(const std::string& src) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, trim_newline = false;
  auto count_lines = [](const std::string& s, size_t a, size_t b) {
    int n = 0;
    for (size_t i = a; i < b && i < s.size(); ++i) n += s[i] == '\n';
    return n;
  };
  while (pos < src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(src, pos, open == std::string::npos ? src.size() : open);
    bool at_line_start = pos == 0 || src[pos - 1] == '\n';
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1), at_line_start = true;
    else if (trim_newline && text.rfind("\r\n", 0) == 0) text.erase(0, 2), at_line_start = true;
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    }
    strip_next = trim_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Segment::Text, text, text_line});
      break;
    }
    const char type = src[open + 1];
    const char* close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t body = open + 2;
    const bool strip_before = body < src.size() && src[body] == '-';
    const bool keep_before = body < src.size() && src[body] == '+';
    if (strip_before || keep_before) ++body;
    const size_t end = type == '#' ? src.find(close, body) : find_tag_end(src, body, close, line);
    SSM_CHECK(end != std::string::npos, "template line {}: unclosed '{{{}'", line, type);
    size_t content_end = end;
    if (content_end > body && src[content_end - 1] == '-') --content_end, strip_next = true;
    if (strip_before) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (type != '{' && !keep_before) {  // lstrip_blocks: spaces/tabs between a line start and a block tag
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      if (k > 0 ? text[k - 1] == '\n' : at_line_start) text.resize(k);
    }
    if (!text.empty()) out.push_back({Segment::Text, text, text_line});
    const int tag_line = line;
    line += count_lines(src, open, end + 2);
    if (type != '#') {
      std::string content = src.substr(body, content_end - body);
      out.push_back({type == '{' ? Segment::Expression : Segment::Statement, content, tag_line});
    }
    if (type != '{') trim_newline = !strip_next;  // trim_blocks
    pos = end + 2;
  }
  return out;
}

std::vector<Token> lex(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Name, s.substr(i, j - i), nullptr});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {  // exponent: 1e-7, 2.5E3 (a float, as in Jinja2)
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
        }
      }
      std::string num;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') num += s[k];
      try {
        if (is_float) out.push_back({Token::Float, num, std::strtod(num.c_str(), nullptr)});  // 1e999 = inf as in Python
        else out.push_back({Token::Int, num, std::stoll(num)});
      } catch (const std::exception&) {
        fail("template line {}: bad number '{}'", line, num);
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          v += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          v += s[j];
        }
      }
      SSM_CHECK(j < s.size(), "template line {}: unterminated string", line);
      out.push_back({Token::String, v, v});
      i = j + 1;
    } else {
      static const char* ops[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/", "%", "~", "|",
                                  ".",  ",",  ":",  "(",  ")",  "[", "]", "{", "}", "="};
      bool found = false;
      for (const char* op : ops) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(i, n, op) == 0) {
          out.push_back({Token::Op, op, nullptr});
          i += n;
          found = true;
          break;
        }
      }
      SSM_CHECK(found, "template line {}: unexpected character '{}'", line, c);
    }
  }
  out.push_back({Token::End, "", nullptr});
  return out;
}

}  // namespace ssmserve::server::jinja
