// Owns the lexer of ssmserve's Jinja engine (internal to src/chat/jinja*.cpp): template source -> segments (text,
// {{ expression }}, {% statement %}) with Jinja2's whitespace control (-/+, trim_blocks, lstrip_blocks), and one
// tag's content -> expression tokens. The parsers (jinja_expr_parser.h, jinja_parse.cpp) build the tree from them.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ssmserve::server::jinja {

/// One piece of the template: literal text, {{ expression }} or {% statement %}.
struct Segment {
  enum Kind { Text, Expression, Statement } kind;
  std::string content;
  int line;
};

/// Deepest nesting the parser accepts (brackets, unary operators, conditionals, expression tree height, block
/// statements); deeper templates raise an Error instead of overflowing the stack while parsing or rendering.
constexpr int kMaxNesting = 256;

/// Splits the source into segments, applying -/+ whitespace control, trim_blocks and lstrip_blocks.
std::vector<Segment> split_segments(const std::string& src);

/// Expression tokens.
struct Token {
  enum Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;
  nlohmann::json value;
};

/// The tokens of one tag's content (`line`: the tag's template line, for errors), ending with an End token.
std::vector<Token> lex(const std::string& s, int line);

}  // namespace ssmserve::server::jinja
