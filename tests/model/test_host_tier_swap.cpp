// The host tier of prefix caching (--swap-space, issue 28 item 4) on the CPU, through a test backend: the CPU backend
// has no tier (its pool is host memory), so "hostsim" wraps the CPU model as a device backend would be seen by the
// engine (device_state_budget set, so the engine enables the tier and stops zeroing host pages) and implements the
// tier's copies the way DeviceStateMirror does: a slot holds one block's whole page of every pool layer (a cached
// state, or a hybrid's KV page). A swapped-out page is poisoned (NaN bytes) in the pool, so a hit that does not get it
// back through a swap-in gives other outputs. A pool of a few blocks and distinct prompts evict the first prompt's
// cached state and KV pages; the same prefix again must hit (served from swapped-in pages) and give the greedy ids and
// logprobs of --no-enable-prefix-caching bit for bit, with the swap counters the scenario implies. The plain CPU
// engine, same pool, must miss there (the scenario does evict). Models: Mamba-1 (states only), MiniMax (lightning),
// Granite 4 (Mamba-2), and dummy-weight Jamba (Mamba-1) and Qwen3.5 (gated DeltaNet) hybrids. tests/cuda/test_cuda_prefix_cache.cpp
// (SwapSpaceBringsEvictedStatesBack) runs the same scenario on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>

#include "engine/llm_engine.h"
#include "model/causal_lm.h"
#include "forwarding_lm.h"
#include "test_util.h"

namespace ssmserve {
namespace {

/// A CPU model behind the device-backend interface with a host tier of page copies (see the file comment).
class HostTierLM final : public testing::ForwardingLM {
 public:
  using ForwardingLM::ForwardingLM;
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override {
    // A device starts a fresh request's state from zero (has_initial_states = 0) whatever its page holds: the engine
    // does not zero pages for a device backend, and a page may be poisoned by a swap-out.
    const MambaBatchMetadata& md = batch.meta;
    for (int i = 0; i < md.num_prefills; ++i)
      if (!md.has_initial_states_p[static_cast<size_t>(i)]) cache.zero_block(md.state_indices_tensor_p[static_cast<size_t>(i)]);
    inner().forward(batch, cache, logits);
  }
  std::optional<double> device_state_budget(double, int64_t, int64_t) const override { return 1e12; }

  bool allocate_host_state_tier(int num_slots, const StateCache& cache) override {
    EXPECT_GT(num_slots, 0);
    slots_ = num_slots;
    page_ = cache.page_bytes();
    host_.clear();
    return true;
  }
  void swap_out_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override {
    for (const BlockCopy& c : copies) {
      EXPECT_TRUE(c.src > 0 && c.src < cache.num_blocks() && c.dst >= 0 && c.dst < slots_) << c.src << " -> slot " << c.dst;
      std::vector<std::byte>& slot = host_[c.dst];
      slot.resize(static_cast<size_t>(page_ * cache.num_layers()));
      for (int l = 0; l < cache.num_layers(); ++l) {
        std::byte* p = page(cache, l, c.src);
        std::memcpy(slot.data() + l * page_, p, static_cast<size_t>(page_));
        std::memset(p, 0xff, static_cast<size_t>(page_));  // NaN: the block is handed out again, its old page is gone
      }
      ++swapped_out;
    }
  }
  void swap_in_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override {
    for (const BlockCopy& c : copies) {
      const auto it = host_.find(c.src);
      ASSERT_TRUE(it != host_.end()) << "swap-in from slot " << c.src << ", which was never written";
      ASSERT_TRUE(c.dst > 0 && c.dst < cache.num_blocks()) << c.dst;
      for (int l = 0; l < cache.num_layers(); ++l)
        std::memcpy(page(cache, l, c.dst), it->second.data() + l * page_, static_cast<size_t>(page_));
      ++swapped_in;
    }
  }
  int swapped_out = 0, swapped_in = 0;

 private:
  /// Block b's page of pool layer l (a whole cache: the conv part starts the page).
  static std::byte* page(const StateCache& cache, int l, int b) {
    return static_cast<std::byte*>(cache.conv_state(l).data) + static_cast<int64_t>(b) * cache.page_bytes();
  }
  int slots_ = 0;
  int64_t page_ = 0;
  std::map<int, std::vector<std::byte>> host_;  // slot -> [layers, page bytes]
};

HostTierLM* g_last = nullptr;  // the hostsim model the last engine loaded

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;
  int cached = 0;
};

Outcome run(LLMEngine& e, const std::vector<int>& prompt, int max_tokens) {
  static int counter = 0;
  Request r;
  r.request_id = "s" + std::to_string(counter++);
  r.prompt_token_ids = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = 0;
  e.add_request(r);
  Outcome o;
  while (e.has_unfinished_requests())
    for (const auto& out : e.step())
      if (out.finished) {
        o.ids = out.outputs[0].token_ids;
        for (const auto& s : out.outputs[0].logprobs) o.logprobs.push_back(s.at(0).logprob);
        o.cached = out.num_cached_tokens;
      }
  return o;
}

class HostTierSwap : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // A checkpoint of the shared models folder, else a dummy-weight config of tests/data/tiny-hybrids.
    dir_ = testing::model_dir(GetParam());
    if (!std::filesystem::exists(dir_ / "config.json")) {
      dir_ = testing::source_dir() / "tests/data/tiny-hybrids" / GetParam();
      dummy_ = true;
    }
    if (!std::filesystem::exists(dir_ / "config.json")) GTEST_SKIP() << "no model " << GetParam();
    const std::string arch = testing::read_json(dir_ / "config.json")["architectures"][0].get<std::string>();
    register_device_model(
        "hostsim", arch,
        [](const ModelConfig& c, LoadFormat f) -> std::unique_ptr<CausalLM> {
          auto m = std::make_unique<HostTierLM>(load_model(c, f));
          g_last = m.get();
          return m;
        },
        [] { return true; });
  }
  EngineConfig config(const std::string& device, bool caching, int blocks) const {
    EngineConfig c;
    c.model = dir_;
    if (dummy_) c.load_format = LoadFormat::Dummy;
    c.device = device;
    c.num_threads = 2;
    c.enable_prefix_caching = caching;
    c.num_state_blocks = blocks;
    c.scheduler.max_num_seqs = 1;
    if (caching) {
      c.mamba_cache_mode = "align";  // one cached state per prompt (its last boundary): the counts below assume it
      if (GetParam() == "tiny-mamba") c.mamba_block_size = 32;
      c.swap_space = device == "hostsim" ? 0.05 : 0.0;
      c.swap_kv_pages = true;
    }
    return c;
  }
  /// Sizes of the scenarios: the block size, the KV block size, and a pool of one running request of up to 2 bs + 15
  /// tokens and two more blocks.
  void sizes(LLMEngine& plain, int& bs, int& kv, int& blocks) const {
    kv = plain.kv_block_size();
    bs = LLMEngine(config("cpu", true, 64)).prefix_cache_config().block_size;
    ASSERT_GT(bs, 0);
    blocks = 1 + 1 + (kv > 0 ? (2 * bs + 15 + kv - 1) / kv : 0) + 2;
  }
  /// `got` equals `want` bit for bit.
  static void expect_same(const Outcome& got, const Outcome& want) {
    EXPECT_EQ(got.ids, want.ids);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t k = 0; k < want.logprobs.size(); ++k) EXPECT_EQ(got.logprobs[k], want.logprobs[k]) << "token " << k;
  }
  std::vector<int> tokens(int n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int& t : v) t = 2 + static_cast<int>(rng_() % 4000);
    return v;
  }
  std::filesystem::path dir_;
  bool dummy_ = false;
  std::mt19937 rng_{31};
};

// The first prompt's cached state (at 2 bs) and, for hybrids, its KV pages are evicted by four distinct prompts into
// host slots; its prefixes of 2 bs + 5 and 2 bs + 9 tokens hit 2 bs: the state swapped in both times (align mode
// caches no new state for them), the KV pages swapped in by the first (finish_step registers them in the pool again,
// so the second shares them from there). Output bit for bit that of the uncached CPU engine.
TEST_P(HostTierSwap, EvictedStatesAndKvPagesComeBack) {
  LLMEngine plain(config("cpu", false, 64));
  int bs = 0, kv = 0, blocks = 0;
  ASSERT_NO_FATAL_FAILURE(sizes(plain, bs, kv, blocks));
  const int max_tokens = 6;
  const std::vector<int> first = tokens(2 * bs + 9);
  std::vector<std::vector<int>> others;
  for (int i = 0; i < 4; ++i) others.push_back(tokens(2 * bs + 3));

  // Without the host tier (the CPU backend): the first prompt's blocks are gone.
  {
    LLMEngine cpu(config("cpu", true, blocks));
    EXPECT_EQ(cpu.host_tier_stats().swap_outs, 0);
    run(cpu, first, 2);
    for (const auto& p : others) run(cpu, p, 2);
    EXPECT_EQ(run(cpu, std::vector<int>(first.begin(), first.begin() + 2 * bs + 5), max_tokens).cached, 0)
        << "the pool of " << blocks << " blocks should have evicted the first prompt's cached blocks";
  }

  g_last = nullptr;
  LLMEngine cached(config("hostsim", true, blocks));
  ASSERT_NE(g_last, nullptr) << "the engine did not load the hostsim backend";
  ASSERT_EQ(cached.kv_block_size(), kv);
  ASSERT_EQ(cached.prefix_cache_config().block_size, bs);
  run(cached, first, 2);
  for (const auto& p : others) run(cached, p, 2);
  const HostTierStats out = cached.host_tier_stats();
  ASSERT_GT(out.swap_outs, 0);
  if (kv > 0) {
    ASSERT_GE(out.kv_swap_outs, 2 * bs / kv) << "the first prompt's KV pages";
  } else {
    EXPECT_EQ(out.kv_swap_outs, 0);
  }
  EXPECT_EQ(g_last->swapped_out, out.swap_outs + out.kv_swap_outs);

  for (int len : {2 * bs + 5, 2 * bs + 9}) {
    SCOPED_TRACE(len);
    const std::vector<int> p(first.begin(), first.begin() + len);
    const Outcome got = run(cached, p, max_tokens);
    EXPECT_EQ(got.cached, 2 * bs);
    expect_same(got, run(plain, p, max_tokens));
  }
  const HostTierStats st = cached.host_tier_stats();
  EXPECT_EQ(st.swap_ins, 2);
  EXPECT_EQ(st.kv_swap_ins, kv > 0 ? 2 * bs / kv : 0);
  EXPECT_EQ(g_last->swapped_in, st.swap_ins + st.kv_swap_ins);
  std::printf("%s: block %d, KV block %d, pool %d: %lld states and %lld KV pages swapped out, %lld and %lld swapped in\n",
              GetParam().c_str(), bs, kv, blocks, static_cast<long long>(st.swap_outs), static_cast<long long>(st.kv_swap_outs),
              static_cast<long long>(st.swap_ins), static_cast<long long>(st.kv_swap_ins));
}

// Part of a prefix evicted: one shorter prompt evicts only the least recently used of the first prompt's cached blocks
// (its state at 2 bs, cached before the request finished, then its KV pages in order), so the hit mixes KV pages
// swapped in from the host with KV blocks still in the pool (tiny-minimax: the first two of four; the second request
// finds them in the pool again, registered by finish_step), and still gives the uncached bits.
TEST_P(HostTierSwap, PartlyEvictedPrefixMixesPoolAndHostBlocks) {
  LLMEngine plain(config("cpu", false, 64));
  int bs = 0, kv = 0, blocks = 0;
  ASSERT_NO_FATAL_FAILURE(sizes(plain, bs, kv, blocks));
  LLMEngine cached(config("hostsim", true, blocks));
  const std::vector<int> first = tokens(2 * bs + 9);
  run(cached, first, 2);
  run(cached, tokens(bs + bs / 2 + 9), 2);
  for (int len : {2 * bs + 5, 2 * bs + 9}) {
    SCOPED_TRACE(len);
    const std::vector<int> p(first.begin(), first.begin() + len);
    const Outcome got = run(cached, p, 6);
    EXPECT_EQ(got.cached, 2 * bs);
    expect_same(got, run(plain, p, 6));
  }
  const HostTierStats st = cached.host_tier_stats();
  std::printf("%s: block %d, KV block %d, pool %d: %lld states and %lld KV pages swapped out, %lld and %lld swapped in\n",
              GetParam().c_str(), bs, kv, blocks, static_cast<long long>(st.swap_outs), static_cast<long long>(st.kv_swap_outs),
              static_cast<long long>(st.swap_ins), static_cast<long long>(st.kv_swap_ins));
  EXPECT_LE(st.kv_swap_ins, kv > 0 ? 2 * bs / kv : 0);
  if (GetParam() == "tiny-minimax") {  // KV blocks of 128 tokens, 4 in the 2 bs prefix
    EXPECT_EQ(st.swap_ins, 2);
    EXPECT_EQ(st.kv_swap_ins, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, HostTierSwap, ::testing::Values("tiny-mamba", "tiny-minimax", "tiny-granitemoehybrid", "tiny-jamba", "tiny-qwen3_5"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param.substr(5);
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace ssmserve
