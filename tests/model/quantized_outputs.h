// Owns the comparison of the quantized-checkpoint tests (tests/model/test_fp8_checkpoint.cpp,
// tests/model/test_int_checkpoint.cpp): a model's greedy outputs with logprobs on the CPU, and their bit-for-bit
// equality with another checkpoint's.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/causal_lm.h"
#include "test_util.h"

namespace ssmserve::testing {

/// Greedy continuations (12 tokens) with their top-5 logprobs, and the prompt logprobs, of three prompts on the CPU
/// under --dtype `dtype`, chunked prefill included (the tiny-mamba tokenizer).
inline std::vector<RequestOutput> greedy_outputs(const std::filesystem::path& dir, const std::string& dtype) {
  EngineConfig cfg;
  cfg.model = dir;
  cfg.tokenizer = model_dir("tiny-mamba");
  cfg.dtype = dtype;
  cfg.scheduler.max_num_batched_tokens = 61;  // chunked prefill too
  LLM llm(cfg);
  SamplingParams sp;
  sp.temperature = 0.0, sp.ignore_eos = true, sp.logprobs = 5, sp.prompt_logprobs = 5, sp.max_tokens = 12;
  return llm.generate({"It is a truth universally acknowledged", "The", "In the beginning God created the heaven"}, sp);
}

/// The same tokens, and bit-identical logprobs and prompt logprobs.
inline void expect_identical(const std::vector<RequestOutput>& a, const std::vector<RequestOutput>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].outputs[0].token_ids, b[i].outputs[0].token_ids) << i;
    for (size_t s = 0; s < a[i].outputs[0].logprobs.size(); ++s)
      for (size_t k = 0; k < a[i].outputs[0].logprobs[s].size(); ++k) {
        EXPECT_EQ(a[i].outputs[0].logprobs[s][k].id, b[i].outputs[0].logprobs[s][k].id) << i << " " << s;
        EXPECT_EQ(a[i].outputs[0].logprobs[s][k].logprob, b[i].outputs[0].logprobs[s][k].logprob) << i << " " << s;
      }
    for (size_t p = 1; p < a[i].prompt_logprobs.size(); ++p)
      EXPECT_EQ(a[i].prompt_logprobs[p]->token_logprob, b[i].prompt_logprobs[p]->token_logprob) << i << " " << p;
  }
}

/// The message of the Error that loading `dir` on the CPU throws ("" when it loads).
inline std::string load_error(const std::filesystem::path& dir) {
  try {
    (void)load_model(dir, LoadFormat::Auto, "cpu", 1, std::nullopt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace ssmserve::testing
