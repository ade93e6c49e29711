// MiniMax GPU runner against the CPU model with dummy weights (the same values on both backends) at tiny-minimax's
// shape: logits and logprobs of ragged prefill (one prompt over two KV blocks and several attention splits), a
// continuing prefill and padded decode steps within bf16 tolerance; decode steps through CUDA graphs bit-identical
// to eager. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "cuda_test_util.h"
#include "model/attention_metadata.h"
#include "model/causal_lm.h"
#include "runtime/cuda_minimax.h"
#include "test_util.h"

namespace ssmserve {
namespace {

/// The source tree: $SSMSERVE_SOURCE_DIR when set (prebuilt binaries run from another checkout), else the build's.
std::filesystem::path src_dir() {
  const char* e = std::getenv("SSMSERVE_SOURCE_DIR");
  return e && *e ? std::filesystem::path(e) : testing::source_dir();
}

struct Errors {
  double logits_rel = 0, max_logprob_diff = 0;
  double frac_rows_over = 0;  ///< rows whose largest top-5 |logprob difference| exceeds row_bound
};

/// Logits relative error and the largest |logprob difference| at each row's CPU top-5 tokens. A token whose
/// router probabilities are nearly tied may pick another expert on the GPU (bf16 activations upstream) and then
/// legitimately differ more: hence the per-row bound with a small allowed fraction, and a looser maximum.
Errors compare(const std::vector<float>& got, const std::vector<float>& ref, int V, double row_bound) {
  Errors e;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i])) return {INFINITY, INFINITY};
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  e.logits_rel = std::sqrt(num / den);
  const size_t rows = ref.size() / V;
  for (size_t r = 0; r < rows; ++r) {
    auto lse = [&](const float* x) {
      const double m = *std::max_element(x, x + V);
      double s = 0;
      for (int i = 0; i < V; ++i) s += std::exp(x[i] - m);
      return m + std::log(s);
    };
    const float *g = got.data() + r * V, *f = ref.data() + r * V;
    const double lg = lse(g), lf = lse(f);
    std::vector<int> idx(V);
    for (int i = 0; i < V; ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int a, int b) { return f[a] > f[b]; });
    double row = 0;
    for (int k = 0; k < 5; ++k) row = std::max(row, std::abs((g[idx[k]] - lg) - (f[idx[k]] - lf)));
    e.max_logprob_diff = std::max(e.max_logprob_diff, row);
    e.frac_rows_over += row > row_bound ? 1.0 / rows : 0.0;
  }
  return e;
}

/// A fixed schedule over a pool of 24 blocks: sequences on state blocks 1..4, KV blocks from 5 up (3 per
/// sequence, in scrambled order). Step 0: prefill of lengths 1, 2, 300 (two KV blocks of 192, attention splits of
/// 512 keys: one) and 5; then decodes, padded to 8 rows from step 2, with a continuing 9-token prefill at step 2.
struct Schedule {
  std::vector<ScheduledSeq> seqs = {{1, 0, 1, true}, {2, 0, 2, true}, {3, 0, 300, true}, {4, 0, 5, true}};
  std::vector<std::vector<int32_t>> tables = {{9, 5, 13}, {6, 16, 10}, {20, 7, 11}, {8, 12, 18}};
  std::mt19937 rng{7};
  std::vector<std::vector<int32_t>> toks;
  Schedule() {
    for (const auto& s : seqs) toks.push_back(ids(s.num_scheduled_tokens));
  }
  std::vector<int32_t> ids(int n) {
    std::uniform_int_distribution<int> tok(2, 50000);
    std::vector<int32_t> v(n);
    for (auto& t : v) t = tok(rng);
    return v;
  }
  ForwardBatch batch(int step, const CausalLM& m, bool all_logits) {
    MetadataOptions opt;
    opt.pad_decodes_to = step >= 2 ? 8 : 0;
    opt.chunk_size = m.chunk_size();
    ForwardBatch b = make_forward_batch(seqs, toks, opt);
    build_attention_metadata(seqs, tables, m.kv_block_size(), b.meta, b.linear_meta, b.attn_meta);
    if (all_logits) {
      for (int i = 0; i < b.num_tokens(); ++i) b.logits_indices.push_back(i);
    } else {
      for (size_t i = 0; i < seqs.size(); ++i) b.logits_indices.push_back(b.meta.query_start_loc[b.meta.num_reqs] - 1 - static_cast<int>(i));
    }
    return b;
  }
  void advance(int step) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = (step == 1 && s == 3) ? 9 : 1;
      seqs[s] = {seqs[s].state_block, seqs[s].num_computed_tokens + seqs[s].num_scheduled_tokens, n, n > 1};
      toks[s] = ids(n);
    }
  }
};

/// logits_tol: relative error of the logits; row_bound: largest top-5 |logprob difference| of a row, exceeded by at
/// most 2% of the rows; max_tol: the largest over all rows.
void check_against_cpu(DType wd, double logits_tol, double row_bound, double max_tol, cuda::CudaModelOptions opt = {}) {
  REQUIRE_GPU();
  const ModelConfig cfg = ModelConfig::load(src_dir() / "tests/cuda/configs/tiny-minimax");
  auto cpu = load_model(cfg, LoadFormat::Dummy);
  opt.weight_dtype = wd;
  auto gpu = cuda::load_minimax_cuda(cfg, LoadFormat::Dummy, opt);
  ASSERT_EQ(gpu->kv_block_size(), cpu->kv_block_size());
  const int V = cfg.vocab_size;
  StateCache cc(1, cpu->state_shape(), 24), gc(1, gpu->state_shape(), 24);
  Schedule sched;
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch b = sched.batch(step, *cpu, true);
    std::vector<float> lc(b.logits_indices.size() * V), lg(lc.size());
    cpu->forward(b, cc, lc.data());
    gpu->forward(b, gc, lg.data());
    const Errors e = compare(lg, lc, V, row_bound);
    std::printf("tiny-minimax %s step %d: %zu rows, logits rel err %.3g, max |logprob diff| (top-5) %.3g, rows over %.2f: %.1f%%\n",
                wd == DType::F32 ? "f32" : "bf16", step, b.logits_indices.size(), e.logits_rel, e.max_logprob_diff,
                row_bound, 100 * e.frac_rows_over);
    EXPECT_LT(e.logits_rel, logits_tol);
    EXPECT_LT(e.max_logprob_diff, max_tol);
    EXPECT_LE(e.frac_rows_over, 0.02);
    sched.advance(step);
  }
}

TEST(CudaMiniMaxModel, TinyShapeDummyWeightsF32) { check_against_cpu(DType::F32, 2e-2, 0.05, 0.3); }
TEST(CudaMiniMaxModel, TinyShapeDummyWeightsBf16) { check_against_cpu(DType::BF16, 5e-2, 0.1, 0.3); }

/// The runner's options apply to MiniMax as to every family (issue 27): without PDL, every bf16 GEMM on cuBLASLt
/// (skinny_max_m 0), and every bf16 GEMM on the batch-invariant skinny kernel, the same tolerances hold.
TEST(CudaMiniMaxModel, EveryRunnerOptionApplies) {
  cuda::CudaModelOptions no_pdl, no_skinny, invariant;
  no_pdl.pdl = false;
  no_skinny.skinny_max_m = 0;
  invariant.batch_invariant = true;
  for (const auto& [name, o] : {std::pair{"pdl off", no_pdl}, {"skinny_max_m 0", no_skinny}, {"batch_invariant", invariant}}) {
    SCOPED_TRACE(name);
    check_against_cpu(DType::BF16, 5e-2, 0.1, 0.3, o);
  }
}

TEST(CudaMiniMaxModel, DecodeGraphsEqualEager) {
  REQUIRE_GPU();
  const ModelConfig cfg = ModelConfig::load(src_dir() / "tests/cuda/configs/tiny-minimax");
  cuda::CudaModelOptions eager_opt, graph_opt;
  eager_opt.cuda_graphs = false;
  auto eager = cuda::load_minimax_cuda(cfg, LoadFormat::Dummy, eager_opt);
  auto graphed = cuda::load_minimax_cuda(cfg, LoadFormat::Dummy, graph_opt);
  const int V = cfg.vocab_size;
  StateCache a(1, eager->state_shape(), 24), b(1, graphed->state_shape(), 24);
  Schedule sched;
  for (int step = 0; step < 9; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    if (step == 1) sched.advance(5);  // no continuing prefill: every later step is decode-only
    ForwardBatch fb = sched.batch(step % 2 ? 2 : 1, *eager, false);
    std::vector<float> la(fb.logits_indices.size() * V), lb(la.size());
    eager->forward(fb, a, la.data());
    graphed->forward(fb, b, lb.data());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "graph logits differ from eager";
    if (step >= 1) sched.advance(5);
  }
}

}  // namespace
}  // namespace ssmserve
