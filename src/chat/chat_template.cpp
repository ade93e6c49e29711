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
  t.named_["default"] = {t.source_, t.template_};
  return t;
}

std::pair<std::string, std::string> ChatTemplate::special_tokens(const std::filesystem::path& model_dir) {
  const auto cfg_path = model_dir / "tokenizer_config.json";
  if (!path_entry_exists(cfg_path)) return {};
  const nlohmann::json cfg = parse_hf_json(read_text_file(cfg_path), cfg_path.string());
  return {token_string(cfg, "bos_token"), token_string(cfg, "eos_token")};
}

namespace {

/// A template file's text (1 MiB cap, as --chat-template files).
std::string read_template_file(const std::filesystem::path& p) { return read_text_file(p, std::size_t{1} << 20); }

/// The templates of `model_dir` by name, as transformers 5 finds them (see ChatTemplate::load).
std::map<std::string, std::string> template_sources(const std::filesystem::path& model_dir, const nlohmann::json& cfg) {
  std::map<std::string, std::string> sources;
  if (path_entry_exists(model_dir / "chat_template.jinja"))
    sources["default"] = read_template_file(model_dir / "chat_template.jinja");
  const auto extra_dir = model_dir / "additional_chat_templates";
  std::error_code ec;
  if (std::filesystem::is_directory(extra_dir, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(extra_dir, ec)) {
      if (entry.path().extension() == ".jinja") sources[entry.path().stem().string()] = read_template_file(entry.path());
    }
  }
  if (!sources.empty()) return sources;  // template files take priority over tokenizer_config.json entries
  // tokenizer_config.json's "chat_template": one template, or a list of {"name", "template"} (null = none). Any
  // other shape is an error naming it, not a silent fall back to the plain default template.
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return sources;
  const std::string where = (model_dir / "tokenizer_config.json").string();
  if (it->is_string()) {
    sources["default"] = it->get<std::string>();
    return sources;
  }
  SSM_CHECK(it->is_array(), "{}: field \"chat_template\" must be a string or a list of {{\"name\", \"template\"}} objects (got {})",
            where, json_excerpt(*it));
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& e = (*it)[i];
    SSM_CHECK(e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") && e["template"].is_string(),
              "{}: \"chat_template\"[{}] must be an object with string \"name\" and \"template\" (got {})", where, i,
              json_excerpt(e));
    sources[e["name"].get<std::string>()] = e["template"].get<std::string>();
  }
  return sources;
}

constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

/// transformers' _alias_reasoning_fields: a message with reasoning_content, thinking or reasoning (the first not
/// null) gets it as "thinking" (first key unless present) and "reasoning_content" (last key unless present).
nlohmann::ordered_json alias_reasoning(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return messages;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    const nlohmann::ordered_json* reasoning = nullptr;
    if (m.is_object())
      for (const char* key : {"reasoning_content", "thinking", "reasoning"})
        if (auto it = m.find(key); it != m.end() && !it->is_null()) {
          reasoning = &*it;
          break;
        }
    if (reasoning == nullptr) {
      out.push_back(m);
      continue;
    }
    nlohmann::ordered_json a = nlohmann::ordered_json::object();
    a["thinking"] = *reasoning;
    for (const auto& [k, v] : m.items()) a[k] = v;
    a["thinking"] = m.contains("thinking") ? m["thinking"] : *reasoning;
    a["reasoning_content"] = *reasoning;
    out.push_back(std::move(a));
  }
  return out;
}

bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string rstrip_ws(std::string s) {
  while (!s.empty() && py_space(s.back())) s.pop_back();
  return s;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir, const std::filesystem::path& override_path) {
  std::string bos, eos;
  nlohmann::json cfg = nlohmann::json::object();
  const auto cfg_path = model_dir / "tokenizer_config.json";
  std::string where = cfg_path.string();
  std::map<std::string, std::string> sources;
  try {
    if (path_entry_exists(cfg_path)) {
      cfg = parse_hf_json(read_text_file(cfg_path), cfg_path.string());
      bos = token_string(cfg, "bos_token");
      eos = token_string(cfg, "eos_token");
    }
    if (override_path.empty()) {
      sources = template_sources(model_dir, cfg);
    } else {
      where = override_path.string();
      sources["default"] = read_template_file(override_path);
    }
  } catch (const Error& e) {
    fail("chat template of {}: {}", model_dir.string(), e.what());
  }
  bool is_default = false;
  if (sources.empty()) sources["default"] = kDefaultChatTemplate, is_default = true;
  ChatTemplate t;
  t.bos_token_ = bos;
  t.eos_token_ = eos;
  for (auto& [name, source] : sources) {
    try {
      auto compiled = std::make_shared<const jinja::Template>(source);  // syntax errors surface at startup
      if (name == "default") {
        t.template_ = compiled;
        t.source_ = source;
      }
      t.named_[name] = {source, std::move(compiled)};
    } catch (const Error& e) {
      fail("chat template '{}' of {}: {}", name, where, e.what());
    }
  }
  t.is_default_ = is_default;
  return t;
}

std::vector<std::string> ChatTemplate::template_names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : named_) names.push_back(name);
  if (names.empty() && template_) names.push_back("default");
  return names;
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                bool continue_final_message) const {
  ChatTemplateInputs in;
  in.add_generation_prompt = add_generation_prompt;
  in.continue_final_message = continue_final_message;
  return apply(messages, in);
}

std::pair<const jinja::Template*, const std::string*> ChatTemplate::pick(const ChatTemplateInputs& in) const {
  // By name, else tool_use with tools, else the default (transformers' get_chat_template).
  const jinja::Template* tmpl = template_.get();
  const std::string* source = &source_;
  auto names = [&] {
    std::string s;
    for (const auto& [name, _] : named_) s += (s.empty() ? "" : ", ") + name;
    return s;
  };
  if (!in.template_name.empty()) {
    auto it = named_.find(in.template_name);
    SSM_CHECK(it != named_.end(), "no chat template named '{}' (available: {})", in.template_name, names());
    tmpl = it->second.second.get(), source = &it->second.first;
  } else if (!in.tools.is_null() && named_.count("tool_use") != 0) {
    tmpl = named_.at("tool_use").second.get(), source = &named_.at("tool_use").first;
  }
  SSM_CHECK(tmpl != nullptr, "this model has several chat templates and none is named default: pass a template name "
            "(available: {})", names());
  return {tmpl, source};
}

ChatContentFormat ChatTemplate::content_format(const ChatTemplateInputs& in) const {
  if (in.content_format && *in.content_format != ChatContentFormat::Auto) return *in.content_format;
  return detect_chat_content_format(pick(in).first->statements());
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, const ChatTemplateInputs& in) const {
  // 1. The template.
  const auto [tmpl, source] = pick(in);

  // 2. The conversation, its content in the template's format, aliased, with the continue tag on the final message.
  nlohmann::ordered_json chat =
      alias_reasoning(in.content_format ? normalize_chat_content(messages, content_format(in)) : messages);
  std::string final_message;
  if (in.continue_final_message) {
    SSM_CHECK(!in.add_generation_prompt,
              "continue_final_message and add_generation_prompt are not compatible: continue_final_message continues "
              "the final message, add_generation_prompt starts a new assistant message");
    SSM_CHECK(chat.is_array() && !chat.empty() && chat.back().is_object(),
              "continue_final_message is set but the conversation is empty");
    SSM_CHECK(source->find("content") != std::string::npos,
              "continue_final_message is set to \"content\" but this is not an accepted field in the chat_template");
    auto& content = chat.back()["content"];
    if (content.is_string()) {
      final_message = content.get<std::string>();
      content = final_message + std::string(kContinueTag);
    } else if (content.is_array()) {
      bool tagged = false;
      for (auto it = content.rbegin(); it != content.rend() && !tagged; ++it)
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          final_message = (*it)["text"].get<std::string>();
          (*it)["text"] = final_message + std::string(kContinueTag);
          tagged = true;
        }
      SSM_CHECK(tagged, "continue_final_message is set but we could not find any text to continue in the final message");
    } else {
      fail("continue_final_message is set but the final message has no \"content\" to continue");
    }
  }

  // 3. The context, as render(messages=..., tools=..., documents=..., add_generation_prompt=..., **kwargs).
  nlohmann::ordered_json ctx = {{"messages", std::move(chat)},
                                {"tools", in.tools},
                                {"documents", in.documents},
                                {"add_generation_prompt", in.add_generation_prompt},
                                {"bos_token", bos_token_},
                                {"eos_token", eos_token_}};
  if (in.kwargs.is_object())
    for (const auto& [k, v] : in.kwargs.items())
      if (k != "messages" && k != "tools" && k != "documents" && k != "add_generation_prompt") ctx[k] = v;
  std::string text = tmpl->render(ctx);
  if (!in.continue_final_message) return text;

  // 4. Cut at the tag (transformers 5: the tag's last occurrence; trailing spacing the template trimmed is dropped).
  const std::string tag(kContinueTag);
  const std::string tag_word = tag.substr(0, tag.size() - 1);
  SSM_CHECK(text.find(trim_whitespace(final_message)) != std::string::npos && text.find(tag_word) != std::string::npos,
            "continue_final_message is set but the final message does not appear in the chat after applying the chat "
            "template (a template that rewrites message content?)");
  const std::size_t at = text.rfind(tag_word);
  if (text.compare(at, tag.size(), tag) == 0) return text.substr(0, at);
  return rstrip_ws(text.substr(0, at));
}

}  // namespace ssmserve::server
