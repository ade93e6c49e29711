// Owns the Renderer of ssmserve's Jinja engine (internal to src/server/jinja*.cpp): one template call's scopes,
// statements and expressions (jinja.cpp), and the built-in methods, filters and tests (jinja_builtins.cpp).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/jinja_ast.h"
#include "chat/jinja_value.h"

namespace ssmserve::server::jinja {

/// Renders one template call: scopes, output, macros.
class Renderer {
 public:
  explicit Renderer(const json& ctx);
  void exec(const Body& body, std::string& out);

 private:
  void exec(const Stmt& st, std::string& out);
  void exec_for(const Stmt& st, std::string& out);
  void bind(const Stmt& st, const json& item);
  Value* lookup(const std::string& name);
  Value eval(const Expr& e);
  Value subscript(const Value& obj, const json& key);
  Value slice(const Value& obj, const Expr& e);
  Value binary(const Expr& e);
  static bool equal(const json& a, const json& b);
  std::vector<Value> args(const Expr& e, size_t first);
  Value kwarg(const Expr& e, const std::string& name, const std::vector<Value>& pos, size_t index, Value def = {});
  Value call(const Expr& e);
  Value call_macro(const Stmt& m, const Expr& e, const std::vector<Value>& a);
  /// The macro `v` stands for (a macro value, or its marker inside a container); nullptr if it is none.
  const Stmt* as_macro(const Value& v) const;
  Value method(const Value& obj, const std::string& name, const std::vector<Value>& a, const Expr& e);
  Value filter(const Expr& e);
  Value filter_named(const std::string& f, const Value& x, const std::vector<Value>& a, const Expr& e);
  bool test(const Expr& e);
  bool test_named(const std::string& t, const Value& x, const std::vector<Value>& a);

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::vector<const Stmt*> macros_;  // macros defined so far, indexed by their kMacroMarker
  int depth_ = 0;         // macro calls in progress
  int render_depth_ = 0;  // exec(Stmt) / eval frames in progress (bounded: macros multiply the parser's bound)
  long long loop_iterations_ = 0;  // for-loop items so far (bounded by kMaxLoopIterations)
};

}  // namespace ssmserve::server::jinja
