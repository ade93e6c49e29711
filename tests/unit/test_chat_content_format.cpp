// Owns the tests of the chat content format (chat/content_format.h): vLLM's detection of templates that loop over a
// message's content (expected formats of the published templates from vLLM's _detect_content_format run with jinja2
// on the same files), the normalization of message content to each format, and ChatTemplate::apply with it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "chat/content_format.h"
#include "chat/jinja.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::ordered_json;
using server::ChatContentFormat;
using server::ChatTemplate;
using server::ChatTemplateInputs;
using ::testing::HasSubstr;

const std::filesystem::path kChat = std::filesystem::path(SSMSERVE_SOURCE_DIR) / "tests/data/tokenizers/chat";

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatContentFormat detect(const std::string& source) {
  return server::detect_chat_content_format(server::jinja::Template(source).statements());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatContentFormat, PublishedTemplatesDetectAsVllm) {
  // vLLM's _detect_content_format (its jinja2 AST walk) on these files gives these.
  const std::map<std::string, ChatContentFormat> want = {
      {"falcon_h1", ChatContentFormat::String},        {"granite4", ChatContentFormat::OpenAI},
      {"jamba", ChatContentFormat::String},            {"minimax_text_01", ChatContentFormat::OpenAI},
      {"nemotron3_nano", ChatContentFormat::String},   {"nemotron3_nano_crlf", ChatContentFormat::String},
      {"nemotron_nano_v2", ChatContentFormat::String}, {"qwen3", ChatContentFormat::String},
      {"qwen3_5", ChatContentFormat::OpenAI},          {"qwen3_6", ChatContentFormat::OpenAI},
      {"qwen3_coder_xml", ChatContentFormat::String},  {"qwen3_next_instruct", ChatContentFormat::String},
      {"qwen3_next_thinking", ChatContentFormat::String}};
  for (const auto& [name, format] : want)
    EXPECT_EQ(detect(read_text(kChat / (name + ".jinja"))), format) << name;
  EXPECT_EQ(detect(server::kDefaultChatTemplate), ChatContentFormat::String);
}

TEST(ChatContentFormat, DetectionFollowsVllmsRules) {
  using F = ChatContentFormat;
  // A loop over a message's content, by index or attribute, through filters, tests and slices.
  EXPECT_EQ(detect("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"), F::OpenAI);
  EXPECT_EQ(detect("{% for m in messages %}{% for p in m.content | reverse %}{% endfor %}{% endfor %}"), F::OpenAI);
  EXPECT_EQ(detect("{% for m in messages[1:] %}{% for p in m.content[1:] %}{% endfor %}{% endfor %}"), F::OpenAI);
  // Messages taken through variables (transitively), and inside a macro or a branch.
  EXPECT_EQ(detect("{% set a = messages[1:] %}{% set b = a %}{% if x %}{% for m in b %}{% for p in m.content %}"
                   "{% endfor %}{% endfor %}{% endif %}"),
            F::OpenAI);
  EXPECT_EQ(detect("{% macro r(content) %}{% for item in content %}{{ item.text }}{% endfor %}{% endmacro %}"), F::OpenAI);
  // Only reading content, a loop over something else, or over a content not taken from a message loop: string.
  EXPECT_EQ(detect("{% for m in messages %}{{ m.content }}{% if m.content is string %}{% endif %}{% endfor %}"), F::String);
  EXPECT_EQ(detect("{% for m in messages %}{% for t in m.tool_calls %}{% endfor %}{% endfor %}"), F::String);
  EXPECT_EQ(detect("{% for m in history %}{% for p in m.content %}{% endfor %}{% endfor %}"), F::String);
  EXPECT_EQ(detect("{% for k, v in messages %}{% for p in k.content %}{% endfor %}{% endfor %}"), F::String);
  EXPECT_EQ(detect(""), F::String);
}

TEST(ChatContentFormat, NormalizesContentToEachFormat) {
  const ordered_json msgs = ordered_json::parse(R"([
      {"role": "system", "content": "S", "name": "n"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "extra": 1}]},
      {"role": "assistant", "content": null, "tool_calls": []},
      {"role": "user"},
      "not a message"])");
  const ordered_json as_string = server::normalize_chat_content(msgs, ChatContentFormat::String);
  EXPECT_EQ(as_string, ordered_json::parse(R"([
      {"role": "system", "content": "S", "name": "n"},
      {"role": "user", "content": "a\nb"},
      {"role": "assistant", "content": "", "tool_calls": []},
      {"role": "user", "content": ""},
      "not a message"])"));
  const ordered_json as_parts = server::normalize_chat_content(msgs, ChatContentFormat::OpenAI);
  EXPECT_EQ(as_parts, ordered_json::parse(R"([
      {"role": "system", "content": [{"type": "text", "text": "S"}], "name": "n"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": [], "tool_calls": []},
      {"role": "user", "content": []},
      "not a message"])"));
  EXPECT_EQ(server::chat_content_text(msgs[1]["content"]), "a\nb");
  // vLLM's other text parts: plain strings, input_text / output_text, refusal, thinking (each under its own key).
  const ordered_json more = ordered_json::parse(R"(["s", {"type": "input_text", "text": "i"},
      {"type": "output_text", "text": "o"}, {"type": "refusal", "refusal": "r"}, {"type": "thinking", "thinking": "t"}])");
  EXPECT_EQ(server::chat_content_text(more), "s\ni\no\nr\nt");
  EXPECT_EQ(server::normalize_chat_content(ordered_json::array({{{"role", "user"}, {"content", more}}}),
                                           ChatContentFormat::OpenAI)[0]["content"][3],
            ordered_json::parse(R"({"type": "text", "text": "r"})"));
  for (const char* bad_part : {R"({"type": "refusal", "text": "r"})", R"({"type": "image_url"})", R"(3)"})
    EXPECT_FALSE(server::chat_part_text(ordered_json::parse(bad_part))) << bad_part;
  EXPECT_EQ(server::chat_content_text(ordered_json()), "");
  for (const char* bad : {R"([{"role": "user", "content": [{"type": "image_url"}]}])", R"([{"role": "user", "content": 3}])",
                          R"([{"role": "user", "content": [["x"]]}])"})
    for (auto f : {ChatContentFormat::String, ChatContentFormat::OpenAI})
      EXPECT_NE(error_of([&] { server::normalize_chat_content(ordered_json::parse(bad), f); }), "(no error)") << bad;
  EXPECT_EQ(server::parse_chat_content_format("openai", "--x"), ChatContentFormat::OpenAI);
  EXPECT_THAT(error_of([] { server::parse_chat_content_format("parts", "--chat-template-content-format"); }),
              HasSubstr("--chat-template-content-format must be one of auto, string, openai (got 'parts')"));
}

TEST(ChatContentFormat, ApplyRendersEachTemplateInItsFormat) {
  // MiniMax-Text-01's template indexes content parts: with Auto, string content renders as the parts would as
  // given (transformers' rendering of OpenAI content); without a format (transformers' apply_chat_template) a
  // string content fails there, as in transformers.
  const ChatTemplate minimax = ChatTemplate::from_source(read_text(kChat / "minimax_text_01.jinja"), "<s>", "</s>");
  const ordered_json plain = ordered_json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])");
  const ordered_json parts = server::normalize_chat_content(plain, ChatContentFormat::OpenAI);
  ChatTemplateInputs given, vllm;
  given.add_generation_prompt = vllm.add_generation_prompt = true;
  vllm.content_format = ChatContentFormat::Auto;
  EXPECT_EQ(minimax.content_format(vllm), ChatContentFormat::OpenAI);
  const std::string want = minimax.apply(parts, given);
  EXPECT_THAT(want, HasSubstr("Hi"));
  EXPECT_EQ(minimax.apply(plain, vllm), want);
  EXPECT_EQ(minimax.apply(parts, vllm), want);
  EXPECT_NE(error_of([&] { minimax.apply(plain, given); }), "(no error)");
  // Qwen3's template reads content as a string: parts are joined with newlines first.
  const ChatTemplate qwen3 = ChatTemplate::from_source(read_text(kChat / "qwen3.jinja"));
  const ordered_json two = ordered_json::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])");
  EXPECT_EQ(qwen3.apply(two, vllm),
            qwen3.apply(ordered_json::parse(R"([{"role": "user", "content": "a\nb"}])"), given));
  // An explicit format wins over the detection; continue_final_message continues the last text part.
  ChatTemplateInputs forced = vllm;
  forced.content_format = ChatContentFormat::String;
  EXPECT_EQ(qwen3.content_format(forced), ChatContentFormat::String);
  const ChatTemplate loop = ChatTemplate::from_source(
      "{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}L:{% for p in m.content %}"
      "{{ p.text }};{% endfor %}{% endif %}|{% endfor %}");
  EXPECT_EQ(loop.apply(plain, vllm), "L:S;|L:Hi;|");
  EXPECT_EQ(loop.apply(two, forced), "S:a\nb|");
  ChatTemplateInputs cont = vllm;
  cont.add_generation_prompt = false;
  cont.continue_final_message = true;
  EXPECT_EQ(loop.apply(plain, cont), "L:S;|L:Hi");
}

}  // namespace
}  // namespace ssmserve
