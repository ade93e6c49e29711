// Owns the Jinja expression grammar (see jinja_expr_parser.h): conditionals, boolean and comparison operators,
// concatenation and arithmetic, unary operators, postfix attribute / subscript / slice / call / filter / test, and
// literals, names, tuples, lists and dicts; every node sealed with its height.
#include "chat/jinja_expr_parser.h"

#include <algorithm>

namespace ssmserve::server::jinja {

ExprPtr ExprParser::or_expr() {
  ExprPtr a = and_expr();
  while (accept_name("or")) a = binary("or", std::move(a), and_expr());
  return a;
}

ExprPtr ExprParser::sealed(ExprPtr e) {
  int h = 0;
  for (const auto& a : e->args)
    if (a) h = std::max(h, a->height);
  for (const auto& kv : e->kwargs) h = std::max(h, kv.second->height);
  e->height = h + 1;
  SSM_CHECK(e->height <= kMaxNesting, "template line {}: template nesting too deep (more than {} levels)", line_, kMaxNesting);
  return e;
}

ExprPtr ExprParser::binary(const std::string& op, ExprPtr a, ExprPtr b) {
  auto e = std::make_unique<Expr>(Expr::Binary);
  e->name = op;
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return sealed(std::move(e));
}

ExprPtr ExprParser::conditional() {
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

ExprPtr ExprParser::and_expr() {
  ExprPtr a = not_expr();
  while (accept_name("and")) a = binary("and", std::move(a), not_expr());
  return a;
}

ExprPtr ExprParser::not_expr() {
  if (accept_name("not")) {
    DepthGuard g(depth_, kMaxNesting, line_);
    auto e = std::make_unique<Expr>(Expr::Unary);
    e->name = "not";
    e->args.push_back(not_expr());
    return sealed(std::move(e));
  }
  return compare();
}

ExprPtr ExprParser::compare() {
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

ExprPtr ExprParser::concat() {
  ExprPtr a = additive();
  while (accept_op("~")) a = binary("~", std::move(a), additive());
  return a;
}

ExprPtr ExprParser::additive() {
  ExprPtr a = multiplicative();
  while (peek_op("+") || peek_op("-")) {
    const std::string op = t_[i_++].text;
    a = binary(op, std::move(a), multiplicative());
  }
  return a;
}

ExprPtr ExprParser::multiplicative() {
  ExprPtr a = power();
  while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
    const std::string op = t_[i_++].text;
    a = binary(op, std::move(a), power());
  }
  return a;
}

ExprPtr ExprParser::power() {
  ExprPtr a = unary();
  while (accept_op("**")) a = binary("**", std::move(a), unary());
  return a;
}

ExprPtr ExprParser::unary() {
  if (peek_op("-") || peek_op("+")) {
    DepthGuard g(depth_, kMaxNesting, line_);
    auto e = std::make_unique<Expr>(Expr::Unary);
    e->name = t_[i_++].text;
    e->args.push_back(unary());
    return sealed(std::move(e));
  }
  return postfix(primary());
}

void ExprParser::call_args(Expr& e) {
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

ExprPtr ExprParser::postfix(ExprPtr a) {
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

ExprPtr ExprParser::primary() {
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

}  // namespace ssmserve::server::jinja
