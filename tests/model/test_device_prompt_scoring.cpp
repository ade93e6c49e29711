// Prompt scoring through the device sampling contract (issue 34 item 4: prompt logprobs' top-k on the device when
// the model runs there). A test backend ("hostsim") wraps the CPU model and implements CausalLM::forward_sample on
// the host exactly as the CUDA runner's contract says: a row with SampleRowParams::score_token gets its raw top
// logprobs, that token's raw logprob and its rank; every other row is left to the host sampler (kPickOnHost with
// its raw logits, a valid device answer). The engine must then give the same prompt logprobs, tokens and
// logprobs as on the CPU, bit for bit, with scoring spread over chunks, sampled and greedy requests side by side.
// tests/cuda/test_cuda_sampling.cpp checks the CUDA kernel's score rows against the same CPU functions.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "engine/llm_engine.h"
#include "engine/sampler.h"
#include "model/causal_lm.h"
#include "forwarding_lm.h"
#include "test_util.h"

namespace ssmserve {
namespace {

int g_score_rows = 0;     // score rows the simulated device answered
int g_sample_calls = 0;   // forward_sample calls

/// The CPU model behind the device sampling contract (see the file comment).
class HostSampledLM final : public testing::ForwardingLM {
 public:
  using ForwardingLM::ForwardingLM;
  bool forward_sample(const ForwardBatch& batch, StateCache& cache, const DeviceSampleBatch& sample,
                      std::vector<GreedyPick>& out) override {
    ++g_sample_calls;
    const size_t n = batch.logits_indices.size(), V = static_cast<size_t>(config().vocab_size);
    EXPECT_EQ(sample.rows.size(), n);
    std::vector<float> logits(n * V);
    inner().forward(batch, cache, logits.data());
    out.assign(n, GreedyPick{});
    for (size_t i = 0; i < n; ++i) {
      const std::span<const float> row(logits.data() + i * V, V);
      GreedyPick& g = out[i];
      const SampleRowParams& p = sample.rows[i];
      if (p.score_token < 0) {  // left to the host sampler
        g.token = kPickOnHost;
        g.logits.assign(row.begin(), row.end());
        continue;
      }
      ++g_score_rows;
      EXPECT_EQ(p.temperature, 0.0f);  // a scoring row's pick is unused: packed greedy
      g.token = static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
      for (const TokenLogprob& t : top_logprobs(row, p.num_top, &g.score_logprob, p.score_token))
        g.top.emplace_back(t.id, t.logprob);
      const float t = row[static_cast<size_t>(p.score_token)];
      g.score_rank = 1 + static_cast<int>(std::count_if(row.begin(), row.end(), [&](float x) { return x > t; }));
    }
    return true;
  }
};

std::vector<RequestOutput> run(const std::string& device, int budget) {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  cfg.num_threads = 1;
  cfg.device = device;
  cfg.scheduler.max_num_batched_tokens = budget;
  LLMEngine engine(cfg);
  for (int i = 0; i < 5; ++i) {
    Request r;
    r.request_id = std::to_string(i);
    for (int t = 0; t < 40 + 37 * i; ++t) r.prompt_token_ids.push_back(100 + (t * 13 + 5 * i) % 4000);
    r.params.max_tokens = 6;
    if (i != 3) r.params.prompt_logprobs = std::vector<int>{0, 1, 5, 0, 20}[static_cast<size_t>(i)];
    r.params.temperature = 0.0;  // greedy, except:
    if (i % 2 == 1) {  // sampled, seeded (the uniform is drawn for the device step and used by the host sampler)
      r.params.temperature = 0.8;
      r.params.top_p = 0.9;
      r.params.seed = 7 + i;
      r.params.presence_penalty = 0.5;
    }
    r.params.logprobs = 3;
    engine.add_request(r);
  }
  std::vector<RequestOutput> done;
  while (engine.has_unfinished_requests())
    for (auto& o : engine.step())
      if (o.finished) done.push_back(std::move(o));
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  return done;
}

TEST(DevicePromptScoring, SameAsTheHostOnEveryChunking) {
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  register_device_model(
      "hostsim", "MambaForCausalLM",
      [](const ModelConfig& c, LoadFormat f) -> std::unique_ptr<CausalLM> {
        return std::make_unique<HostSampledLM>(load_model(c, f));
      },
      [] { return true; });
  for (const int budget : {2048, 64, 29}) {
    SCOPED_TRACE(budget);
    g_score_rows = g_sample_calls = 0;
    const auto host = run("cpu", budget);
    EXPECT_EQ(g_sample_calls, 0);
    const auto dev = run("hostsim", budget);
    EXPECT_GT(g_sample_calls, 0);
    // every scored prompt token of requests 0, 1, 2, 4 went through a device score row
    EXPECT_EQ(g_score_rows, 39 + 76 + 113 + 187);
    ASSERT_EQ(host.size(), 5u);
    ASSERT_EQ(dev.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      SCOPED_TRACE(i);
      const CompletionOutput &a = host[i].outputs[0], &b = dev[i].outputs[0];
      EXPECT_EQ(a.token_ids, b.token_ids);
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t) {
        ASSERT_EQ(a.logprobs[t].size(), b.logprobs[t].size());
        for (size_t k = 0; k < a.logprobs[t].size(); ++k) {
          EXPECT_EQ(a.logprobs[t][k].id, b.logprobs[t][k].id);
          EXPECT_EQ(a.logprobs[t][k].logprob, b.logprobs[t][k].logprob);
        }
      }
      ASSERT_EQ(host[i].prompt_logprobs.size(), dev[i].prompt_logprobs.size());
      for (size_t p = 0; p < host[i].prompt_logprobs.size(); ++p) {
        const auto &x = host[i].prompt_logprobs[p], &y = dev[i].prompt_logprobs[p];
        ASSERT_EQ(x.has_value(), y.has_value()) << p;
        if (!x) continue;
        EXPECT_EQ(x->token_logprob, y->token_logprob) << p;
        EXPECT_EQ(x->rank, y->rank) << p;
        ASSERT_EQ(x->top.size(), y->top.size()) << p;
        for (size_t k = 0; k < x->top.size(); ++k) {
          EXPECT_EQ(x->top[k].id, y->top[k].id);
          EXPECT_EQ(x->top[k].logprob, y->top[k].logprob);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ssmserve
