// Tests ssmserve's Jinja engine against Python Jinja2 renderings of chat templates (tests/data/chat_templates.jsonl,
// made by tools/make_chat_template_cases.py with transformers' settings), plus syntax/runtime errors.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ssmserve::server
