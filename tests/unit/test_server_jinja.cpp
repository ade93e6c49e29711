// Tests ssmserve's Jinja engine against Python Jinja2 renderings of chat templates (tests/data/chat_templates.jsonl,
// made by tools/make_chat_template_cases.py with transformers' settings), plus syntax/runtime errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "chat/chat_template.h"
#include "chat/jinja.h"

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

std::string repeat(const std::string& s, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += s;
  return r;
}

std::string render(const std::string& src, const ordered_json& ctx = ordered_json::object()) {
  return jinja::Template(src).render(ctx);
}

/// Templates nested `n` deep in each construct the QA pass found overflowing the stack at n = 10000 (and a few more),
/// with the rendering expected at any depth the engine accepts (Python jinja2 gives these at n = 15 and 20; most of
/// them raise RecursionError or "too many nested parentheses" there by n = 100).
std::vector<std::pair<std::string, std::string>> nested_templates(int n) {
  const std::string ones = repeat("1 + ", n) + "1";
  return {
      {"{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}", "1"},
      {"{{ " + repeat("[", n) + repeat("]", n) + "|length }}", "1"},
      {"{{ " + repeat("not ", n) + "false }}", n % 2 ? "True" : "False"},
      {"{{ " + repeat("-", n) + "1 }}", n % 2 ? "-1" : "1"},
      {"{{ " + repeat("- (", n) + "1" + repeat(")", n) + " }}", n % 2 ? "-1" : "1"},
      {repeat("{% if true %}", n) + "x" + repeat("{% endif %}", n), "x"},
      {repeat("{% for i in [1] %}", n) + "x" + repeat("{% endfor %}", n), "x"},
      {repeat("{% if false %}{% else %}", n) + "x" + repeat("{% endif %}", n), "x"},
      {repeat("{% macro m() %}", n) + repeat("{% endmacro %}", n) + "x", "x"},
      {"{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " is mapping }}", "True"},
      {"{{ " + ones + " }}", std::to_string(n + 1)},
      {"{{ ('a'" + repeat(" ~ 'a'", n) + ")|length }}", std::to_string(n + 1)},
      {"{{ 'x'" + repeat("|trim", n) + " }}", "x"},
      {"{{ 'x'" + repeat(".strip()", n) + " }}", "x"},
      {"{{ " + repeat("true if false else ", n) + "1 }}", "1"},
      {"{{ " + repeat("dict(a=", n) + "1" + repeat(")", n) + " is mapping }}", "True"},
      {"{{ " + repeat("(", n) + "1," + repeat("),", n - 1) + ")|length }}", "1"},
  };
}

TEST(ServerJinja, DeepNestingIsAnErrorNotACrash) {
  for (const auto& [src, expected] : nested_templates(10000)) {
    SCOPED_TRACE(src.substr(0, 40));
    try {
      render(src);
      ADD_FAILURE() << "expected a nesting error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("template nesting too deep"), std::string::npos) << e.what();
    }
  }
}

TEST(ServerJinja, OrdinaryDeepTemplatesStillRender) {
  for (const auto& [src, expected] : nested_templates(100)) {
    try {
      EXPECT_EQ(render(src), expected) << src.substr(0, 40);
    } catch (const Error& e) {
      ADD_FAILURE() << src.substr(0, 40) << ": " << e.what();
    }
  }
}

TEST(ServerJinja, RecursiveMacrosOverDeepBodiesHitTheRenderLimit) {
  // 60 macro levels (under the 64-call limit) each 200 blocks deep: fine for the parser, too deep to render
  const std::string body = repeat("{% if true %}", 200) + "{{ m(n - 1) if n > 0 }}" + repeat("{% endif %}", 200);
  const jinja::Template t("{% macro m(n) %}" + body + "{% endmacro %}{{ m(60) }}|");
  try {
    t.render(ordered_json::object());
    ADD_FAILURE() << "expected a nesting error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("template nesting too deep while rendering"), std::string::npos) << e.what();
  }
  EXPECT_EQ(jinja::Template("{% macro m(n) %}" + body + "{% endmacro %}{{ m(2) }}|").render(ordered_json::object()), "|");
}

TEST(ServerJinja, HostileTemplatesHitResourceLimits) {
  // Per-request chat templates reach the engine from the network: growth in memory, data depth, loop work and
  // out-of-range integers must end in an Error (Python would raise MemoryError / RecursionError or use big ints).
  const std::pair<const char*, const char*> cases[] = {
      {"{{ 'a' * 1000000000000 }}", "string too long"},
      {"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "string too long"},
      {"{% for i in range(100) %}{{ 'a' * 1000000 }}{% endfor %}", "string too long"},
      {"{{ ('a' * 1000000)|replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') }}", "string too long"},
      {"{{ ('a\n' * 1000000)|indent(100) }}", "string too long"},
      {"{{ 'a\nb'|indent(1000000000000) }}", "string too long"},
      {"{{ ('a' * 600000)|list + ('b' * 600000)|list }}", "list too long"},
      {"{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}", "nested too deep"},
      {"{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}{% endfor %}", "nested too deep"},
      // Values are copied, not shared (Jinja2 shares them): nesting a value in itself doubles it each pass.
      {"{% set ns = namespace(x=[]) %}{% for i in range(40) %}{% set ns.x = ns.x + [ns.x] %}{% endfor %}{{ ns.x|length }}", "value too large"},
      {"{% set ns = namespace(x=[]) %}{% for i in range(40) %}{% set ns.x = {'a': ns.x, 'b': ns.x} %}{% endfor %}", "value too large"},
      {"{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}", "value too large"},
      {"{% set x = 'a' * 60000000 %}{{ [x, x, x]|length }}", "value too large"},
      {"{% set x = 'a' * 60000000 %}{{ {'a': x, 'b': x, 'c': x}|length }}", "value too large"},
      {"{% set x = ['a' * 60000000] %}{{ (x + x + x)|length }}", "value too large"},
      {"{% for c in 'a' * 1000001 %}{% endfor %}", "too many loop iterations"},
      {"{{ ('a' * 2000000)|list|length }}", "list of 2000000 items"},
      {"{{ range(100001) }}", "range() too big"},
      {"{{ 2 ** 100 }}", "out of range"},
      {"{{ 1e300|int }}", "out of range"},
      {"{{ range(1e300) }}", "out of range"},
      {"{{ 'abc'[1e300:] }}", "out of range"},
  };
  const std::string wrap_macro = "{% macro m(x, n) %}{{ m(" + repeat("[", 20) + "x" + repeat("]", 20) +
                                 ", n - 1) if n > 0 }}{% endmacro %}{{ m(1, 60) }}";  // 20 levels a call, 60 calls
  std::vector<std::pair<std::string, std::string>> all(std::begin(cases), std::end(cases));
  all.emplace_back(wrap_macro, "nested too deep");
  for (const auto& [src, error] : all) {
    SCOPED_TRACE(src.substr(0, 100));
    try {
      render(src);
      ADD_FAILURE() << "expected an error: " << error;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(error), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ 'ab' * 3 }} {{ 'ab' * -1 }}|{{ 'a.b.a'|replace('a', 'xy') }} {{ range(3)|list }}"),
            "4611686018427387904 ababab |xy.b.xy [0, 1, 2]");
  EXPECT_EQ(render("{{ 'ab' * 0 }}|{{ 'abc' * 5 }}|{{ 'h\u00e9llo'|length }}|{{ [1,2]|length }}|{{ {'a':1}|count }}"), "|abcabcabcabcabc|5|2|1");
}

// Expected strings below are Python jinja2 3.1 renderings with transformers' environment (tojson overridden).
TEST(ServerJinja, DictsortSortsLikeJinja2) {
  const std::string d = "{'b': 1, 'a': 2, 'C': 0}";
  EXPECT_EQ(render("{% for k, v in " + d + "|dictsort %}{{k}}{{v}}{% endfor %}"), "a2b1C0");
  EXPECT_EQ(render("{% for k, v in " + d + "|dictsort(true) %}{{k}}{{v}}{% endfor %}"), "C0a2b1");
  EXPECT_EQ(render("{% for k, v in " + d + "|dictsort(reverse=true) %}{{k}}{{v}}{% endfor %}"), "C0b1a2");
  EXPECT_EQ(render("{% for k, v in " + d + "|dictsort(false, 'value') %}{{k}}{{v}}{% endfor %}"), "C0b1a2");
  EXPECT_EQ(render("{% for k, v in " + d + "|dictsort(reverse=true, by='value') %}{{k}}{{v}}{% endfor %}"), "a2b1C0");
  EXPECT_EQ(render("{% for k, v in {'b': 'y', 'a': 'Y', 'c': 'x'}|dictsort(by='value') %}{{k}}{{v}}{% endfor %}"), "cxbyaY");
  EXPECT_EQ(render("{% for k, v in d|dictsort %}{{k}}{% endfor %}", {{"d", {{"z", 1}, {"y", 2}}}}), "yz");
  EXPECT_THROW(render("{{ {'a': 1}|dictsort(by='other') }}"), Error);
}

TEST(ServerJinja, EscapeFiltersEscapeHtml) {
  EXPECT_EQ(render("{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<'|escape }}|{{ 5|e }}|{{ none|e }}|{{ x|e }}"),
            "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|&lt;|5|None|");
  EXPECT_EQ(render("{{ 'a&b'|e ~ '<' }}"), "a&amp;b<");
  EXPECT_EQ(render("{{ '<'|e|e }}|{{ '<'|safe|e }}|{{ '<'|escape|escape }}|{{ ('<'|e ~ '<')|e }}|{% set s = '<b>'|e %}{{ s|e }}|{{ s|length }}"),
            "&lt;|<|&lt;|&amp;lt;&lt;|&lt;b&gt;|9");
}

TEST(ServerJinja, TojsonTakesTransformersArguments) {
  EXPECT_EQ(render("{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true) }}"), R"({"a": {"c": 2, "d": 1}, "b": 1})");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1,2]}|tojson(indent=2, sort_keys=true) }}"), "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}");
  EXPECT_EQ(render("{{ [1, {'b': 2, 'a': 1}]|tojson(indent=0) }}"), "[\n1,\n{\n\"b\": 2,\n\"a\": 1\n}\n]");
  EXPECT_EQ(render("{{ {'b': 1, 'a': [1,2]}|tojson(separators=(',', ':')) }}"), R"({"b":1,"a":[1,2]})");
  EXPECT_EQ(render("{{ {'k': '<\u00e9\"'}|tojson }}"), "{\"k\": \"<\u00e9\\\"\"}");
  EXPECT_EQ(render("{{ {'b': '\u00e9'}|tojson(true) }}"), R"({"b": "\u00e9"})");
  EXPECT_EQ(render("{{ {'k': '\u00e9\U0001F600', 'z': [1.5, 1e-7, none, true]}|tojson(ensure_ascii=true, separators=(',', ':'), "
                   "sort_keys=true) }}"),
            R"({"k":"\u00e9\ud83d\ude00","z":[1.5,1e-07,null,true]})");
  EXPECT_THROW(render("{{ 1|tojson(separators=',') }}"), Error);
}

TEST(ServerJinja, FloatLiteralsWithExponents) {
  EXPECT_EQ(render("{{ 1e-7 }} {{ 1e5 }} {{ 2.5E-3 }} {{ 1_0e1_0 }} {{ 0.0001 }} {{ 1.5e-5 }} {{ 1e16 }} {{ 1.5e300 }}"),
            "1e-07 100000.0 0.0025 100000000000.0 0.0001 1.5e-05 1e+16 1.5e+300");
  EXPECT_EQ(render("{{ 1E+2 }} {{ -1e-7 }} {{ 3e0 }} {{ 1.5e3 * 2 }} {{ 1e999 }}"), "100.0 -1e-07 3.0 3000.0 inf");
  EXPECT_THROW(render("{{ 1e }}"), Error);  // as in Jinja2: 1 followed by the name e
}

TEST(ServerJinja, ClosingBracesInsideExpressions) {
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
  EXPECT_EQ(render("{{ {'a': {'b': [1, {'c': 2}]}}['a']['b'][1] }}|{{ '}}' ~ \"{{\" }}|{{ {'x': '}}'}.x }}"), "{'c': 2}|}}{{|}}");
  EXPECT_EQ(render("{% set x = {'a': {'b': '%}'}} %}{{ x.a.b }}"), "%}");
  EXPECT_EQ(render("{{ {'a': 1}['a'] -}}  \n x"), "1x");
  EXPECT_THROW(render("{{ (1 }}"), Error);
  EXPECT_THROW(render("{{ {'a': 1 }}"), Error);
}

TEST(ServerJinja, TuplesPrintAsTuples) {
  EXPECT_EQ(render("{% set t = (1, 'a') %}{{ t }} {{ t ~ '' }} {{ t|string }} {{ (1,) }} {{ () }}"), "(1, 'a') (1, 'a') (1, 'a') (1,) ()");
  EXPECT_EQ(render("{{ (1, 2)|length }} {{ (1, 2)|tojson }} {{ (1, 2)[0] }} {{ (1, 2) == (1, 2) }} {{ (1, 2) != [1, 2] }} "
                   "{% for a, b in [(1, 2)] %}{{ a }}{{ b }}{% endfor %}"),
            "2 [1, 2] 1 True True 12");
}

TEST(ServerJinja, SubscriptsAndSlicesOfUtf8StringsAndLists) {
  EXPECT_EQ(render(R"({{ 'héllo wörld'[1] }}|{{ 'héllo wörld'[-4] }}|{{ 'héllo wörld'[1:8] }}|{{ 'héllo wörld'[::-2] }}|{{ 'héllo'[10] is undefined }}|{{ 'héllo'|first }}{{ 'héllo'|last }}|{{ 'abc'[-1] }}{{ 'abc'[::-1] }}{{ 'abcdef'[1:-1:2] }}|{{ [1, 2, 3][-1] }}{{ [1, 2, 3][5:] }}{{ [1, 2, 3][::-1] }}|{{ []|first is undefined }}|{{ ''|last is undefined }}|{{ {'a': 1, 'b': 2}|first }}|{{ 'x😀y'[1] }}{{ 'x😀y'[-1:] }})"),
            "\u00e9|\u00f6|\u00e9llo w\u00f6|drwolh|True|ho|ccbabd|3[][3, 2, 1]|True|True|a|\U0001F600y");
  EXPECT_EQ(render("{{ ('a' * 60000000)[-1] }}{{ ('\u00e9' * 1000000)[-2:]|length }}"), "a2");  // no per-character copies
}

TEST(ServerJinja, MacrosAsValuesAndStarArguments) {
  // Jamba-1.5 / 1.7 keep macros in a list and call them with a list of arguments (Python jinja2 gives these).
  EXPECT_EQ(render("{% macro a(x, y) %}A{{ x }}{{ y }}{% endmacro %}{% macro b(x) %}B{{ x }}{% endmacro %}"
                   "{% set ms = [a] + [b] %}{% set ps = [[1, 2], ['z']] %}"
                   "{% for i in range(ms|length) %}{{ ms[i](*ps[i]) }}|{% endfor %}{{ a(*'pq') }}{{ a(*[7], y=8) }}"),
            "A12|Bz|ApqA78");
  EXPECT_EQ(render("{% macro a() %}{% endmacro %}{{ a is callable }}{{ [a][0] is callable }}{{ {'k': 1} is callable }}"),
            "TrueTrueFalse");
  EXPECT_THROW(render("{% macro f() %}{% endmacro %}{{ f(*none) }}"), Error);
  EXPECT_THROW(render("{{ [1][0]() }}"), Error);
}

TEST(ServerJinja, AttributeOfUndefinedRaises) {
  // Jinja2's Undefined raises on attribute and item access; a missing attribute of a defined value is undefined.
  for (const char* src : {"{{ knobs.is_set }}", "{{ knobs['x'] }}", "{% if x.y %}{% endif %}", "{{ d.missing.x }}"}) {
    SCOPED_TRACE(src);
    try {
      render(src, ordered_json{{"d", {{"a", 1}}}});
      ADD_FAILURE() << "rendered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("undefined"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(render("{{ d.missing is defined }}|{{ d.missing | default('u') }}", ordered_json{{"d", {{"a", 1}}}}),
            "False|u");
}

TEST(ServerJinja, CrLfReadAsLf) {
  // Jinja2 reads \r\n and \r as \n in text and string literals (a template saved with CRLF line endings renders
  // as the LF one; trim_blocks eats the \r\n after a block); an escaped "\r" stays.
  EXPECT_EQ(render("{{ 'a\r\nb' }}|x\r\ny\rz"), "a\nb|x\ny\nz");
  EXPECT_EQ(render("{% if 1 %}\r\nA{% endif %}\r\n"), "A");
  EXPECT_EQ(render("{{ '\\r' }}"), "\r");
}

TEST(ServerJinja, StrftimeNowIsTheLocalTimeNow) {
  // transformers' strftime_now(format) = datetime.now().strftime(format): templates such as Granite 3's put
  // "Today's Date: " + strftime_now('%B %d, %Y') in the system prompt (it rendered as "" before).
  const auto now_as = [](const char* f) {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[64];
    return std::string(buf, std::strftime(buf, sizeof buf, f, &tm));
  };
  const std::string year = now_as("%Y");
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), year);
  const std::string date = render("Today's Date: {{ strftime_now('%B %d, %Y') }}.");
  EXPECT_NE(date.find(year + "."), std::string::npos) << date;
  EXPECT_GT(date.size(), std::string("Today's Date: , .").size() + year.size()) << date;
  EXPECT_EQ(render("[{{ strftime_now('') }}]"), "[]");
  EXPECT_EQ(render("{{ strftime_now('%%') }}"), "%");
  EXPECT_EQ(render("{{ strftime_now('%Y' * 1000) | length }}"), std::to_string(1000 * year.size()));
  EXPECT_THROW(render("{{ strftime_now() }}"), Error);
  EXPECT_THROW(render("{{ strftime_now(5) }}"), Error);
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

TEST(ServerChatTemplate, MalformedTokenizerConfigTemplateIsAnErrorNamingIt) {
  // A "chat_template" that is neither a string, a list of {"name", "template"} nor null was skipped, and the
  // checkpoint silently chatted with the plain default template.
  const auto dir = std::filesystem::temp_directory_path() / ("ssm_chat_template_bad_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"chat_template": 5})", R"(field "chat_template" must be a string or a list)"},
      {R"({"chat_template": {"default": "x"}})", R"(field "chat_template" must be a string or a list)"},
      {R"({"chat_template": [{"name": "default", "template": "x"}, {"name": "tool_use"}]})", R"("chat_template"[1] must be)"},
      {R"({"chat_template": ["x"]})", R"("chat_template"[0] must be)"},
  };
  for (const auto& [cfg, expect] : cases) {
    SCOPED_TRACE(cfg);
    std::ofstream(dir / "tokenizer_config.json") << cfg;
    try {
      ChatTemplate::load(dir);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    }
  }
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": null})";
  EXPECT_TRUE(ChatTemplate::load(dir).is_default());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ssmserve::server
