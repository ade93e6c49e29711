// Tests ssmserve's Jinja engine against Python Jinja2 renderings of chat templates (tests/data/chat_templates.jsonl,
// made by tools/make_chat_template_cases.py with transformers' settings), plus syntax/runtime errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "server/chat_template.h"
#include "server/jinja.h"

namespace ssmserve::server {
namespace {

using nlohmann::ordered_json;

TEST(ServerJinja, MatchesJinja2OnChatTemplates) {
  std::ifstream in(std::string(SSMSERVE_SOURCE_DIR) + "/tests/data/chat_templates.jsonl");
  ASSERT_TRUE(in);
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    const ordered_json c = ordered_json::parse(line);
    SCOPED_TRACE(c["name"].get<std::string>());
    const jinja::Template t(c["template"].get<std::string>());
    if (c["expected"].is_null()) {
      try {
        t.render(c["context"]);
        ADD_FAILURE() << "expected an error: " << c["error"];
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << e.what();
      }
    } else {
      EXPECT_EQ(t.render(c["context"]), c["expected"].get<std::string>());
    }
    ++cases;
  }
  EXPECT_GE(cases, 20);
}

TEST(ServerJinja, SyntaxAndRuntimeErrorsAreErrors) {
  for (const char* bad : {"{% if x %}no end", "{{ 1 + }}", "{% for %}{% endfor %}", "{{ 'unterminated }}", "{% bogus %}",
                          "{{ x | nofilter }}", "{% set a, b = 1 %}", "{{ (1 }}", "{{ a[ }}", "{{"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(jinja::Template(bad).render(ordered_json::object()), Error);
  }
  for (const char* bad : {"{{ 1 / 0 }}", "{{ raise_exception('boom') }}", "{% for i in 5 %}{% endfor %}", "{{ x.y() }}",
                          "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "{{ range(0, 5, 0) }}"}) {
    SCOPED_TRACE(bad);
    const jinja::Template t(bad);
    EXPECT_THROW(t.render(ordered_json{{"x", {{"y", 1}}}}), Error);
  }
}

TEST(ServerChatTemplate, DefaultTemplateWithoutCheckpointTemplate) {
  const ChatTemplate t = ChatTemplate::load(std::string(SSMSERVE_SOURCE_DIR) + "/models/tiny-mamba");
  EXPECT_TRUE(t.is_default());
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])");
  EXPECT_EQ(t.apply(messages, true), "User: hi\nAssistant: yo\nAssistant:");
  EXPECT_EQ(t.apply(messages, false), "User: hi\nAssistant: yo\n");
}

TEST(ServerChatTemplate, CheckpointTemplateWinsOverDefaultAndOverrideWinsOverBoth) {
  const auto dir = std::filesystem::temp_directory_path() / ("ssm_chat_template_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream cfg(dir / "tokenizer_config.json");
    cfg << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
               "chat_template": [{"name": "tool_use", "template": "T"},
                                 {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}]})";
  }
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  const ChatTemplate t = ChatTemplate::load(dir);
  EXPECT_FALSE(t.is_default());
  EXPECT_EQ(t.apply(messages, true), "<s>[user]hi</s>");
  {
    std::ofstream over(dir / "override.jinja");
    over << "{% for m in messages %}<{{ m['content'] | upper }}>{% endfor %}";
  }
  EXPECT_EQ(ChatTemplate::load(dir, dir / "override.jinja").apply(messages, true), "<HI>");
  {
    std::ofstream bad(dir / "bad.jinja");
    bad << "{% for m in messages %}";
  }
  EXPECT_THROW(ChatTemplate::load(dir, dir / "bad.jinja"), Error);
  EXPECT_THROW(ChatTemplate::load(dir, dir / "missing.jinja"), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ssmserve::server
