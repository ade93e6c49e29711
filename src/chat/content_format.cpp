// Owns the chat content format (see content_format.h).
#include "chat/content_format.h"

#include <set>

#include "chat/jinja_ast.h"
#include "core/error.h"

namespace ssmserve::server {

using nlohmann::ordered_json;

ChatContentFormat parse_chat_content_format(const std::string& value, const std::string& what) {
  if (value == "auto") return ChatContentFormat::Auto;
  if (value == "string") return ChatContentFormat::String;
  if (value == "openai") return ChatContentFormat::OpenAI;
  fail("{} must be one of auto, string, openai (got '{}')", what, value);
}

const char* chat_content_format_name(ChatContentFormat f) {
  switch (f) {
    case ChatContentFormat::Auto: return "auto";
    case ChatContentFormat::String: return "string";
    case ChatContentFormat::OpenAI: return "openai";
  }
  return "auto";
}

namespace {

using jinja::Body;
using jinja::Expr;
using jinja::Stmt;

/// Every `for` and plain `set` statement of `body`, in and below macros, conditionals and loops.
void collect(const Body& body, std::vector<const Stmt*>& fors, std::vector<const Stmt*>& sets) {
  for (const auto& s : body) {
    if (s->kind == Stmt::For) fors.push_back(s.get());
    if (s->kind == Stmt::Set && s->attr.empty() && s->expr) sets.push_back(s.get());
    for (const auto& [cond, branch] : s->branches) collect(branch, fors, sets);
    collect(s->body, fors, sets);
    collect(s->else_body, fors, sets);
  }
}

bool is_var(const Expr* e, const std::string& var) { return e && e->kind == Expr::Name && e->name == var; }

/// `var[key]` or `var.key`.
bool is_item(const Expr* e, const std::string& var, const std::string& key) {
  if (!e) return false;
  if (e->kind == Expr::Index)
    return e->args.size() == 2 && is_var(e->args[0].get(), var) && e->args[1] && e->args[1]->kind == Expr::Literal &&
           e->args[1]->value.is_string() && e->args[1]->value.get<std::string>() == key;
  if (e->kind == Expr::Attr) return e->name == key && !e->args.empty() && is_var(e->args[0].get(), var);
  return false;
}

/// vLLM's _is_var_or_elems_access: `var` (key empty) or `var[key]` / `var.key`, possibly under filters, tests and
/// slices (`messages | reverse`, `messages[1:]`, `m['content'] | selectattr(...)`).
bool is_var_or_elems(const Expr* e, const std::string& var, const std::string& key) {
  if (!e) return false;
  if ((e->kind == Expr::Filter || e->kind == Expr::Test || e->kind == Expr::Slice) && !e->args.empty())
    return is_var_or_elems(e->args[0].get(), var, key);
  return key.empty() ? is_var(e, var) : is_item(e, var, key);
}

}  // namespace

ChatContentFormat detect_chat_content_format(const Body& body) {
  std::vector<const Stmt*> fors, sets;
  collect(body, fors, sets);
  // 1. Names bound to `messages` or to something taken from it, transitively.
  std::set<std::string> messages_vars = {"messages"};
  std::vector<std::string> queue = {"messages"};
  while (!queue.empty()) {
    const std::string v = queue.back();
    queue.pop_back();
    for (const Stmt* s : sets)
      if (is_var_or_elems(s->expr.get(), v, "") && messages_vars.insert(s->text).second) queue.push_back(s->text);
  }
  // 2. Targets of loops over them (one loop variable).
  std::set<std::string> message_vars;
  for (const Stmt* f : fors)
    for (const auto& v : messages_vars)
      if (f->vars.size() == 1 && is_var_or_elems(f->expr.get(), v, "")) message_vars.insert(f->vars[0]);
  // 3. A loop over one of their contents, or over a variable named content.
  for (const Stmt* f : fors) {
    if (is_var(f->expr.get(), "content")) return ChatContentFormat::OpenAI;
    for (const auto& v : message_vars)
      if (is_var_or_elems(f->expr.get(), v, "content")) return ChatContentFormat::OpenAI;
  }
  return ChatContentFormat::String;
}

namespace {

/// The text of each part of a content list (chat_part_text); throws Error for a part that is not a text part.
std::vector<std::string> part_texts(const ordered_json& parts) {
  std::vector<std::string> texts;
  for (const auto& part : parts) {
    auto text = chat_part_text(part);
    SSM_CHECK(text.has_value(),
              "only text content parts are supported ({{\"type\": \"text\", \"text\": ...}}, input_text, "
              "output_text, refusal, thinking, or a plain string)");
    texts.push_back(std::move(*text));
  }
  return texts;
}

/// `content` when it is a list; throws Error naming its type otherwise.
const ordered_json& checked_parts(const ordered_json& content) {
  SSM_CHECK(content.is_array(), "message content must be a string or a list of parts (got {})", content.type_name());
  return content;
}

std::string join_lines(const std::vector<std::string>& texts) {
  std::string out;
  for (size_t i = 0; i < texts.size(); ++i) out += (i ? "\n" : "") + texts[i];
  return out;
}

}  // namespace

std::optional<std::string> chat_part_text(const ordered_json& part) {
  if (part.is_string()) return part.get<std::string>();
  if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) return std::nullopt;
  const std::string type = part["type"].get<std::string>();
  // vLLM's MM_PARSER_MAP text entries: the text under "text", or under the type's own name.
  const char* key = type == "text" || type == "input_text" || type == "output_text" ? "text"
                    : type == "refusal"                                               ? "refusal"
                    : type == "thinking"                                              ? "thinking"
                                                                                      : nullptr;
  if (!key || !part.contains(key) || !part[key].is_string()) return std::nullopt;
  return part[key].get<std::string>();
}

std::string chat_content_text(const ordered_json& content) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  return join_lines(part_texts(checked_parts(content)));
}

ordered_json normalize_chat_content(const ordered_json& messages, ChatContentFormat f) {
  if (!messages.is_array()) return messages;
  ordered_json out = ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    ordered_json msg = m;
    const ordered_json content = m.contains("content") ? m["content"] : ordered_json();
    if (f != ChatContentFormat::OpenAI) {
      msg["content"] = chat_content_text(content);
    } else {
      ordered_json parts = ordered_json::array();
      std::vector<std::string> texts;
      if (content.is_string()) texts.push_back(content.get<std::string>());
      else if (!content.is_null()) texts = part_texts(checked_parts(content));
      for (auto& t : texts) parts.push_back({{"type", "text"}, {"text", std::move(t)}});
      msg["content"] = std::move(parts);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace ssmserve::server
