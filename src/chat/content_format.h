// Owns the chat content format: whether a chat template reads a message's content as one string or as a list of
// OpenAI content parts ([{"type": "text", "text": ...}]), detected from the template's syntax tree as vLLM's
// `--chat-template-content-format auto` does, and the messages normalized to that format before rendering.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ssmserve::server {

namespace jinja {
struct Stmt;
}

/// vLLM's ChatTemplateContentFormatOption: "auto" (detect from the template), "string" (content parts joined with
/// newlines into one string) or "openai" (every content a list of {"type": "text", "text": ...} parts).
enum class ChatContentFormat { Auto, String, OpenAI };

/// Parses "auto" / "string" / "openai". Throws Error naming `what` (a flag or argument name) for anything else.
ChatContentFormat parse_chat_content_format(const std::string& value, const std::string& what);
const char* chat_content_format_name(ChatContentFormat f);

/// vLLM's _detect_content_format on a parsed template (the statements of jinja::Template): "openai" when some `for`
/// loop iterates a message's content, i.e. `for x in m['content']` / `m.content` (through filters, tests or slices)
/// where `m` is the target of a loop over `messages` or over a variable set from it (`set loop_messages =
/// messages[1:]`, transitively), or `for x in content`; else "string". Never Auto.
ChatContentFormat detect_chat_content_format(const std::vector<std::unique_ptr<jinja::Stmt>>& body);

/// The messages as a template of format `f` (String or OpenAI) receives them (vLLM's _parse_chat_message_content):
/// String: a list of text parts (chat_part_text) joined with "\n", a null / missing content "". OpenAI: a string
/// becomes [{"type": "text", "text": s}], a list's text parts become {"type": "text", "text"}, null / missing [].
/// Other fields are kept; messages that are not objects are left alone. Throws Error for a content part that is not
/// a text part or a content of another type.
nlohmann::ordered_json normalize_chat_content(const nlohmann::ordered_json& messages, ChatContentFormat f);

/// The text of one content part as vLLM reads text parts: a plain string, or {"type": "text" | "input_text" |
/// "output_text", "text": str}, {"type": "refusal", "refusal": str}, {"type": "thinking", "thinking": str}; nullopt
/// for any other part (an image, a malformed part).
std::optional<std::string> chat_part_text(const nlohmann::ordered_json& part);

/// A message content's text as one string (a list's text parts joined with "\n"; null: ""): what the chat echo
/// repeats. Throws Error as normalize_chat_content.
std::string chat_content_text(const nlohmann::ordered_json& content);

}  // namespace ssmserve::server
