// ResponseBuilder::final_body (issue 34 item 4): the spliced serialization of a completions response is byte for
// byte the dump of final_response(), with echo + logprobs over several prompts and n > 1 (the prompt's logprobs
// serialized once and repeated in each of its choices), without logprobs, and with a stop string that looks like
// the splice tag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/serving.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;  // the builder's own type: the dump compares byte for byte

RequestOutput finished_output(int prompt, int choice, bool with_prompt_lp) {
  RequestOutput o;
  o.request_id = "r";
  o.prompt_token_ids = {10 + prompt, 11, 12};
  if (with_prompt_lp) {
    o.prompt_logprobs.resize(3);
    for (int t = 1; t < 3; ++t) {
      PromptLogprob lp;
      lp.token_logprob = -0.5f * t - prompt;
      lp.rank = t;
      lp.top = {{5, -0.25f}, {6, -1.5f}, {7, -2.0f}};
      o.prompt_logprobs[t] = lp;
    }
  }
  o.outputs.resize(1);
  o.outputs[0].token_ids = {20 + choice, 21};
  o.outputs[0].logprobs = {{{20 + choice, -0.1f}, {5, -0.2f}}, {{21, -0.3f}, {6, -0.4f}}};
  o.outputs[0].finish_reason = FinishReason::Stop;
  o.outputs[0].stop_reason = "ssm-lp-0000000000000000-0";
  o.finished = true;
  return o;
}

TEST(ResponseBody, SplicedBodyEqualsTheDump) {
  for (const bool logprobs : {true, false}) {
    for (const bool echo : {true, false}) {
      auto job = std::make_shared<GenerationJob>();
      job->id = "cmpl-1";
      job->n = 3;
      job->echo = echo;
      if (logprobs) job->logprobs = 2;
      for (int p = 0; p < 2; ++p) job->prompts.push_back({"prompt " + std::to_string(p), {10 + p, 11, 12}});
      for (int i = 0; i < 6; ++i) job->request_ids.push_back("r" + std::to_string(i));
      ResponseBuilder rb(job);
      for (int i = 0; i < 6; ++i) rb.on_output(i, finished_output(i / 3, i % 3, echo && logprobs && i % 3 == 0));
      ASSERT_TRUE(rb.all_finished());
      const json whole = rb.final_response();
      EXPECT_EQ(rb.final_body(), whole.dump(-1, ' ', false, json::error_handler_t::replace)) << logprobs << echo;
      if (logprobs && echo) {  // each choice lists its prompt's tokens, then its own
        EXPECT_EQ(whole["choices"][4]["logprobs"]["token_logprobs"].size(), 5u);
        EXPECT_TRUE(whole["choices"][4]["logprobs"]["token_logprobs"][0].is_null());
        EXPECT_FLOAT_EQ(whole["choices"][4]["logprobs"]["token_logprobs"][1].get<float>(), -1.5f);
      }
    }
  }
}

}  // namespace
}  // namespace ssmserve::server
