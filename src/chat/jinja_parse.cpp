// Owns the Jinja statement parser: template source -> statements (jinja_ast.h), the block statements (if / elif /
// else, for, set, macro, break / continue, generation) recursing until their end tags over the lexer's segments
// (jinja_lex.h), expressions through ExprParser (jinja_expr_parser.h). Follows Jinja2's grammar for the subset
// chat templates use.
#include <memory>

#include "core/error.h"
#include "chat/jinja_ast.h"
#include "chat/jinja_expr_parser.h"
#include "chat/jinja_lex.h"

namespace ssmserve::server::jinja {
namespace {

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
