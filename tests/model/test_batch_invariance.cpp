// Batch invariance (issue: engine core; Mamba-1, Mamba-2, the MiniMax hybrid, the Mamba hybrids: Granite-4.0-H and
// Nemotron-H checkpoints, dummy-weight Falcon-H1 (Mamba-2 state and KV in every layer) and Jamba (Mamba-1 + MoE), and
// the Gated DeltaNet hybrids: the tiny-qwen3_5_moe checkpoint, dummy-weight Qwen3.5 (dense) and Qwen3-Next):
// for random sets of 1-16 prompts of random lengths (1-700 tokens), random arrival steps, token budgets
// {1, 7, 13, 61, 512, 4096}, max_num_seqs {1, 3, 16} and state pools of the fewest blocks one request needs (+0-1)
// with forced preemptions, every request's greedy output equals running it alone: identical ids and
// logprobs within 1e-4. Bit-identical whenever the prompts are cut the same way (every kernel is batch-invariant:
// BatchedUncutEqualsAloneBitForBit); Mamba-1's scan also gives the same bits for any cut, while the chunked forms
// (Mamba-2 SSD, lightning attention) round differently when a prompt is cut mid-chunk (gaps of ~4e-6 on
// tiny-mamba2 at budget 7). PromptCutIntoStepsEqualsWhole cuts one prompt at a time inside and on the chunk grid;
// the gated delta rule counts its chunks from the sequence start, so cuts on the grid give the uncut bits (a last
// piece of one token included: it is a one-token prefill row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "engine/llm_engine.h"
#include "test_util.h"

namespace ssmserve {
namespace {

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;
};

// A model under test: a checkpoint (shared models folder), or a dummy-weight config of tests/data/tiny-hybrids
// (weights seeded per tensor name; no tokenizer: the prompts are ids). `trials`: random schedules run, trial t with
// token budget budgets[t % size]. `exact_chunk` > 0: a prompt cut only on multiples of it gives the uncut run's bits.
struct ModelCase {
  std::string name;
  bool dummy = false;
  int trials = 12;
  std::vector<int> budgets = {1, 7, 13, 61, 512, 4096};
  int exact_chunk = 0;
};

std::ostream& operator<<(std::ostream& os, const ModelCase& m) { return os << m.name; }

// An engine configuration for `m` (budget, max_num_seqs and pool size left at their defaults).
EngineConfig base_config(const ModelCase& m) {
  EngineConfig cfg;
  if (m.dummy) {
    cfg.model = testing::source_dir() / "tests/data/tiny-hybrids" / m.name;
    cfg.load_format = LoadFormat::Dummy;
  } else {
    cfg.model = testing::model_dir(m.name);
  }
  return cfg;
}

bool available(const ModelCase& m) { return std::filesystem::exists(base_config(m).model / "config.json"); }

class BatchInvariance : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    cache_.clear();
    delete reference_;
    reference_ = nullptr;
    if (!available(GetParam())) return;
    // One request at a time: the null block, its state block and the KV blocks of up to 712 tokens (not the default
    // 257 pages, ~1 MB each on the hybrids, zeroed for every test).
    EngineConfig cfg = base_config(GetParam());
    cfg.num_state_blocks = 32;
    reference_ = new LLMEngine(cfg);
    if (const int kv = reference_->kv_block_size(); kv > 0 && 3 + 712 / kv > cfg.num_state_blocks) {
      delete reference_;
      cfg.num_state_blocks = 3 + 712 / kv;
      reference_ = new LLMEngine(cfg);
    }
  }
  static EngineConfig config() { return base_config(GetParam()); }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }

  static SamplingParams greedy(int max_tokens) {
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = true;
    sp.logprobs = 0;
    return sp;
  }

  // The request run alone in a fresh engine state (one prefill step, no chunking).
  static Outcome alone(const std::vector<int>& prompt, int max_tokens) {
    const auto key = std::make_pair(prompt, max_tokens);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    Request r;
    r.request_id = "ref";
    r.prompt_token_ids = prompt;
    r.params = greedy(max_tokens);
    reference_->add_request(r);
    Outcome o;
    while (reference_->has_unfinished_requests())
      for (const auto& out : reference_->step())
        if (out.finished) o = {out.outputs[0].token_ids, logprobs_of(out)};
    return cache_[key] = o;
  }

  static std::vector<float> logprobs_of(const RequestOutput& out) {
    std::vector<float> v;
    for (const auto& step : out.outputs[0].logprobs) v.push_back(step.at(0).logprob);
    return v;
  }

  static LLMEngine* reference_;
  static std::map<std::pair<std::vector<int>, int>, Outcome> cache_;
};

LLMEngine* BatchInvariance::reference_ = nullptr;
std::map<std::pair<std::vector<int>, int>, Outcome> BatchInvariance::cache_;

TEST_P(BatchInvariance, RandomSchedulesEqualRunningAlone) {
  if (!reference_) GTEST_SKIP() << GetParam() << " not found under " << testing::shared_models_dir().string();
  // The fewest blocks one 700-token request (+ 12 generated) needs: the null block, its state block and, with
  // softmax layers, its KV blocks (MiniMax: 192 tokens per block, 4 of them), or else one block for a cached state
  // (prefix caching, on by default, needs room for one). With several requests' KV in such a pool the scheduler also
  // preempts on its own.
  const int kv = reference_->kv_block_size();
  const int min_blocks = 2 + (kv > 0 ? (712 + kv - 1) / kv : 1);
  const std::vector<int>& budgets = GetParam().budgets;
  const int max_seqs[] = {1, 3, 16};
  std::mt19937 rng(20261129);
  int total_requests = 0, total_preemptions = 0, total_engine_preemptions = 0;
  for (int trial = 0; trial < GetParam().trials; ++trial) {
    // 1. A random workload: short prompts mostly, some long; the tiny budget gets short prompts only (time).
    const int budget = budgets[static_cast<size_t>(trial) % budgets.size()];
    const int seqs = max_seqs[(trial / 2) % 3];
    const int blocks = trial % 3 == 2 ? min_blocks + static_cast<int>(rng() % 2) : 0;
    const int n = 1 + static_cast<int>(rng() % 16);
    const int max_len = budget == 1 ? 40 : 700;
    std::vector<std::vector<int>> prompts(n);
    std::vector<int> max_tokens(n), arrival(n);
    for (int i = 0; i < n; ++i) {
      const int len = 1 + static_cast<int>(rng() % (rng() % 4 == 0 ? max_len : std::min(max_len, 60)));
      for (int t = 0; t < len; ++t) prompts[i].push_back(2 + static_cast<int>(rng() % 50000));
      max_tokens[i] = 1 + static_cast<int>(rng() % 12);
      arrival[i] = static_cast<int>(rng() % 8);
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + ": budget " + std::to_string(budget) + ", max_num_seqs " +
                 std::to_string(seqs) + ", blocks " + std::to_string(blocks) + ", " + std::to_string(n) + " prompts");
    // 2. Run them together with staggered arrivals and (with a small pool) forced preemptions.
    EngineConfig cfg = config();
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.max_num_seqs = seqs;
    cfg.num_state_blocks = blocks;
    LLMEngine engine(cfg);
    std::map<std::string, Outcome> got;
    int added = 0;
    for (int step = 0; added < n || engine.has_unfinished_requests(); ++step) {
      for (int i = 0; i < n; ++i)
        if (arrival[i] == step || (step > 8 && i >= added && arrival[i] > step)) {
          Request r;
          r.request_id = std::to_string(i);
          r.prompt_token_ids = prompts[i];
          r.params = greedy(max_tokens[i]);
          engine.add_request(r);
          ++added;
        }
      // A few forced preemptions early in the run (each one restarts a request's prefill from token 0).
      if (blocks > 0 && step % 5 == 4 && step < 25) total_preemptions += engine.preempt_newest_request() ? 1 : 0;
      for (const auto& out : engine.step())
        if (out.finished) got[out.request_id] = {out.outputs[0].token_ids, logprobs_of(out)};
      ASSERT_LT(step, 100000) << "no progress";
    }
    total_engine_preemptions += engine.num_preemptions();  // forced + the scheduler's own (KV ran out)
    // 3. Every request equals its solo run.
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int i = 0; i < n; ++i) {
      const Outcome want = alone(prompts[i], max_tokens[i]);
      const Outcome& have = got[std::to_string(i)];
      ASSERT_EQ(have.ids, want.ids) << "request " << i << " (prompt length " << prompts[i].size() << ")";
      for (size_t s = 0; s < want.logprobs.size(); ++s) EXPECT_NEAR(have.logprobs[s], want.logprobs[s], 1e-4);
    }
    total_requests += n;
  }
  EXPECT_GT(total_preemptions, 0) << "the schedule never preempted";
  RecordProperty("engine_preemptions", total_engine_preemptions);
  RecordProperty("requests", total_requests);
  RecordProperty("preemptions", total_preemptions);
}

// Prompts prefilled whole, together in one step (the budget holds them all), then decoded as one batch: every
// request's ids and logprobs are exactly its solo run's (the rows only share the batch; no prompt is cut).
TEST_P(BatchInvariance, BatchedUncutEqualsAloneBitForBit) {
  if (!reference_) GTEST_SKIP() << GetParam() << " not found under " << testing::shared_models_dir().string();
  std::mt19937 rng(7);
  std::vector<std::vector<int>> prompts(6);
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int t = 0, len = 1 + static_cast<int>(rng() % 150); t < len; ++t) prompts[i].push_back(2 + static_cast<int>(rng() % 50000));
  EngineConfig cfg = config();
  cfg.scheduler.max_num_batched_tokens = 4096;
  LLMEngine engine(cfg);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params = greedy(9);
    engine.add_request(r);
  }
  std::map<std::string, Outcome> got;
  while (engine.has_unfinished_requests())
    for (const auto& out : engine.step())
      if (out.finished) got[out.request_id] = {out.outputs[0].token_ids, logprobs_of(out)};
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome want = alone(prompts[i], 9);
    EXPECT_EQ(got[std::to_string(i)].ids, want.ids) << "request " << i;
    EXPECT_EQ(got[std::to_string(i)].logprobs, want.logprobs) << "request " << i;
  }
}

// One prompt at a time, cut into steps by the token budget (alone in the engine, so every step but the last is a
// full budget): inside the chunk grid (7, 61, 63, 65) and, where the model has one, on it (64, 128: every cut a
// multiple of the DeltaNet chunk). Prompt lengths around one chunk and past several: the prompt tokens' logprobs,
// the greedy ids and their logprobs equal the prompt prefilled whole (identical ids, logprobs within 1e-4; the
// same bits when every cut falls on a multiple of `exact_chunk` and the last piece is longer than one token; a
// one-token last piece runs as a decode row, whose recurrence rounds apart from the chunked form by ~2e-6).
TEST_P(BatchInvariance, PromptCutIntoStepsEqualsWhole) {
  if (!reference_) GTEST_SKIP() << GetParam() << " not found under " << testing::shared_models_dir().string();
  const int chunk = GetParam().exact_chunk, kv = reference_->kv_block_size();
  std::mt19937 rng(64);
  std::vector<std::vector<int>> prompts;
  for (int len : {63, 65, 129, 300}) {
    prompts.emplace_back();
    for (int t = 0; t < len; ++t) prompts.back().push_back(2 + static_cast<int>(rng() % 50000));
  }
  // One engine run of `prompt` with the given budget: the prompt tokens' logprobs, then the greedy tokens'.
  const auto run = [&](LLMEngine& engine, const std::vector<int>& prompt) {
    Request r;
    r.request_id = "cut";
    r.prompt_token_ids = prompt;
    r.params = greedy(6);
    r.params.prompt_logprobs = 0;
    engine.add_request(r);
    Outcome o;
    while (engine.has_unfinished_requests())
      for (const auto& out : engine.step()) {
        if (!out.finished) continue;
        for (const auto& p : out.prompt_logprobs)
          if (p) o.logprobs.push_back(p->token_logprob);
        const std::vector<float> gen = logprobs_of(out);
        o.logprobs.insert(o.logprobs.end(), gen.begin(), gen.end());
        o.ids = out.outputs[0].token_ids;
      }
    return o;
  };
  std::vector<Outcome> whole;
  for (const auto& p : prompts) whole.push_back(run(*reference_, p));
  double worst_cut = 0;
  for (int budget : {7, 61, 63, 64, 65, 128}) {  // on 65 and 129 tokens, 64 and 128 leave a last piece of one token
    EngineConfig cfg = config();
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.enable_prefix_caching = false;  // cut exactly by the budget (prefix caching's align mode cuts on its blocks)
    cfg.num_state_blocks = std::max(32, kv > 0 ? 3 + 306 / kv : 0);  // the state block and the KV of 306 tokens
    LLMEngine engine(cfg);
    const bool on_grid = chunk > 0 && budget % chunk == 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE("budget " + std::to_string(budget) + ", prompt length " + std::to_string(prompts[i].size()));
      const Outcome cut = run(engine, prompts[i]);
      ASSERT_EQ(cut.ids, whole[i].ids);
      ASSERT_EQ(cut.logprobs.size(), whole[i].logprobs.size());
      // A last piece of one token is a one-token prefill row (is_decode_row): the chunk form, as uncut.
      if (on_grid) {
        EXPECT_EQ(cut.logprobs, whole[i].logprobs) << "cut only on multiples of the chunk " << chunk;
        continue;
      }
      for (size_t s = 0; s < cut.logprobs.size(); ++s) {
        EXPECT_NEAR(cut.logprobs[s], whole[i].logprobs[s], 1e-4) << "logprob " << s;
        worst_cut = std::max(worst_cut, static_cast<double>(std::abs(cut.logprobs[s] - whole[i].logprobs[s])));
      }
    }
  }
  RecordProperty("max_gap_not_bitwise", std::to_string(worst_cut));
}

// Hybrids only: prompts just under a KV block boundary (MiniMax: 192 tokens), a pool of 8 blocks (7 usable: three
// requests of a state block + one KV block each). While decoding they cross the boundary and need a second KV
// block: the pool runs out and the scheduler preempts the newest request by itself (no forced preemption), which
// later recomputes; every output still equals running the request alone.
TEST_P(BatchInvariance, KvExhaustionPreemptsAndRecomputes) {
  if (!reference_) GTEST_SKIP() << GetParam() << " not found";
  const int kv = reference_->kv_block_size();
  if (kv <= 0) GTEST_SKIP() << "no KV blocks in " << GetParam();
  ASSERT_GT(kv, 22);
  std::mt19937 rng(192);
  const int n = 6;
  std::vector<std::vector<int>> prompts(n);
  for (int i = 0; i < n; ++i)
    for (int t = 0, len = kv - 22 + static_cast<int>(rng() % 20); t < len; ++t) prompts[i].push_back(2 + static_cast<int>(rng() % 50000));
  for (int budget : {61, 4096}) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    EngineConfig cfg = config();
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.num_state_blocks = 8;
    LLMEngine engine(cfg);
    for (int i = 0; i < n; ++i) {
      Request r;
      r.request_id = std::to_string(i);
      r.prompt_token_ids = prompts[i];
      r.params = greedy(30);
      engine.add_request(r);
    }
    std::map<std::string, Outcome> got;
    for (int step = 0; engine.has_unfinished_requests(); ++step) {
      ASSERT_LT(step, 100000) << "no progress";
      for (const auto& out : engine.step())
        if (out.finished) got[out.request_id] = {out.outputs[0].token_ids, logprobs_of(out)};
    }
    EXPECT_GT(engine.num_preemptions(), 0) << "the KV blocks never ran out";
    EXPECT_EQ(engine.num_free_blocks(), 7) << "blocks leaked";
    for (int i = 0; i < n; ++i) {
      const Outcome want = alone(prompts[i], 30);
      const Outcome& have = got[std::to_string(i)];
      ASSERT_EQ(have.ids, want.ids) << "request " << i;
      for (size_t s = 0; s < want.logprobs.size(); ++s) EXPECT_NEAR(have.logprobs[s], want.logprobs[s], 1e-4);
    }
    RecordProperty("preemptions_budget" + std::to_string(budget), engine.num_preemptions());
  }
}

// tiny-mamba2, tiny-granitemoehybrid and tiny-nemotron_h have chunk_size 64 (the dummy configs 16): budgets 7, 13 and
// 61 cut sequences mid-chunk. KV blocks: MiniMax 192 tokens, Granite 406, Nemotron-H 205 (the dummy configs': from
// their shapes, e.g. ~50-120). Fewer random trials for the hybrids (6: each budget once, two with small pools). The
// Qwen models (Gated DeltaNet chunk 64, every fourth layer gated attention; tiny-qwen3_5_moe and the dummy Qwen3-Next
// with sparse MoE FFNs) get budgets 64 and 128 as well: a prefill chunk then ends on the chunk grid unless decodes
// share the step.
const std::vector<int> kQwenBudgets = {1, 7, 13, 61, 512, 4096, 64, 128};
INSTANTIATE_TEST_SUITE_P(Models, BatchInvariance,
                         ::testing::Values(ModelCase{"tiny-mamba"}, ModelCase{"tiny-mamba2"}, ModelCase{"tiny-minimax"},
                                           ModelCase{"tiny-granitemoehybrid", false, 6}, ModelCase{"tiny-nemotron_h", false, 6},
                                           ModelCase{"tiny-falcon_h1", true, 6}, ModelCase{"tiny-jamba", true, 6},
                                           ModelCase{"tiny-qwen3_5_moe", false, 8, kQwenBudgets, 64},
                                           ModelCase{"tiny-qwen3_5", true, 8, kQwenBudgets, 64},
                                           ModelCase{"tiny-qwen3_next", true, 8, kQwenBudgets, 64}),
                         [](const auto& info) {
                           const std::string& n = info.param.name;
                           std::string s = n == "tiny-mamba" ? "mamba1" : n == "tiny-mamba2" ? "mamba2" : n.substr(5);
                           if (info.param.dummy) s += "_dummy";
                           return s;
                         });

}  // namespace
}  // namespace ssmserve
