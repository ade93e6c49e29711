// Owns the tests of the supported families' published chat templates (Qwen3, the Qwen3-Coder XML tool format,
// Qwen3.5, Qwen3.6, Qwen3-Next Instruct / Thinking, Granite-4.0, Nemotron Nano v2, Nemotron-3-Nano, Falcon-H1,
// Jamba-Mini-1.7, MiniMax-Text-01) against transformers'
// apply_chat_template (expected strings from tools/make_chat_template_family_cases.py), and of how templates are found
// in a checkpoint folder (chat_template.jinja, additional_chat_templates/, named templates in tokenizer_config.json).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "chat/chat_template.h"
#include "checkpoint_fixtures.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::ordered_json;
using server::ChatTemplate;
using server::ChatTemplateInputs;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_file;

const std::filesystem::path kChat = std::filesystem::path(SSMSERVE_SOURCE_DIR) / "tests/data/tokenizers/chat";

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatFamilies, PublishedTemplatesRenderAsTransformers) {
  std::ifstream in(kChat / "cases.jsonl");
  ASSERT_TRUE(in.good());
  int n = 0, bad = 0;
  for (std::string line; std::getline(in, line);) {
    const ordered_json c = ordered_json::parse(line);
    const std::string name = c["template"];
    const ChatTemplate t =
        ChatTemplate::from_source(read_text(kChat / (name + ".jinja")), "<|begin_of_text|>", "<|end_of_text|>");
    ChatTemplateInputs in;
    in.add_generation_prompt = c["add_generation_prompt"];
    in.continue_final_message = c["continue_final_message"];
    in.tools = c["tools"];
    in.documents = c["documents"];
    in.kwargs = c["kwargs"];
    const std::string what = name + " / " + c["conversation"].get<std::string>() + " / agp " +
                             c["add_generation_prompt"].dump() + " tools " + (in.tools.is_null() ? "no" : "yes") +
                             " kwargs " + in.kwargs.dump() + " continue " + c["continue_final_message"].dump();
    ++n;
    if (c["expected"].is_null()) {
      if (error_of([&] { t.apply(c["messages"], in); }) == "(no error)" && ++bad <= 10)
        ADD_FAILURE() << what << ": transformers raises, ssmserve rendered";
      continue;
    }
    std::string got;
    const std::string err = error_of([&] { got = t.apply(c["messages"], in); });
    if (err != "(no error)") {
      if (++bad <= 10) ADD_FAILURE() << what << ": " << err;
    } else if (got != c["expected"].get<std::string>() && ++bad <= 10) {
      ADD_FAILURE() << what << ":\n--- got\n" << got << "\n--- want\n" << c["expected"].get<std::string>();
    }
  }
  EXPECT_GT(n, 100);
  EXPECT_EQ(bad, 0);
}

TEST(ChatFamilies, TemplatesAreFoundAsTransformersFindsThem) {
  TempDir dir("chat-files");
  const ordered_json user = ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  ChatTemplateInputs in;
  // tokenizer_config.json: a list of named templates; tools pick tool_use, a name picks that one.
  write_file(dir / "tokenizer_config.json",
             R"({"bos_token": "<s>", "chat_template": [{"name": "default", "template": "D{{ bos_token }}"},
                 {"name": "tool_use", "template": "T{{ tools | length }}"}, {"name": "rag", "template": "R"}]})");
  ChatTemplate t = ChatTemplate::load(dir.path());
  EXPECT_EQ(t.apply(user, in), "D<s>");
  EXPECT_THAT(t.template_names(), ::testing::ElementsAre("default", "rag", "tool_use"));
  in.tools = ordered_json::array({{{"type", "function"}}});
  EXPECT_EQ(t.apply(user, in), "T1");
  in.template_name = "rag";
  EXPECT_EQ(t.apply(user, in), "R");
  in.template_name = "nope";
  EXPECT_THAT(error_of([&] { t.apply(user, in); }), HasSubstr("no chat template named 'nope' (available: default, rag, tool_use)"));
  // chat_template.jinja and additional_chat_templates/ take priority over tokenizer_config.json.
  write_file(dir / "chat_template.jinja", "F{{ messages[0].content }}");
  std::filesystem::create_directories(dir / "additional_chat_templates");
  write_file(dir / "additional_chat_templates" / "tool_use.jinja", "FT");
  t = ChatTemplate::load(dir.path());
  in = {};
  EXPECT_EQ(t.apply(user, in), "Fhi");
  in.tools = ordered_json::array();
  EXPECT_EQ(t.apply(user, in), "FT");
  EXPECT_THAT(t.template_names(), ::testing::ElementsAre("default", "tool_use"));
  // Only named templates, none called default: a name is needed.
  std::filesystem::remove(dir / "chat_template.jinja");
  t = ChatTemplate::load(dir.path());
  in = {};
  EXPECT_THAT(error_of([&] { t.apply(user, in); }), HasSubstr("none is named default"));
  // A template that does not parse names its file.
  write_file(dir / "additional_chat_templates" / "tool_use.jinja", "{% if %}");
  EXPECT_THAT(error_of([&] { ChatTemplate::load(dir.path()); }), HasSubstr("chat template 'tool_use'"));
}

TEST(ChatFamilies, Qwen35CheckpointLayout) {
  // Qwen3.5 / 3.6 checkpoints ship the template as chat_template.jinja next to a tokenizer_config.json without one
  // (bos_token null, eos_token <|im_end|>); enable_thinking / preserve_thinking arrive as chat_template_kwargs.
  const ordered_json msgs = ordered_json::parse(R"([
      {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]},
      {"role": "assistant", "content": "Yo", "reasoning_content": "greet"},
      {"role": "user", "content": "Again"}])");
  for (const char* name : {"qwen3_5", "qwen3_6"}) {
    SCOPED_TRACE(name);
    TempDir dir("qwen35-layout");
    write_file(dir / "chat_template.jinja", read_text(kChat / (std::string(name) + ".jinja")));
    write_file(dir / "tokenizer_config.json", R"({"bos_token": null, "eos_token": "<|im_end|>"})");
    const ChatTemplate t = ChatTemplate::load(dir.path());
    EXPECT_EQ(t.source(), read_text(kChat / (std::string(name) + ".jinja")));
    // The published bytes (no trailing newline; tools/make_chat_template_family_cases.py checks their SHA-256).
    EXPECT_EQ(t.source().size(), std::string(name) == "qwen3_5" ? 7756u : 7764u);
    ChatTemplateInputs in;
    in.add_generation_prompt = true;
    const std::string head = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi<|im_end|>\n";
    const std::string tail = "<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n";
    EXPECT_EQ(t.apply(msgs, in), head + "<|im_start|>assistant\nYo<|im_end|>\n" + tail + "<think>\n");
    in.kwargs = {{"enable_thinking", false}, {"preserve_thinking", true}};
    const std::string kept = std::string(name) == "qwen3_6" ? "<think>\ngreet\n</think>\n\n" : "";
    EXPECT_EQ(t.apply(msgs, in),
              head + "<|im_start|>assistant\n" + kept + "Yo<|im_end|>\n" + tail + "<think>\n\n</think>\n\n");
    EXPECT_THAT(error_of([&] { t.apply(ordered_json::array({{{"role", "assistant"}, {"content", "x"}}}), in); }),
                HasSubstr("No user query found in messages."));
  }
}

TEST(ChatFamilies, KwargsAndReasoningAliases) {
  const ChatTemplate t = ChatTemplate::from_source(
      "{{ enable_thinking }}|{{ tools is none }}|{% for m in messages %}{{ m.thinking }}/{{ m.reasoning_content }}"
      "{% endfor %}|{{ bos_token }}");
  ChatTemplateInputs in;
  in.kwargs = {{"enable_thinking", false}, {"bos_token", "<B>"}, {"messages", "ignored"}};
  const ordered_json msgs = ordered_json::array({{{"role", "assistant"}, {"content", "x"}, {"reasoning", "r1"}}});
  EXPECT_EQ(t.apply(msgs, in), "False|True|r1/r1|<B>");
  in.continue_final_message = true;
  in.add_generation_prompt = true;
  EXPECT_THAT(error_of([&] { t.apply(msgs, in); }), HasSubstr("not compatible"));
}

}  // namespace
}  // namespace ssmserve
