// Owns the chat template: messages -> prompt text, using the checkpoint's Jinja chat template when
// tokenizer_config.json has one, else ssmserve's documented plain default (kDefaultChatTemplate).
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/content_format.h"

namespace ssmserve::server {

namespace jinja {
class Template;
}

/// The default for checkpoints without a chat template (base models): one "Role: content" line per message,
/// then "Assistant:" when a generation prompt is asked for. As Jinja:
///   {% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}
///   {% if add_generation_prompt %}Assistant:{% endif %}
extern const char* const kDefaultChatTemplate;

/// What a chat template renders besides the messages: transformers' apply_chat_template arguments (vLLM's chat
/// request fields of the same names).
struct ChatTemplateInputs {
  bool add_generation_prompt = false;
  /// The text ends inside the final message (transformers 5: cut at a tag appended to its content). Error with
  /// add_generation_prompt, on an empty conversation, or when the template drops the final message's content.
  bool continue_final_message = false;
  nlohmann::ordered_json tools;      ///< list of tool schemas, or null (the template sees `tools` = none)
  nlohmann::ordered_json documents;  ///< list of documents, or null
  /// chat_template_kwargs: extra template variables (e.g. {"enable_thinking": false}); they may replace bos_token /
  /// eos_token but not messages, tools, documents or add_generation_prompt (ignored, as transformers refuses them).
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  /// A named template of the checkpoint; "" picks "tool_use" when tools are given and it exists, else "default".
  std::string template_name;
  /// How the template receives each message's content: nullopt, as given (transformers' apply_chat_template); else
  /// vLLM's --chat-template-content-format (Auto: detected from the template by detect_chat_content_format), the
  /// messages normalized by normalize_chat_content. The server and LLM.chat render as vLLM does (Auto by default).
  std::optional<ChatContentFormat> content_format;
};

/// A loaded chat template (or several named ones) plus the special-token strings templates may use.
class ChatTemplate {
 public:
  /// The templates of `model_dir` as transformers 5 loads them: `chat_template.jinja` (the default) and
  /// `additional_chat_templates/<name>.jinja` when any of these files exist; else tokenizer_config.json
  /// "chat_template" (a string, or a list of {name, template}); else ssmserve's default. `override_path` (a file)
  /// wins as the default when non-empty. Throws Error for an unreadable file or a template that does not parse.
  static ChatTemplate load(const std::filesystem::path& model_dir, const std::filesystem::path& override_path = {});
  /// From template source.
  static ChatTemplate from_source(std::string source, std::string bos_token = "", std::string eos_token = "");
  /// The bos / eos strings of `model_dir`/tokenizer_config.json ({"", ""} without one), without parsing its chat
  /// template. Throws Error for an unreadable or malformed tokenizer_config.json.
  static std::pair<std::string, std::string> special_tokens(const std::filesystem::path& model_dir);

  /// Renders `messages` ([{"role", "content"}...]). continue_final_message (vLLM / transformers): the text is cut
  /// right after the final message's content (its last occurrence, else of its whitespace-stripped form), so the
  /// model continues that message; Error when it does not appear. Throws Error when the template raises or fails.
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    bool continue_final_message = false) const;

  /// Renders `messages` exactly as transformers' apply_chat_template(messages, tools=..., documents=...,
  /// add_generation_prompt=..., continue_final_message=..., chat_template=name, **kwargs, tokenize=False): the
  /// template picked by name (see ChatTemplateInputs::template_name), a context of messages (their content
  /// normalized when ChatTemplateInputs::content_format is set, as vLLM passes it; reasoning_content / thinking /
  /// reasoning aliased into each other, as transformers does), tools, documents, add_generation_prompt, bos_token, eos_token and the
  /// kwargs. Throws Error when the template raises, fails, or the name is unknown.
  std::string apply(const nlohmann::ordered_json& messages, const ChatTemplateInputs& inputs) const;

  /// The content format of the template `inputs` would pick: ChatTemplateInputs::content_format when String or
  /// OpenAI, else (Auto or nullopt) detected from the template. Throws Error as apply for an unknown name.
  ChatContentFormat content_format(const ChatTemplateInputs& inputs) const;

  /// Names of the checkpoint's templates ("default" for a single one).
  std::vector<std::string> template_names() const;
  const std::string& source() const { return source_; }
  /// The special-token strings the template sees (the checkpoint's tokenizer_config.json, else empty).
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool is_default() const { return is_default_; }

 private:
  /// The template `inputs` picks (name, else tool_use with tools, else the default) and its source.
  std::pair<const jinja::Template*, const std::string*> pick(const ChatTemplateInputs& inputs) const;

  std::string source_;
  std::shared_ptr<const jinja::Template> template_;  // the default (null when only named templates exist)
  std::map<std::string, std::pair<std::string, std::shared_ptr<const jinja::Template>>> named_;  // name -> source
  std::string bos_token_, eos_token_;
  bool is_default_ = false;
};

/// An assistant message's tool-call arguments as chat templates read them (vLLM, transformers' templates): the JSON
/// text the OpenAI format carries (`function.arguments`) parsed into an object; null or "" becomes {}; an object is
/// kept. Messages, calls or functions of other shapes are left alone (the server checks shapes before this).
/// Json: nlohmann::json or ordered_json; messages: the list of chat messages (anything else is left alone).
/// Returns the first argument text that is not JSON (at most its first 80 bytes, whole UTF-8 characters) for the
/// caller's error; nullopt when all parsed.
template <class Json>
std::optional<std::string> parse_tool_call_arguments(Json& messages) {
  if (!messages.is_array()) return std::nullopt;
  for (auto& msg : messages) {
    if (!msg.is_object() || !msg.contains("tool_calls") || msg.value("role", Json()) != "assistant") continue;
    auto& calls = msg["tool_calls"];
    if (!calls.is_array()) continue;
    for (auto& call : calls) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& fn = call["function"];
      if (!fn.contains("arguments") || fn["arguments"].is_null() ||
          (fn["arguments"].is_string() && fn["arguments"].template get<std::string>().empty())) {
        fn["arguments"] = Json::object();
      } else if (fn["arguments"].is_string()) {
        const std::string text = fn["arguments"].template get<std::string>();
        Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (parsed.is_discarded()) {
          size_t n = std::min<size_t>(text.size(), 80);  // cut on a UTF-8 character boundary
          while (n < text.size() && n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
          return text.substr(0, n);
        }
        fn["arguments"] = std::move(parsed);
      }
    }
  }
  return std::nullopt;
}

}  // namespace ssmserve::server
