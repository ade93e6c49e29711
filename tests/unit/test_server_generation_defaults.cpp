// The model's default sampling params in the OpenAI request parsing (vLLM's to_sampling_params with
// default_sampling_params): a field the body leaves out (or sends as null) takes the default, one it sends keeps its
// own value, for /v1/completions and /v1/chat/completions alike; without defaults nothing changes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/protocol.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;

json chat_body(json extra) {
  json b = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

json completion_body(json extra) {
  json b = {{"prompt", "hi"}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

GenerationDefaults qwen_like() {
  GenerationDefaults d;
  d.temperature = 0.6;
  d.top_p = 0.95;
  d.top_k = 20;
  d.min_p = 0.01;
  d.repetition_penalty = 1.05;
  d.max_tokens = 300;
  return d;
}

/// The SamplingParams of a chat and a completions body with `extra`, parsed with `defaults`.
std::pair<SamplingParams, SamplingParams> parse_both(const json& extra, const GenerationDefaults& defaults) {
  return {parse_chat_request(chat_body(extra), kMaxLogprobs, defaults).params,
          parse_completion_request(completion_body(extra), kMaxLogprobs, defaults).params};
}

TEST(ServerGenerationDefaults, AbsentFieldsTakeTheDefaults) {
  const GenerationDefaults d = qwen_like();
  for (const json& extra : {json::object(), json{{"temperature", nullptr}, {"top_p", nullptr}, {"top_k", nullptr},
                                                 {"min_p", nullptr}, {"repetition_penalty", nullptr}}}) {
    const auto [chat, completion] = parse_both(extra, d);
    for (const SamplingParams& sp : {chat, completion}) {
      EXPECT_EQ(sp.temperature, 0.6) << extra.dump();
      EXPECT_EQ(sp.top_p, 0.95);
      EXPECT_EQ(sp.top_k, 20);
      EXPECT_EQ(sp.min_p, 0.01);
      EXPECT_EQ(sp.repetition_penalty, 1.05);
      EXPECT_EQ(sp.presence_penalty, 0.0) << "no default: SamplingParams'";
    }
  }
  // Completions keep OpenAI's (and vLLM's) max_tokens default of 16; chat's is the server's per prompt
  // (max_tokens_given false: the default capped by the context, http_server.cpp).
  EXPECT_EQ(parse_completion_request(completion_body({}), kMaxLogprobs, d).params.max_tokens, 16);
  EXPECT_FALSE(parse_chat_request(chat_body({}), kMaxLogprobs, d).max_tokens_given);
}

TEST(ServerGenerationDefaults, GivenFieldsKeepTheirOwn) {
  const json extra = {{"temperature", 0.0}, {"top_p", 0.5}, {"top_k", -1}, {"min_p", 0.0}, {"repetition_penalty", 1.0},
                      {"max_tokens", 5}};
  const auto [chat, completion] = parse_both(extra, qwen_like());
  for (const SamplingParams& sp : {chat, completion}) {
    EXPECT_EQ(sp.temperature, 0.0);
    EXPECT_TRUE(sp.greedy());
    EXPECT_EQ(sp.top_p, 0.5);
    EXPECT_EQ(sp.top_k, -1);
    EXPECT_EQ(sp.min_p, 0.0);
    EXPECT_EQ(sp.repetition_penalty, 1.0);
    EXPECT_EQ(sp.max_tokens, 5);
  }
  // One field given, the others from the defaults.
  const auto [c2, p2] = parse_both({{"temperature", 1.3}}, qwen_like());
  EXPECT_EQ(c2.temperature, 1.3);
  EXPECT_EQ(c2.top_k, 20);
  EXPECT_EQ(p2.temperature, 1.3);
  EXPECT_EQ(p2.top_p, 0.95);
}

TEST(ServerGenerationDefaults, NoDefaultsKeepVllmsNeutralValues) {
  const SamplingParams plain;
  const auto [chat, completion] = parse_both(json::object(), GenerationDefaults{});
  for (const SamplingParams& sp : {chat, completion}) {
    EXPECT_EQ(sp.temperature, plain.temperature);
    EXPECT_EQ(sp.top_p, plain.top_p);
    EXPECT_EQ(sp.top_k, plain.top_k);
    EXPECT_EQ(sp.min_p, plain.min_p);
    EXPECT_EQ(sp.repetition_penalty, plain.repetition_penalty);
  }
  EXPECT_EQ(completion.max_tokens, 16);
}

}  // namespace
}  // namespace ssmserve::server
