// Tensor parallelism on the CPU (issue 9): the model split over TP = 2, 4 (and 8) in-process ranks gives the same
// greedy tokens and the same logprobs (within 1e-5) as TP = 1, through the whole engine: batches of prompts, chunked prefill mixed with decodes, prompt
// logprobs. Models: tiny-mamba (channels sharded, x_proj / out_proj row-parallel), tiny-mamba2 (n_groups = 1:
// the group replicated, the gated norm all-reduced), tiny-minimax (lightning heads, GQA heads with KV heads
// split at TP 2 and replicated at TP 4, tensor-parallel experts), dummy-weight Mamba-2 configs with n_groups = 8
// (groups sharded) at TP = 2, 4, 8 and n_groups = 1 with norm_before_gate, and a dummy MiniMax config.
//
// Held to 1e-5: the logprobs of every greedy token, of every prompt token (pseudo-random ids, down to -27), and
// the top-k (k = 5) of every generated step's and prompt position's distribution (sorted values). The CPU shards
// keep TP = 1's summation order (dist/gathered_linear.h: all-gathered inputs and output-split projections instead
// of all-reduced partial sums), so the gaps printed are 0 today; with the all-reduce they reached 1.3e-5 (a top-5
// logprob of -4.1 on tiny-mamba, TP 2), past the bound however the comparison was chosen.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>

#include "checkpoint_fixtures.h"
#include "cli_runner.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "model/tensor_parallel.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using ::testing::HasSubstr;

constexpr int kTopK = 5;

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;                 // the greedy tokens'
  std::vector<std::vector<float>> top;         // per generated step, then per prompt position 1..: top-k, descending
  std::vector<float> prompt_token_logprobs;    // the prompt tokens' own
};

std::vector<float> sorted_values(const std::vector<TokenLogprob>& v, size_t skip) {
  std::vector<float> out;
  for (size_t i = skip; i < v.size(); ++i) out.push_back(v[i].logprob);
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Greedy outputs of `prompts` run together through an engine with the given TP size, with a small token budget
// so prompts are prefilled in chunks next to other requests' decodes.
std::vector<Outcome> run(const std::filesystem::path& model, LoadFormat format, int tp, const std::vector<std::vector<int>>& prompts,
                         int budget) {
  EngineConfig cfg;
  cfg.model = model;
  cfg.load_format = format;
  cfg.tensor_parallel_size = tp;
  cfg.scheduler.max_num_batched_tokens = budget;
  cfg.scheduler.max_num_seqs = 4;
  LLMEngine engine(cfg);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.params.temperature = 0;
    r.params.max_tokens = 6;
    r.params.ignore_eos = true;
    r.params.logprobs = kTopK;
    r.params.prompt_logprobs = kTopK;
    engine.add_request(r);
  }
  std::vector<Outcome> out(prompts.size());
  while (engine.has_unfinished_requests())
    for (const auto& o : engine.step()) {
      if (!o.finished) continue;
      Outcome& oc = out[std::stoi(o.request_id)];
      oc.ids = o.outputs[0].token_ids;
      for (const auto& step : o.outputs[0].logprobs) {
        oc.logprobs.push_back(step.at(0).logprob);
        oc.top.push_back(sorted_values(step, 0));  // the greedy token (rank 1), then the rest of the top-k
      }
      for (const auto& p : o.prompt_logprobs)
        if (p) oc.top.push_back(sorted_values(p->top, 0)), oc.prompt_token_logprobs.push_back(p->token_logprob);
    }
  return out;
}

double max_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t j = 0; j < std::min(a.size(), b.size()); ++j) worst = std::max(worst, std::abs(static_cast<double>(a[j]) - b[j]));
  return worst;
}

void expect_same(const std::vector<Outcome>& ref, const std::vector<Outcome>& got, int tp) {
  ASSERT_EQ(ref.size(), got.size());
  double greedy = 0, top = 0, prompt = 0;
  float lowest_top = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    greedy = std::max(greedy, max_gap(ref[i].logprobs, got[i].logprobs));
    prompt = std::max(prompt, max_gap(ref[i].prompt_token_logprobs, got[i].prompt_token_logprobs));
    for (size_t s = 0; s < std::min(ref[i].top.size(), got[i].top.size()); ++s) {
      top = std::max(top, max_gap(ref[i].top[s], got[i].top[s]));
      if (!ref[i].top[s].empty()) lowest_top = std::min(lowest_top, ref[i].top[s].back());
    }
  }
  std::cout << "TP " << tp << ": max |logprob - TP 1's|: greedy tokens " << greedy << ", top-" << kTopK << " " << top
            << " (lowest top-k logprob " << lowest_top << "), prompt tokens " << prompt << "\n";
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(ref[i].ids, got[i].ids) << "TP " << tp << ", prompt " << i;
    ASSERT_EQ(ref[i].logprobs.size(), got[i].logprobs.size());
    ASSERT_FALSE(ref[i].logprobs.empty());
    for (size_t j = 0; j < ref[i].logprobs.size(); ++j)
      EXPECT_NEAR(ref[i].logprobs[j], got[i].logprobs[j], 1e-5) << "TP " << tp << ", prompt " << i << ", greedy token " << j;
    ASSERT_EQ(ref[i].prompt_token_logprobs.size(), got[i].prompt_token_logprobs.size());
    for (size_t j = 0; j < ref[i].prompt_token_logprobs.size(); ++j)
      EXPECT_NEAR(ref[i].prompt_token_logprobs[j], got[i].prompt_token_logprobs[j], 1e-5) << "TP " << tp << ", prompt " << i
                                                                                          << ", prompt token " << j + 1;
    ASSERT_EQ(ref[i].top.size(), got[i].top.size());
    for (size_t s = 0; s < ref[i].top.size(); ++s) {
      ASSERT_EQ(ref[i].top[s].size(), static_cast<size_t>(kTopK));
      ASSERT_EQ(got[i].top[s].size(), static_cast<size_t>(kTopK));
      for (int k = 0; k < kTopK; ++k)
        EXPECT_NEAR(ref[i].top[s][k], got[i].top[s][k], 1e-5) << "TP " << tp << ", prompt " << i << ", distribution " << s
                                                              << ", rank " << k;
    }
  }
}

std::vector<std::vector<int>> prompts(int vocab) {
  std::vector<std::vector<int>> p = {{}, {}, {}};
  const int lens[] = {37, 5, 90};
  for (int i = 0; i < 3; ++i)
    for (int t = 0; t < lens[i]; ++t) p[i].push_back((t * 7919 + i * 104729 + 13) % vocab);
  return p;
}

// A model and the TP sizes it splits into: a checkpoint of the shared models folder, or a dummy-weight config of
// tests/data/tiny-hybrids (weights seeded per tensor name, identical on every rank and at TP 1) with `patch` merged
// into it (the sizes the ranks split, so the case does not depend on the shapes the goldens use). `long_prompt`: the
// length of a fourth prompt (0: none), past a hybrid's KV block (so a sequence's KV spans blocks on every rank).
struct TpCase {
  std::string name;
  bool dummy;
  std::vector<int> tp_sizes;
  std::string patch = "{}";
  int long_prompt = 0;
};

std::ostream& operator<<(std::ostream& os, const TpCase& c) { return os << c.name; }

// `name`'s dummy config of tests/data/tiny-hybrids with `patch` merged into it.
nlohmann::json hybrid_config(const std::string& name, const nlohmann::json& patch = nlohmann::json::object()) {
  nlohmann::json j = testing::read_json(testing::source_dir() / "tests/data/tiny-hybrids" / name / "config.json");
  j.merge_patch(patch);
  return j;
}

class TensorParallelModels : public ::testing::TestWithParam<TpCase> {};

TEST_P(TensorParallelModels, SameGreedyOutputsAndLogprobsAsOneRank) {
  const TpCase& c = GetParam();
  testing::TempDir tmp("tp-hybrid");
  std::filesystem::path dir = testing::model_dir(c.name);
  if (c.dummy) {
    dir = tmp.path();
    std::ofstream(dir / "config.json") << hybrid_config(c.name, nlohmann::json::parse(c.patch)).dump(2);
  }
  SSM_SKIP_IF_NO_MODEL(dir);
  const LoadFormat format = c.dummy ? LoadFormat::Dummy : LoadFormat::Auto;
  auto p = prompts(50000);
  if (c.long_prompt > 0) {
    p.emplace_back();
    for (int t = 0; t < c.long_prompt; ++t) p.back().push_back((t * 104729 + 7) % 50000);
  }
  const auto ref = run(dir, format, 1, p, 29);
  for (int tp : c.tp_sizes) expect_same(ref, run(dir, format, tp, p, 29), tp);
}

std::string case_name(const ::testing::TestParamInfo<TpCase>& info) {
  std::string n = info.param.name.substr(5) + (info.param.dummy ? "_dummy" : "");
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, TensorParallelModels,
                         ::testing::Values(TpCase{"tiny-mamba", false, {2, 4}}, TpCase{"tiny-mamba2", false, {2, 4}},
                                           TpCase{"tiny-minimax", false, {2, 4}}),
                         case_name);

// The Mamba hybrids (a suite of its own, kept out of the sanitizer run's "Checkpoint" filter). Split sizes:
// tiny-granitemoehybrid Mamba-2 heads 8 (1 group, replicated), attention heads 4 / KV 2 (KV replicated at TP 4),
// experts I 128, shared MLP 256; tiny-nemotron_h heads 8 in n_groups 2 (so TP 2 only), MLP 512, experts 128 and
// shared expert 128; a 430-token prompt spans their KV blocks (406 and 205 tokens). Dummy Falcon-H1 (parallel Mamba-2 + attention in every layer): heads 4 in 2 groups, attention
// 4 / KV 2, MLP 256; Jamba (Mamba-1 + MoE): d_inner 256, attention 4 / KV 2 (replicated at TP 4), experts and MLP
// 256; Bamba: heads 4 in 2 groups, attention 2 / KV 1 (replicated), MLP 256.
INSTANTIATE_TEST_SUITE_P(
    Hybrids, TensorParallelModels,
    ::testing::Values(TpCase{"tiny-granitemoehybrid", false, {2, 4}, "{}", 430}, TpCase{"tiny-nemotron_h", false, {2}, "{}", 430},
                      TpCase{"tiny-falcon_h1", true, {2},
                             R"({"mamba_d_ssm": 192, "mamba_n_heads": 4, "mamba_d_head": 48, "mamba_n_groups": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 256})"},
                      TpCase{"tiny-jamba", true, {2, 4},
                             R"({"mamba_expand": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256})"},
                      TpCase{"tiny-bamba", true, {2},
                             R"({"mamba_n_heads": 4, "mamba_d_head": "auto", "mamba_n_groups": 2, "num_attention_heads": 2,
                                 "num_key_value_heads": 1, "intermediate_size": 256})"}),
    case_name);

// The Gated DeltaNet hybrids (Qwen3.5 / Qwen3.6, Qwen3-Next): DeltaNet key heads sharded with their value heads (the
// q / k / v / z / b / a rows of in_proj, the conv channels, the state), gated attention with q / k norms (query heads
// and their output gates split, KV heads split or replicated), the MoE's experts and its sigmoid-gated shared expert.
// tiny-qwen3_5_moe (checkpoint): DeltaNet 4 key / 8 value heads, attention 4 / KV 2 (replicated at TP 4), 8 experts of
// 128, shared expert 128: TP 2 and 4. Dummy tiny-qwen3_5 (dense MLP 256) and tiny-qwen3_next (fused in_proj_qkvz /
// in_proj_ba, experts 64, shared 64, an mlp_only layer): 2 key / 4 value heads, attention 4 / KV 2: TP 2. A 300-token
// prompt spans several KV blocks (~114 tokens on tiny-qwen3_5_moe, ~57 on the dummy configs) and DeltaNet chunks (64).
INSTANTIATE_TEST_SUITE_P(Qwen, TensorParallelModels,
                         ::testing::Values(TpCase{"tiny-qwen3_5_moe", false, {2, 4}, "{}", 300},
                                           TpCase{"tiny-qwen3_5", true, {2}, "{}", 300},
                                           TpCase{"tiny-qwen3_next", true, {2}, "{}", 300}),
                         case_name);

// A small Mamba-2 shape for dummy weights: hidden 64, 8 heads x 16, d_state 16, 2 layers, chunk_size 16, and a
// vocabulary (301) no TP size divides, so the last vocab shard is short.
void write_mamba2_config(const std::filesystem::path& dir, int n_groups, bool norm_before_gate) {
  nlohmann::json j = {{"architectures", {"Mamba2ForCausalLM"}}, {"model_type", "mamba2"}, {"hidden_size", 64},
                      {"num_heads", 8}, {"head_dim", 16}, {"expand", 2}, {"state_size", 16}, {"n_groups", n_groups},
                      {"num_hidden_layers", 2}, {"conv_kernel", 4}, {"chunk_size", 16}, {"vocab_size", 301},
                      {"layer_norm_epsilon", 1e-5}, {"norm_before_gate", norm_before_gate}, {"tie_word_embeddings", false},
                      {"eos_token_id", 0}};
  std::ofstream(dir / "config.json") << j.dump(2);
}

TEST(TensorParallelDummy, Mamba2GroupsShardedAtTp2To8) {
  testing::TempDir tmp("tp-g8");
  write_mamba2_config(tmp.path(), 8, false);
  const auto p = prompts(301);
  const auto ref = run(tmp.path(), LoadFormat::Dummy, 1, p, 23);
  for (int tp : {2, 4, 8}) expect_same(ref, run(tmp.path(), LoadFormat::Dummy, tp, p, 23), tp);
}

TEST(TensorParallelDummy, Mamba2ReplicatedGroupNormBeforeGate) {
  testing::TempDir tmp("tp-g1");
  write_mamba2_config(tmp.path(), 1, true);
  const auto p = prompts(301);
  expect_same(run(tmp.path(), LoadFormat::Dummy, 1, p, 23), run(tmp.path(), LoadFormat::Dummy, 4, p, 23), 4);
}

// A small MiniMax shape for dummy weights: hidden 64, 8 heads x 16 (lightning and softmax), 2 KV heads (split at
// TP 2, replicated at TP 4 and 8), 8 experts of 64 (top 2), layers linear/full/linear/full, block_size 16, and
// vocab 301.
void write_minimax_config(const std::filesystem::path& dir) {
  nlohmann::json j = {{"architectures", {"MiniMaxForCausalLM"}}, {"model_type", "minimax"}, {"hidden_size", 64},
                      {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 64},
                      {"num_local_experts", 8}, {"num_experts_per_tok", 2}, {"block_size", 16}, {"num_hidden_layers", 4},
                      {"layer_types", {"linear_attention", "full_attention", "linear_attention", "full_attention"}},
                      {"vocab_size", 301}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"eos_token_id", 0},
                      {"sliding_window", nullptr}};
  std::ofstream(dir / "config.json") << j.dump(2);
}

TEST(TensorParallelDummy, MiniMaxHeadsExpertsAndReplicatedKvHeads) {
  testing::TempDir tmp("tp-minimax");
  write_minimax_config(tmp.path());
  const auto p = prompts(301);
  const auto ref = run(tmp.path(), LoadFormat::Dummy, 1, p, 23);
  for (int tp : {2, 4, 8}) expect_same(ref, run(tmp.path(), LoadFormat::Dummy, tp, p, 23), tp);
}

TEST(TensorParallelDummy, MiniMaxPageHoldsEachRanksStatesAndKvHeads) {
  testing::TempDir tmp("tp-minimax-shape");
  write_minimax_config(tmp.path());
  const ModelConfig cfg = ModelConfig::load(tmp.path());
  auto one = load_model(cfg, LoadFormat::Dummy, 1);
  // TP 1: 2 lightning layers x 8 heads x 16 x 16 = 4096 fp32 state elements; KV block size 4096 * 4 bytes / (2
  // layers x 2 (K, V) x 2 heads x 16 x 4 bytes) = 32 tokens, the same for every TP size.
  EXPECT_EQ(one->state_shape().ssm_elems, 4096);
  EXPECT_EQ(one->kv_block_size(), 32);
  dist::InProcessGroup two(2), four(4);
  // TP 2: 4 heads and 1 KV head per rank: 2048 state elements, a KV block of 32 x 2 x 2 x 1 x 16 = 2048 fp32.
  auto r1of2 = load_model_shard(cfg, LoadFormat::Dummy, {1, 2, &two.communicator(1)});
  EXPECT_EQ(r1of2->kv_block_size(), 32);
  EXPECT_EQ(r1of2->state_shape().ssm_elems, 2048);
  // TP 4: 2 heads per rank (1024 state elements), KV head 0 or 1 replicated: still 2048 fp32 of KV block.
  auto r3of4 = load_model_shard(cfg, LoadFormat::Dummy, {3, 4, &four.communicator(3)});
  EXPECT_EQ(r3of4->kv_block_size(), 32);
  EXPECT_EQ(r3of4->state_shape().ssm_elems, 2048);
  EXPECT_EQ(TensorParallelLM(cfg, LoadFormat::Dummy, 4).state_shape().ssm_elems, 4 * 2048);
  EXPECT_EQ(TensorParallelLM(cfg, LoadFormat::Dummy, 4).kv_block_size(), 32);
  try {
    TensorParallelLM bad(cfg, LoadFormat::Dummy, 16);
    ADD_FAILURE() << "TP 16 accepted for 8 heads";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--tensor-parallel-size 16 does not divide MiniMax num_attention_heads 8"));
  }
}

TEST(TensorParallelDummy, StatePageHoldsEveryRanksShard) {
  testing::TempDir tmp("tp-shape");
  write_mamba2_config(tmp.path(), 8, false);
  const ModelConfig cfg = ModelConfig::load(tmp.path());
  auto one = load_model(cfg, LoadFormat::Dummy, 1);
  TensorParallelLM four(cfg, LoadFormat::Dummy, 4);
  // conv: (K-1) x (I + 2GN) = 3 x 640 split in 4 x 480 elements; ssm: H x P x N = 2048 split in 4 x 512.
  EXPECT_EQ(four.state_shape().conv_elems, one->state_shape().conv_elems);
  EXPECT_EQ(four.state_shape().ssm_elems, one->state_shape().ssm_elems);
  dist::InProcessGroup group(4);
  EXPECT_EQ(load_model_shard(cfg, LoadFormat::Dummy, {1, 4, &group.communicator(1)})->state_shape().ssm_elems, 512);
}

TEST(TensorParallelDummy, ShardViewsAddressDisjointPartsOfThePage) {
  StateDtypes dt;
  dt.conv = DType::BF16;  // a bf16 conv part and an fp32 ssm part in one page
  StateCache cache(2, {40, 64}, 3, dt);
  const StateCache a = cache.shard({20, 32}, 0, 0), b = cache.shard({20, 32}, 20, 32);
  std::vector<float> ones(32, 1.0f), twos(32, 2.0f);
  for (int l = 0; l < 2; ++l) {
    state_from_f32(a.conv_state(l), 2, ones.data(), 20), state_from_f32(a.ssm_state(l), 2, ones.data(), 32);
    state_from_f32(b.conv_state(l), 2, twos.data(), 20), state_from_f32(b.ssm_state(l), 2, twos.data(), 32);
  }
  const auto conv = state_to_f32(cache.conv_state(1), 2, 40), ssm = state_to_f32(cache.ssm_state(1), 2, 64);
  EXPECT_EQ(conv[19], 1.0f);
  EXPECT_EQ(conv[20], 2.0f);
  EXPECT_EQ(ssm[31], 1.0f);
  EXPECT_EQ(ssm[32], 2.0f);
  EXPECT_EQ(b.shard({4, 4}, 16, 28).ssm_state(0).data, cache.shard({4, 4}, 36, 60).ssm_state(0).data);  // views of views
  StateCache bz = cache.shard({20, 32}, 20, 32);
  bz.zero_block(2);  // zeroes b's ranges only
  EXPECT_EQ(state_to_f32(cache.conv_state(0), 2, 40)[0], 1.0f);
  EXPECT_EQ(state_to_f32(cache.conv_state(0), 2, 40)[39], 0.0f);
  EXPECT_EQ(state_to_f32(cache.ssm_state(1), 2, 64)[0], 1.0f);
  EXPECT_EQ(state_to_f32(cache.ssm_state(1), 2, 64)[63], 0.0f);
  EXPECT_THROW(cache.shard({20, 32}, 21, 0), Error);
  EXPECT_THROW(cache.shard({20, 40}, 0, 32), Error);
}

TEST(TensorParallelErrors, SizesThatDoNotDivideTheShardedDimensions) {
  testing::TempDir tmp("tp-err");
  write_mamba2_config(tmp.path(), 2, false);
  const ModelConfig cfg = ModelConfig::load(tmp.path());
  try {
    TensorParallelLM bad(cfg, LoadFormat::Dummy, 4);
    ADD_FAILURE() << "n_groups 2 at TP 4 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("n_groups 2 must be 1 (replicated on every rank) or a multiple of it"));
  }
  try {
    TensorParallelLM bad(cfg, LoadFormat::Dummy, 16);
    ADD_FAILURE() << "TP 16 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("does not divide"), HasSubstr("must be 1")));
  }
  write_mamba2_config(tmp.path(), 8, false);
  try {
    TensorParallelLM bad(ModelConfig::load(tmp.path()), LoadFormat::Dummy, 16);
    ADD_FAILURE() << "TP 16 accepted for 8 heads";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--tensor-parallel-size 16 does not divide Mamba-2 num_heads 8"));
  }
  const auto mamba = testing::model_dir("tiny-mamba");
  if (std::filesystem::exists(mamba / "config.json")) {
    try {
      TensorParallelLM bad(ModelConfig::load(mamba), LoadFormat::Dummy, 3);
      ADD_FAILURE() << "TP 3 accepted for d_inner 512";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("--tensor-parallel-size 3 does not divide Mamba-1 d_inner (intermediate_size) 512"));
    }
  }
  EngineConfig ec;
  ec.tensor_parallel_size = 0;
  EXPECT_THROW(ec.validate(), Error);
}

// The hybrids: a size a TP rank count does not divide is an error naming the size (at load, before any step): the
// checkpoints at TP sizes they do not split into, and the dummy configs with one size made odd, at TP 2.
std::string tp_error(const ModelConfig& cfg, int tp) {
  try {
    TensorParallelLM model(cfg, LoadFormat::Dummy, tp);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TensorParallelErrors, HybridSizesThatDoNotDivide) {
  const auto granite = testing::model_dir("tiny-granitemoehybrid"), nemotron = testing::model_dir("tiny-nemotron_h");
  if (std::filesystem::exists(nemotron / "config.json")) {
    EXPECT_THAT(tp_error(ModelConfig::load(nemotron), 4),
                HasSubstr("--tensor-parallel-size 4: Mamba-2 n_groups 2 must be 1 (replicated on every rank) or a multiple of it"));
  }
  if (std::filesystem::exists(granite / "config.json")) {
    EXPECT_THAT(tp_error(ModelConfig::load(granite), 3), HasSubstr("--tensor-parallel-size 3 does not divide Mamba-2 num_heads 8"));
  }
  const auto hybrid = [](const std::string& name, const nlohmann::json& patch) {
    return ModelConfig::from_json(hybrid_config(name, patch));
  };
  // Mamba-2 heads (Falcon-H1: 3 of 64 in one group), attention heads (Falcon-H1's parallel attention), KV heads that
  // neither divide nor are a multiple of the TP size (Granite), the MLP (Bamba), the experts (Jamba), the shared
  // expert (Nemotron-H), Mamba-1's d_inner (Jamba).
  const nlohmann::json falcon = {{"mamba_d_ssm", 192},         {"mamba_n_heads", 4},         {"mamba_d_head", 48},
                                 {"mamba_n_groups", 2},        {"num_attention_heads", 4},   {"num_key_value_heads", 2},
                                 {"head_dim", 32},             {"intermediate_size", 256}};
  EXPECT_EQ(tp_error(hybrid("tiny-falcon_h1", falcon), 2), "");
  nlohmann::json bad = falcon;
  bad.merge_patch({{"mamba_n_heads", 3}, {"mamba_d_head", 64}, {"mamba_n_groups", 1}});
  EXPECT_THAT(tp_error(hybrid("tiny-falcon_h1", bad), 2), HasSubstr("--tensor-parallel-size 2 does not divide Mamba-2 num_heads 3"));
  bad = falcon;
  bad.merge_patch({{"num_attention_heads", 3}, {"num_key_value_heads", 1}});
  EXPECT_THAT(tp_error(hybrid("tiny-falcon_h1", bad), 2), HasSubstr("--tensor-parallel-size 2 does not divide Falcon-H1 num_attention_heads 3"));
  EXPECT_THAT(tp_error(hybrid("tiny-granite-dense", {{"mamba_n_heads", 8}, {"mamba_d_head", 32}, {"mamba_n_groups", 1},
                                                     {"num_attention_heads", 6}, {"num_key_value_heads", 3}, {"head_dim", 32}}), 2),
              HasSubstr("--tensor-parallel-size 2: Granite-4.0-H num_key_value_heads 3 must be a multiple of it or divide it"));
  EXPECT_THAT(tp_error(hybrid("tiny-bamba", {{"mamba_n_heads", 4}, {"mamba_d_head", "auto"}, {"mamba_n_groups", 2},
                                             {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 255}}), 2),
              HasSubstr("--tensor-parallel-size 2 does not divide Bamba MLP intermediate_size 255"));
  EXPECT_THAT(tp_error(hybrid("tiny-jamba", {{"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 255}}), 2),
              HasSubstr("--tensor-parallel-size 2 does not divide Jamba"));
  EXPECT_THAT(tp_error(hybrid("tiny-jamba", {{"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 64},
                                             {"mamba_expand", 3}, {"hidden_size", 125}}), 2),
              HasSubstr("--tensor-parallel-size 2 does not divide Mamba-1 d_inner (intermediate_size) 375"));
  EXPECT_THAT(tp_error(hybrid("tiny-nemotron_h-pattern", {{"mamba_num_heads", 4}, {"mamba_head_dim", 64}, {"n_groups", 2},
                                                          {"num_attention_heads", 2}, {"num_key_value_heads", 1},
                                                          {"moe_shared_expert_intermediate_size", 95}}), 2),
              HasSubstr("--tensor-parallel-size 2 does not divide Nemotron-H MLP intermediate_size 95"));
  // Gated DeltaNet key heads (2 in the dummy Qwen configs, 4 in tiny-qwen3_5_moe).
  EXPECT_THAT(tp_error(hybrid("tiny-qwen3_5", nlohmann::json::object()), 4),
              HasSubstr("--tensor-parallel-size 4: Qwen3.5 linear_num_key_heads 2 must be a multiple of it"));
  EXPECT_THAT(tp_error(hybrid("tiny-qwen3_next", nlohmann::json::object()), 4),
              HasSubstr("--tensor-parallel-size 4: Qwen3-Next linear_num_key_heads 2 must be a multiple of it"));
  EXPECT_THAT(tp_error(hybrid("tiny-qwen3_5", {{"linear_num_key_heads", 1}, {"linear_num_value_heads", 2},
                                               {"linear_value_head_dim", 64}}), 2),
              HasSubstr("--tensor-parallel-size 2: Qwen3.5 linear_num_key_heads 1 must be a multiple of it"));
  if (const auto qwen = testing::model_dir("tiny-qwen3_5_moe"); std::filesystem::exists(qwen / "config.json")) {
    EXPECT_THAT(tp_error(ModelConfig::load(qwen), 8),
                HasSubstr("--tensor-parallel-size 8: Qwen3.5-MoE linear_num_key_heads 4 must be a multiple of it"));
  }
}

TEST(TensorParallelErrors, BadTokenRejectedBeforeAnyRankRuns) {
  testing::TempDir tmp("tp-tok");
  write_mamba2_config(tmp.path(), 8, false);
  TensorParallelLM tp(ModelConfig::load(tmp.path()), LoadFormat::Dummy, 2);
  StateCache cache(tp.num_state_layers(), tp.state_shape(), 2);
  const ScheduledSeq seq{1, 0, 2, true};
  const std::vector<std::vector<int32_t>> tokens{{5, 301}};
  MetadataOptions opt;
  opt.chunk_size = 16;
  ForwardBatch b = make_forward_batch(std::span(&seq, 1), tokens, opt);
  b.logits_indices = {1};
  std::vector<float> logits(301);
  EXPECT_THROW(tp.forward(b, cache, logits.data()), Error);
}

TEST(TensorParallelCli, GenerateFlag) {
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  const std::string base = "generate --model " + dir.string() + " --prompt 'The quick brown' --max-tokens 6 --json";
  const auto one = testing::run_cli(base), two = testing::run_cli(base + " --tensor-parallel-size 2");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_EQ(nlohmann::json::parse(one.out)["token_ids"], nlohmann::json::parse(two.out)["token_ids"]);
  const auto bad = testing::run_cli(base + " --tensor-parallel-size 3");
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("error: --tensor-parallel-size 3 does not divide Mamba-1 d_inner (intermediate_size) 512"));
}

}  // namespace
}  // namespace ssmserve
