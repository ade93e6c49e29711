// Owns the syntax tree of ssmserve's Jinja engine (internal to src/server/jinja*.cpp).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace ssmserve::server::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

/// An expression node. `kind` selects which fields are used.
struct Expr {
  enum Kind { Literal, Name, List, Tuple, Dict, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, Cond };
  Kind kind;
  nlohmann::ordered_json value;       // Literal
  int height = 1;                     // nodes on the longest path down (bounded by the parser)
  std::string name;                   // Name, Attr (attribute), Call (method name when callee is Attr), Filter, Test, Unary/Binary op
  std::vector<ExprPtr> args;          // List / Tuple items, Dict keys/values interleaved, Call/Filter/Test arguments, operands
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call / Filter keyword arguments
  bool negated = false;               // Test: "is not"
  explicit Expr(Kind k) : kind(k) {}
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

/// A statement node.
struct Stmt {
  enum Kind { Text, Output, If, For, Set, Break, Continue, Macro };
  Kind kind;
  std::string text;                   // Text; Set: target name; Macro: name
  std::string attr;                   // Set: namespace attribute (set ns.attr = ...)
  ExprPtr expr;                       // Output, For iterable, Set value
  ExprPtr cond;                       // For: inline "if" filter
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: (condition, body)...
  Body body, else_body;               // For / If else / Macro body
  std::vector<std::string> vars;      // For loop variables; Macro parameters
  std::vector<ExprPtr> defaults;      // Macro parameter defaults (nullptr = none)
  explicit Stmt(Kind k) : kind(k) {}
};

/// Parses template source into statements (whitespace control, trim_blocks and lstrip_blocks as transformers
/// renders chat templates). Throws Error with the line on a syntax error.
Body parse_template(const std::string& source);

/// Counts one recursion level (a parse function's or a render frame's) for its scope; throws Error past `limit`,
/// naming the template line (parsing, line >= 0) or the rendering (line < 0). Bounds the engine's recursion so a
/// deeply nested template is an error, not a stack overflow.
class DepthGuard {
 public:
  DepthGuard(int& depth, int limit, int line) : depth_(depth) {
    if (++depth_ <= limit) return;
    --depth_;
    if (line >= 0) fail("template line {}: template nesting too deep (more than {} levels)", line, limit);
    fail("template nesting too deep while rendering (more than {} levels)", limit);
  }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int& depth_;
};

}  // namespace ssmserve::server::jinja
