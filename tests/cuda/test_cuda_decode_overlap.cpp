// The Mamba-1 decode overlap (CudaModelOptions::decode_overlap; issue 7): in_proj's z rows on a second graph
// branch, out_proj's L2 prefetch there. Against the op-by-op chain run eagerly without it: logits of a prefill +
// padded / unpadded decode steps bit-identical in the same-bits modes (eagerly and through CUDA graphs), within
// float rounding in the modes with the halves' own split counts (whose graphs equal their eager runs bit for bit),
// and bit-identical again under batch-invariant mode (which forces the same split counts). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "kernels/cuda/decode_ops.h"
#include "model/causal_lm.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::model_dir;
using testing::source_dir;

/// Logits rows (one per sequence) of a prefill then 10 decode steps, alternately padded to 8 rows and unpadded
/// (so each decode shape is run eagerly, captured and replayed when graphs are on); the same tokens every call.
std::vector<std::vector<float>> run_steps(CausalLM& m) {
  const int V = m.config().vocab_size;
  StateCache cache(m.num_state_layers(), m.state_shape(), 6);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(2, V - 1);
  std::vector<ScheduledSeq> seqs = {{1, 0, 3, true}, {2, 0, 1, true}, {3, 0, 20, true}, {5, 0, 2, true}};
  std::vector<std::vector<int32_t>> toks;
  for (const auto& q : seqs) {
    toks.emplace_back(q.num_scheduled_tokens);
    for (auto& t : toks.back()) t = tok(rng);
  }
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 11; ++step) {
    MetadataOptions opt;
    opt.pad_decodes_to = step % 2 ? 8 : 0;
    opt.chunk_size = m.chunk_size();
    ForwardBatch fb = make_forward_batch(seqs, toks, opt);
    for (size_t i = 0; i < seqs.size(); ++i) fb.logits_indices.push_back(fb.meta.query_start_loc[i + 1] - 1);
    out.emplace_back(seqs.size() * V);
    m.forward(fb, cache, out.back().data());
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i] = {seqs[i].state_block, seqs[i].num_computed_tokens + seqs[i].num_scheduled_tokens, 1, false};
      toks[i] = {tok(rng)};
    }
  }
  return out;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

void expect_same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s)
    EXPECT_EQ(std::memcmp(a[s].data(), b[s].data(), a[s].size() * sizeof(float)), 0) << what << ", step " << s;
}

void check_overlap(const std::filesystem::path& dir, LoadFormat format) {
  const ModelConfig cfg = ModelConfig::load(dir);
  cuda::CudaModelOptions base;
  base.cuda_graphs = false;
  base.decode_overlap = 0;  // the unsplit chain (the default is 1)
  const auto ref = run_steps(*cuda::load_mamba_cuda(cfg, format, base));
  // One option set through graphs and eagerly: graphs == eager bit for bit; == the unsplit chain bit for bit in the
  // same-bits modes, within float rounding with the halves' own split counts (bit 4).
  auto check = [&](cuda::CudaModelOptions o) {
    const auto graphed = run_steps(*cuda::load_mamba_cuda(cfg, format, o));
    o.cuda_graphs = false;
    const auto eager = run_steps(*cuda::load_mamba_cuda(cfg, format, o));
    expect_same(graphed, eager, "graphs vs eager");
    if (!(o.decode_overlap & 4)) {
      expect_same(eager, ref, "overlap vs the unsplit chain");
    } else {
      for (size_t s = 0; s < ref.size(); ++s) EXPECT_LT(rel(eager[s], ref[s]), 1e-3) << "step " << s;
    }
  };
  for (int mode : {1, 3, 9, 11, 2, 18, 19, 5, 7, 13, 15, 23}) {
    for (int pf : {0, 1, 2}) {
      if (!(mode & 2) && pf > 0) continue;
      SCOPED_TRACE(::testing::Message() << dir.filename().string() << " decode_overlap " << mode << " prefetch " << pf);
      cuda::CudaModelOptions o;
      o.decode_overlap = mode, o.overlap_prefetch = pf;
      check(o);
    }
  }
  // Batch-invariant mode keeps the whole in_proj's split count even when bit 4 asks for the halves' own.
  cuda::CudaModelOptions bi = base, bi_overlap;
  bi.batch_invariant = bi_overlap.batch_invariant = true;
  bi_overlap.decode_overlap = 7;
  expect_same(run_steps(*cuda::load_mamba_cuda(cfg, format, bi_overlap)),
              run_steps(*cuda::load_mamba_cuda(cfg, format, bi)), "batch-invariant overlap vs unsplit");
}

TEST(CudaDecodeOverlap, TinyMambaEqualsOpChain) {
  REQUIRE_GPU();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  check_overlap(dir, LoadFormat::Auto);
}

TEST(CudaDecodeOverlap, Mamba130mShapeDummyEqualsOpChain) {
  REQUIRE_GPU();
  check_overlap(source_dir() / "configs/mamba-130m", LoadFormat::Dummy);
}

TEST(CudaDecodeOverlap, L2PrefetchRejectsBadArguments) {
  REQUIRE_GPU();
  cuda::DeviceBuffer b(4096);
  EXPECT_EQ(cuda::l2_prefetch(b.data(), 4096, 3, 4, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::l2_prefetch(b.data(), 4096, 0, 0, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::l2_prefetch(nullptr, 16, 0, 4, nullptr), cudaErrorInvalidValue);
  for (int mode : {0, 1, 2}) EXPECT_EQ(cuda::l2_prefetch(b.data(), 4096, mode, 4, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace ssmserve
