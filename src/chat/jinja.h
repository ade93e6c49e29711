// Owns ssmserve's Jinja template engine: the Jinja2 subset Hugging Face chat templates use, rendered with
// transformers' settings (trim_blocks, lstrip_blocks, loop controls). Parser: jinja_lex.cpp (segments, tokens),
// jinja_expr_parser.cpp (expressions), jinja_parse.cpp (statements); renderer: jinja.cpp (statements, expressions),
// jinja_builtins.cpp (methods, filters, tests), jinja_value.cpp (Python value semantics).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace ssmserve::server::jinja {

struct Stmt;

/// A parsed template. Throws Error on a syntax error.
class Template {
 public:
  explicit Template(std::string source);
  const std::string& source() const { return source_; }
  /// Renders with `context` (a JSON object of variables). Throws Error on a runtime error or raise_exception().
  std::string render(const nlohmann::ordered_json& context) const;
  /// The parsed statements (jinja_ast.h), for analyses of the template such as detect_chat_content_format.
  const std::vector<std::unique_ptr<Stmt>>& statements() const;

 private:
  struct Impl;
  std::string source_;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ssmserve::server::jinja
