// Owns chat-template loading and rendering (see chat_template.h).
#include "chat/chat_template.h"

#include "config/hf_json.h"
#include "core/error.h"
#include "chat/jinja.h"

namespace ssmserve::server {

const char* const kDefaultChatTemplate =
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}";

namespace {

/// A special token's string from tokenizer_config.json: a plain string or an AddedToken object {"content": ...}.
std::string token_string(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return "";
}

/// `s` without leading / trailing whitespace (Python's str.strip() for ASCII whitespace).
std::string trim_whitespace(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

ChatTemplate ChatTemplate::from_source(std::string source, std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.source_ = std::move(source);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.template_ = std::make_shared<const jinja::Template>(t.source_);  // syntax errors surface at startup
  return t;
}

std::pair<std::string, std::string> ChatTemplate::special_tokens(const std::filesystem::path& model_dir) {
  const auto cfg_path = model_dir / "tokenizer_config.json";
  if (!path_entry_exists(cfg_path)) return {};
  const nlohmann::json cfg = parse_hf_json(read_text_file(cfg_path), cfg_path.string());
  return {token_string(cfg, "bos_token"), token_string(cfg, "eos_token")};
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir, const std::filesystem::path& override_path) {
  std::string bos, eos, source;
  bool is_default = false;
  const auto cfg_path = model_dir / "tokenizer_config.json";
  if (path_entry_exists(cfg_path)) {
    const nlohmann::json cfg = parse_hf_json(read_text_file(cfg_path), cfg_path.string());
    bos = token_string(cfg, "bos_token");
    eos = token_string(cfg, "eos_token");
    auto it = cfg.find("chat_template");
    if (it != cfg.end() && it->is_string()) {
      source = it->get<std::string>();
    } else if (it != cfg.end() && it->is_array()) {
      for (const auto& e : *it)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          source = e["template"].get<std::string>();
    }
  }
  if (!override_path.empty()) source = read_text_file(override_path, std::size_t{1} << 20);
  if (source.empty()) source = kDefaultChatTemplate, is_default = true;
  ChatTemplate t;
  try {
    t = from_source(source, bos, eos);
  } catch (const Error& e) {
    fail("chat template of {}: {}", override_path.empty() ? cfg_path.string() : override_path.string(), e.what());
  }
  t.is_default_ = is_default;
  return t;
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                bool continue_final_message) const {
  nlohmann::ordered_json ctx = {{"messages", messages},
                        {"add_generation_prompt", add_generation_prompt},
                        {"bos_token", bos_token_},
                        {"eos_token", eos_token_}};
  std::string text = template_->render(ctx);
  if (!continue_final_message || !messages.is_array() || messages.empty()) return text;
  const auto& last = messages.back();
  const std::string content = last.is_object() && last.contains("content") && last["content"].is_string()
                                  ? last["content"].get<std::string>()
                                  : std::string();
  // transformers' apply_chat_template(continue_final_message=True): the last occurrence of the stripped content;
  // the cut keeps the content's trailing whitespace when the template kept it there, else drops it.
  const std::string stripped = trim_whitespace(content);
  const size_t at = text.rfind(stripped);
  SSM_CHECK(at != std::string::npos,
            "continue_final_message is set but the final message does not appear in the chat after applying the chat "
            "template (a template that rewrites message content?)");
  const size_t lead = content.find_first_not_of(" \t\n\r\f\v");
  const size_t lstripped = lead == std::string::npos ? 0 : content.size() - lead;
  if (text.compare(at, lstripped, content) == 0) return text.substr(0, at + lstripped);
  return text.substr(0, at + stripped.size());
}

}  // namespace ssmserve::server
