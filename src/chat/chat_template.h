// Owns the chat template: messages -> prompt text, using the checkpoint's Jinja chat template when
// tokenizer_config.json has one, else ssmserve's documented plain default (kDefaultChatTemplate).
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>

namespace ssmserve::server {

namespace jinja {
class Template;
}

/// The default for checkpoints without a chat template (base models): one "Role: content" line per message,
/// then "Assistant:" when a generation prompt is asked for. As Jinja:
///   {% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}
///   {% if add_generation_prompt %}Assistant:{% endif %}
extern const char* const kDefaultChatTemplate;

/// A loaded chat template plus the special-token strings templates may use (bos_token, eos_token).
class ChatTemplate {
 public:
  /// The template of `model_dir`/tokenizer_config.json ("chat_template": a string, or a list of {name,
  /// template} where "default" is used) or the default. `override_path` (a file) wins when non-empty.
  /// Throws Error for an unreadable override file or a template that does not parse.
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
  const std::string& source() const { return source_; }
  /// The special-token strings the template sees (the checkpoint's tokenizer_config.json, else empty).
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  bool is_default() const { return is_default_; }

 private:
  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
  std::string bos_token_, eos_token_;
  bool is_default_ = false;
};

}  // namespace ssmserve::server
