// Owns the expression parser of ssmserve's Jinja engine (internal to src/chat/jinja*.cpp): ExprParser, recursive
// descent over one tag's tokens with Jinja2's precedence levels, building Expr trees (jinja_ast.h) of bounded height;
// the statement parser (jinja_parse.cpp) reads its keywords and expressions through it.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_lex.h"
#include "core/error.h"

namespace ssmserve::server::jinja {

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
  ExprPtr or_expr();

 private:
  /// Finishes a node: its height is one more than its tallest operand's; throws Error past kMaxNesting.
  ExprPtr sealed(ExprPtr e);
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b);
  ExprPtr conditional();
  ExprPtr and_expr();
  ExprPtr not_expr();
  ExprPtr compare();
  ExprPtr concat();
  ExprPtr additive();
  ExprPtr multiplicative();
  ExprPtr power();
  ExprPtr unary();
  void call_args(Expr& e);
  ExprPtr postfix(ExprPtr a);
  ExprPtr primary();

  std::vector<Token> t_;
  size_t i_ = 0;
  int line_;
  int depth_ = 0;  // open parse levels (DepthGuard)
};

}  // namespace ssmserve::server::jinja
