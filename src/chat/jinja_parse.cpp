// Owns the Jinja lexer and parser: template source -> statements (jinja_ast.h). Follows Jinja2's grammar and
// operator precedence for the subset chat templates use.
#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "chat/jinja_ast.h"

namespace ssmserve::server::jinja {
namespace {

/// One piece of the template: literal text, {{ expression }} or {% statement %}.
struct Segment {
  enum Kind { Text, Expression, Statement } kind;
  std::string content;
  int line;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// Deepest nesting the parser accepts (brackets, unary operators, conditionals, expression tree height, block
/// statements); deeper templates raise an Error instead of overflowing the stack while parsing or rendering.
constexpr int kMaxNesting = 256;

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

/// Splits the source into segments, applying -/+ whitespace control, trim_blocks and lstrip_blocks.
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

/// Expression tokens.
struct Token {
  enum Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;
  nlohmann::json value;
};

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

/// Recursive-descent expression parser over one tag's tokens (Jinja2's precedence levels). Recursion depth and the
/// height of the built tree are both bounded by kMaxNesting (the renderer and the tree's destructor recurse on it).
class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, int line) : t_(std::move(toks)), line_(line) {}

  ExprPtr expression() { return conditional(); }
  bool at_end() const { return t_[i_].kind == Token::End; }
  bool peek_name(const char* n) const { return t_[i_].kind == Token::Name && t_[i_].text == n; }
  bool peek_op(const char* o) const { return t_[i_].kind == Token::Op && t_[i_].text == o; }
  void expect_op(const char* o) {
    SSM_CHECK(peek_op(o), "template line {}: expected '{}' but found '{}'", line_, o, t_[i_].text);
    ++i_;
  }
  void expect_name(const char* n) {
    SSM_CHECK(peek_name(n), "template line {}: expected '{}' but found '{}'", line_, n, t_[i_].text);
    ++i_;
  }
  std::string name() {
    SSM_CHECK(t_[i_].kind == Token::Name, "template line {}: expected a name but found '{}'", line_, t_[i_].text);
    return t_[i_++].text;
  }
  void expect_end() { SSM_CHECK(at_end(), "template line {}: unexpected '{}'", line_, t_[i_].text); }
  bool accept_op(const char* o) {
    if (!peek_op(o)) return false;
    ++i_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!peek_name(n)) return false;
    ++i_;
    return true;
  }
  /// An expression without a top-level "x if c else y" (for-loop iterables followed by "if").
  ExprPtr or_expr() {
    ExprPtr a = and_expr();
    while (accept_name("or")) a = binary("or", std::move(a), and_expr());
    return a;
  }

 private:
  /// Finishes a node: its height is one more than its tallest operand's; throws Error past kMaxNesting.
  ExprPtr sealed(ExprPtr e) {
    int h = 0;
    for (const auto& a : e->args)
      if (a) h = std::max(h, a->height);
    for (const auto& kv : e->kwargs) h = std::max(h, kv.second->height);
    e->height = h + 1;
    SSM_CHECK(e->height <= kMaxNesting, "template line {}: template nesting too deep (more than {} levels)", line_, kMaxNesting);
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = std::make_unique<Expr>(Expr::Binary);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return sealed(std::move(e));
  }
  ExprPtr conditional() {
    DepthGuard g(depth_, kMaxNesting, line_);
    ExprPtr a = or_expr();
    if (accept_name("if")) {
      auto e = std::make_unique<Expr>(Expr::Cond);
      e->args.push_back(or_expr());  // condition
      e->args.push_back(std::move(a));
      if (accept_name("else")) e->args.push_back(conditional());
      return sealed(std::move(e));
    }
    return a;
  }
  ExprPtr and_expr() {
    ExprPtr a = not_expr();
    while (accept_name("and")) a = binary("and", std::move(a), not_expr());
    return a;
  }
  ExprPtr not_expr() {
    if (accept_name("not")) {
      DepthGuard g(depth_, kMaxNesting, line_);
      auto e = std::make_unique<Expr>(Expr::Unary);
      e->name = "not";
      e->args.push_back(not_expr());
      return sealed(std::move(e));
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr a = concat();
    while (true) {
      std::string op;
      for (const char* o : {"==", "!=", "<=", ">=", "<", ">"})
        if (peek_op(o)) op = o;
      if (!op.empty()) {
        ++i_;
      } else if (peek_name("in")) {
        ++i_;
        op = "in";
      } else if (peek_name("not") && t_[i_ + 1].kind == Token::Name && t_[i_ + 1].text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        return a;
      }
      a = binary(op, std::move(a), concat());
    }
  }
  ExprPtr concat() {
    ExprPtr a = additive();
    while (accept_op("~")) a = binary("~", std::move(a), additive());
    return a;
  }
  ExprPtr additive() {
    ExprPtr a = multiplicative();
    while (peek_op("+") || peek_op("-")) {
      const std::string op = t_[i_++].text;
      a = binary(op, std::move(a), multiplicative());
    }
    return a;
  }
  ExprPtr multiplicative() {
    ExprPtr a = power();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      const std::string op = t_[i_++].text;
      a = binary(op, std::move(a), power());
    }
    return a;
  }
  ExprPtr power() {
    ExprPtr a = unary();
    while (accept_op("**")) a = binary("**", std::move(a), unary());
    return a;
  }
  ExprPtr unary() {
    if (peek_op("-") || peek_op("+")) {
      DepthGuard g(depth_, kMaxNesting, line_);
      auto e = std::make_unique<Expr>(Expr::Unary);
      e->name = t_[i_++].text;
      e->args.push_back(unary());
      return sealed(std::move(e));
    }
    return postfix(primary());
  }
  void call_args(Expr& e) {
    // after "(": positional and keyword arguments up to ")"
    while (!accept_op(")")) {
      if (t_[i_].kind == Token::Name && t_[i_ + 1].kind == Token::Op && t_[i_ + 1].text == "=") {
        std::string k = t_[i_].text;
        i_ += 2;
        e.kwargs.emplace_back(std::move(k), expression());
      } else if (accept_op("*")) {  // f(*items)
        auto splat = std::make_unique<Expr>(Expr::Unary);
        splat->name = "*";
        splat->args.push_back(expression());
        e.args.push_back(sealed(std::move(splat)));
      } else {
        e.args.push_back(expression());
      }
      if (!peek_op(")")) expect_op(",");
    }
  }
  ExprPtr postfix(ExprPtr a) {
    while (true) {
      if (accept_op(".")) {
        auto e = std::make_unique<Expr>(Expr::Attr);
        e->name = name();
        e->args.push_back(std::move(a));
        a = sealed(std::move(e));
      } else if (accept_op("[")) {
        ExprPtr parts[3];
        int colons = 0;
        while (!peek_op("]")) {
          if (accept_op(":")) {
            SSM_CHECK(++colons <= 2, "template line {}: bad slice", line_);
            continue;
          }
          parts[colons] = expression();
        }
        expect_op("]");
        auto e = std::make_unique<Expr>(colons ? Expr::Slice : Expr::Index);
        e->args.push_back(std::move(a));
        SSM_CHECK(colons || parts[0], "template line {}: empty subscript", line_);
        for (int k = 0; k < (colons ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
        a = sealed(std::move(e));
      } else if (accept_op("(")) {
        auto e = std::make_unique<Expr>(Expr::Call);
        e->args.push_back(std::move(a));  // callee first
        call_args(*e);
        a = sealed(std::move(e));
      } else if (accept_op("|")) {
        auto e = std::make_unique<Expr>(Expr::Filter);
        e->name = name();
        e->args.push_back(std::move(a));
        if (accept_op("(")) call_args(*e);
        a = sealed(std::move(e));
      } else if (accept_name("is")) {
        auto e = std::make_unique<Expr>(Expr::Test);
        e->negated = accept_name("not");
        e->name = name();
        e->args.push_back(std::move(a));
        if (accept_op("(")) {
          call_args(*e);
        } else if (t_[i_].kind == Token::String || t_[i_].kind == Token::Int || t_[i_].kind == Token::Float ||
                   (t_[i_].kind == Token::Name && !peek_name("and") && !peek_name("or") && !peek_name("else") && !peek_name("if"))) {
          e->args.push_back(primary());  // "is divisibleby 3", "is equalto x"
        }
        a = sealed(std::move(e));
      } else {
        return a;
      }
    }
  }
  ExprPtr primary() {
    const Token& t = t_[i_];
    if (t.kind == Token::String || t.kind == Token::Int || t.kind == Token::Float) {
      auto e = std::make_unique<Expr>(Expr::Literal);
      e->value = t.value;
      ++i_;
      while (t.kind == Token::String && t_[i_].kind == Token::String) e->value = e->value.get<std::string>() + t_[i_++].text;  // "a" "b"
      return e;
    }
    if (t.kind == Token::Name) {
      ++i_;
      auto e = std::make_unique<Expr>(Expr::Literal);
      if (t.text == "true" || t.text == "True") e->value = true;
      else if (t.text == "false" || t.text == "False") e->value = false;
      else if (t.text == "none" || t.text == "None") e->value = nullptr;
      else e = std::make_unique<Expr>(Expr::Name), e->name = t.text;
      return e;
    }
    if (accept_op("(")) {
      auto e = std::make_unique<Expr>(Expr::Tuple);
      if (accept_op(")")) return sealed(std::move(e));  // ()
      ExprPtr first = expression();
      if (accept_op(")")) return first;
      e->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (peek_op(")")) break;
        e->args.push_back(expression());
      }
      expect_op(")");
      return sealed(std::move(e));
    }
    if (accept_op("[")) {
      auto e = std::make_unique<Expr>(Expr::List);
      while (!accept_op("]")) {
        e->args.push_back(expression());
        if (!peek_op("]")) expect_op(",");
      }
      return sealed(std::move(e));
    }
    if (accept_op("{")) {
      auto e = std::make_unique<Expr>(Expr::Dict);
      while (!accept_op("}")) {
        e->args.push_back(expression());
        expect_op(":");
        e->args.push_back(expression());
        if (!peek_op("}")) expect_op(",");
      }
      return sealed(std::move(e));
    }
    fail("template line {}: unexpected '{}' in an expression", line_, t.kind == Token::End ? std::string("end of tag") : t.text);
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int line_;
  int depth_ = 0;  // open parse levels (DepthGuard)
};

/// Builds the statement tree from segments; block statements recurse until their end tag.
class StmtParser {
 public:
  explicit StmtParser(std::vector<Segment> segs) : s_(std::move(segs)) {}

  /// Parses until one of `ends` (returned in *end_tag with its parser positioned after the keyword) or the end.
  Body parse(const std::vector<std::string>& ends, std::string* end_tag, std::unique_ptr<ExprParser>* end_parser) {
    Body body;
    while (i_ < s_.size()) {
      const Segment& seg = s_[i_++];
      if (seg.kind == Segment::Text) {
        auto st = std::make_unique<Stmt>(Stmt::Text);
        st->text = seg.content;
        body.push_back(std::move(st));
        continue;
      }
      auto p = std::make_unique<ExprParser>(lex(seg.content, seg.line), seg.line);
      if (seg.kind == Segment::Expression) {
        auto st = std::make_unique<Stmt>(Stmt::Output);
        st->expr = p->expression();
        p->expect_end();
        body.push_back(std::move(st));
        continue;
      }
      const std::string kw = p->name();
      for (const auto& e : ends)
        if (kw == e) {
          *end_tag = kw;
          *end_parser = std::move(p);
          return body;
        }
      body.push_back(statement(kw, *p, seg.line));
    }
    SSM_CHECK(ends.empty(), "template: missing {{% {} %}}", ends.empty() ? "" : ends.back());
    return body;
  }

 private:
  std::unique_ptr<Stmt> statement(const std::string& kw, ExprParser& p, int line) {
    DepthGuard g(depth_, kMaxNesting, line);  // block statements recurse through parse()
    std::string end;
    std::unique_ptr<ExprParser> ep;
    if (kw == "if") {
      auto st = std::make_unique<Stmt>(Stmt::If);
      ExprPtr cond = p.expression();
      p.expect_end();
      while (true) {
        Body b = parse({"elif", "else", "endif"}, &end, &ep);
        st->branches.emplace_back(std::move(cond), std::move(b));
        if (end == "elif") {
          cond = ep->expression();
          ep->expect_end();
          continue;
        }
        if (end == "else") {
          ep->expect_end();
          st->else_body = parse({"endif"}, &end, &ep);
        }
        ep->expect_end();
        return st;
      }
    }
    if (kw == "for") {
      auto st = std::make_unique<Stmt>(Stmt::For);
      st->vars.push_back(p.name());
      while (p.accept_op(",")) st->vars.push_back(p.name());
      p.expect_name("in");
      st->expr = p.or_expr();
      if (p.accept_name("if")) st->cond = p.or_expr();
      p.accept_name("recursive");
      p.expect_end();
      st->body = parse({"else", "endfor"}, &end, &ep);
      if (end == "else") {
        ep->expect_end();
        st->else_body = parse({"endfor"}, &end, &ep);
      }
      ep->expect_end();
      return st;
    }
    if (kw == "set") {
      auto st = std::make_unique<Stmt>(Stmt::Set);
      st->text = p.name();
      if (p.accept_op(".")) st->attr = p.name();
      SSM_CHECK(!p.peek_op(","), "template line {}: tuple assignment in set is not supported", line);
      p.expect_op("=");
      st->expr = p.expression();
      p.expect_end();
      return st;
    }
    if (kw == "macro") {
      auto st = std::make_unique<Stmt>(Stmt::Macro);
      st->text = p.name();
      p.expect_op("(");
      while (!p.accept_op(")")) {
        st->vars.push_back(p.name());
        st->defaults.push_back(p.accept_op("=") ? p.expression() : nullptr);
        if (!p.peek_op(")")) p.expect_op(",");
      }
      p.expect_end();
      st->body = parse({"endmacro"}, &end, &ep);
      return st;
    }
    if (kw == "break" || kw == "continue") {
      p.expect_end();
      return std::make_unique<Stmt>(kw == "break" ? Stmt::Break : Stmt::Continue);
    }
    if (kw == "generation") {  // transformers' AssistantTracker marks: render the body as it is
      p.expect_end();
      auto st = std::make_unique<Stmt>(Stmt::If);
      auto t = std::make_unique<Expr>(Expr::Literal);
      t->value = true;
      st->branches.emplace_back(std::move(t), parse({"endgeneration"}, &end, &ep));
      return st;
    }
    fail("template line {}: unsupported statement '{}'", line, kw);
  }

  std::vector<Segment> s_;
  size_t i_ = 0;
  int depth_ = 0;  // open block statements (DepthGuard)
};

}  // namespace

Body parse_template(const std::string& source) {
  // Jinja2's lexer reads \r\n and \r as \n (in text and in string literals), so a template saved with CRLF line
  // endings renders as the LF one does.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] != '\r') src += source[i];
    else if (i + 1 >= source.size() || source[i + 1] != '\n') src += '\n';
  }
  StmtParser p(split_segments(src));
  std::string end;
  std::unique_ptr<ExprParser> ep;
  return p.parse({}, &end, &ep);
}

}  // namespace ssmserve::server::jinja
