// The Mamba-1 decode norm fold (CudaModelOptions::decode_norm_fold; issue 7): in_proj's skinny GEMM computes the
// residual add + RMSNorm itself and the residual ping-pongs between two buffers. Against the runner without it:
// logits of a ragged prefill and then decode steps of 1, 3 and 8 rows (padded steps with null rows) bit-identical,
// eagerly and through CUDA graphs (whose runs equal their eager ones bit for bit), in the decode overlap modes
// (z rows reading the x rows' normed copy, or folding themselves when the branch forks first) and without the
// overlap, and in batch-invariant mode. The decode steps' logits depend on every earlier step's states, so equal
// logits over the steps also check the states. Odd and even layer counts (the ping-pong's last buffer). Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/causal_lm.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using testing::model_dir;
using testing::source_dir;

/// Logits rows (one per sequence) of a ragged prefill of nseq sequences, then 8 decode steps alternately unpadded
/// (nseq rows) and padded to 8 rows (null-block rows), so each decode shape is run eagerly, captured and replayed
/// when graphs are on; the same tokens every call.
std::vector<std::vector<float>> run_steps(CausalLM& m, int nseq) {
  const int V = m.config().vocab_size;
  StateCache cache(m.num_state_layers(), m.state_shape(), 6);
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> tok(2, V - 1);
  const int lens[3] = {5, 1, 17};
  std::vector<ScheduledSeq> seqs;
  for (int i = 0; i < nseq; ++i) seqs.push_back({i + 1, 0, lens[i % 3], true});
  std::vector<std::vector<int32_t>> toks;
  for (const auto& q : seqs) {
    toks.emplace_back(q.num_scheduled_tokens);
    for (auto& t : toks.back()) t = tok(rng);
  }
  std::vector<std::vector<float>> out;
  for (int step = 0; step < 9; ++step) {
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

void expect_same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size());
    EXPECT_EQ(std::memcmp(a[s].data(), b[s].data(), a[s].size() * sizeof(float)), 0) << what << ", step " << s;
  }
}

/// num_layers > 0 overrides the config's layer count (the big shapes with a few layers); overlaps: the
/// decode_overlap modes run (1 the default, 0 none, 9 the branch forking before the x rows, 3 with the prefetch).
void check_fold(const std::filesystem::path& dir, LoadFormat format, int num_layers,
                std::initializer_list<int> overlaps = {1, 0, 9, 3}) {
  ModelConfig cfg = ModelConfig::load(dir);
  if (num_layers > 0) cfg.num_hidden_layers = num_layers;
  const bool quick = cudatest::quick();  // compute-sanitizer runs: one batch, the default overlap only
  for (int nseq : {3, 1}) {
    if (quick && nseq == 1) break;
    for (int overlap : overlaps) {
      if (quick && overlap != 1) continue;
      SCOPED_TRACE(::testing::Message() << dir.filename().string() << " layers " << cfg.num_hidden_layers << " seqs "
                                        << nseq << " decode_overlap " << overlap);
      cuda::CudaModelOptions o;
      o.decode_overlap = overlap, o.cuda_graphs = false;
      const auto ref = run_steps(*cuda::load_mamba_cuda(cfg, format, o), nseq);
      o.decode_norm_fold = true;
      const auto eager = run_steps(*cuda::load_mamba_cuda(cfg, format, o), nseq);
      expect_same(eager, ref, "fold vs norm kernel (eager)");
      o.cuda_graphs = true;
      expect_same(run_steps(*cuda::load_mamba_cuda(cfg, format, o), nseq), eager, "fold: graphs vs eager");
    }
    SCOPED_TRACE(::testing::Message() << dir.filename().string() << " batch-invariant, seqs " << nseq);
    cuda::CudaModelOptions bi;
    bi.batch_invariant = true, bi.cuda_graphs = false;
    const auto ref = run_steps(*cuda::load_mamba_cuda(cfg, format, bi), nseq);
    bi.decode_norm_fold = true, bi.cuda_graphs = true;
    expect_same(run_steps(*cuda::load_mamba_cuda(cfg, format, bi), nseq), ref, "batch-invariant fold vs norm kernel");
  }
}

TEST(CudaNormFold, TinyMambaEqualsNormKernel) {
  REQUIRE_GPU();
  const auto dir = model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  check_fold(dir, LoadFormat::Auto, 0);  // 8 layers
  check_fold(dir, LoadFormat::Auto, 5);
}

TEST(CudaNormFold, Mamba130mShapeDummyEqualsNormKernel) {
  REQUIRE_GPU();
  check_fold(source_dir() / "configs/mamba-130m", LoadFormat::Dummy, 0);  // 24 layers
}

TEST(CudaNormFold, Mamba2_8bShapeDummyEqualsNormKernel) {
  REQUIRE_GPU();
  if (cudatest::quick()) GTEST_SKIP() << "SSMSERVE_CUDA_TEST_QUICK";
  // H 2560, I 5120 (the benchmark's shape), 3 layers.
  check_fold(source_dir() / "configs/mamba-2.8b", LoadFormat::Dummy, 3, {1, 9});
}

/// The prologue alone: skinny_gemm with a SkinnyNormFold against add_rms_norm_rows then skinny_gemm on its bf16
/// output: y, the residual sum and the normed rows bit-identical, for M 1..16 (one and two m-tiles), K with 16-byte
/// (K % 8 == 0) and scalar (K % 8 == 4) loads, split groups within one block and across blocks, with and without
/// the add (layer 0).
TEST(CudaNormFold, SkinnyPrologueEqualsNormKernel) {
  REQUIRE_GPU();
  const uint32_t seed = cudatest::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const float eps = 1e-5f;
  for (int64_t K : {256, 772, 2560, 4096}) {
    for (int64_t M : {1, 3, 8, 11, 16}) {
      for (int64_t N : {96, 2048}) {
        for (bool has_add : {true, false}) {
          SCOPED_TRACE(::testing::Message() << "M " << M << " N " << N << " K " << K << " add " << has_add);
          const auto res = cudatest::rand_vec(rng, M * K, -2.0f, 2.0f), add = cudatest::rand_vec(rng, M * K);
          const auto w = cudatest::rand_vec(rng, K, 0.5f, 1.5f);
          std::vector<uint16_t> W(N * K);
          for (auto& b : W) b = f32_to_bf16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
          auto up = [](const void* p, size_t bytes) {
            cuda::DeviceBuffer b(bytes);
            b.upload(p, bytes);
            return b;
          };
          cuda::DeviceBuffer d_res1 = up(res.data(), M * K * 4), d_res2 = up(res.data(), M * K * 4);
          cuda::DeviceBuffer d_add = up(add.data(), M * K * 4), d_w = up(w.data(), K * 4);
          cuda::DeviceBuffer d_W = up(W.data(), N * K * 2), xn1(M * K * 2), xn2(M * K * 2), rout(M * K * 4);
          cuda::DeviceBuffer y1(M * N * 4), y2(M * N * 4);
          size_t cb = 0;
          const size_t wb = cuda::skinny_gemm_workspace(M, N, K, &cb);
          cuda::DeviceBuffer ws(std::max<size_t>(wb, 16)), cnt(std::max<size_t>(cb, 16));
          cnt.fill_bytes(0);
          // Reference: the norm kernel (residual updated in place), then the GEMM on its output.
          ASSERT_EQ(cuda::add_rms_norm_rows(has_add ? d_add.as<float>() : nullptr, K, d_res1.as<float>(), K,
                                            d_w.as<float>(), eps, nullptr, M, K, true, xn1.data(), DType::BF16, K,
                                            false, nullptr),
                    cudaSuccess);
          ASSERT_EQ(cuda::skinny_gemm({M, N, K, xn1.data(), K, d_W.data(), K, DType::BF16, y1.data(), N, DType::F32},
                                      nullptr, 0, false, nullptr, ws.data(), ws.bytes(), cnt.as<unsigned>()),
                    cudaSuccess);
          cuda::SkinnyNormFold f;
          f.residual = d_res2.as<float>(), f.residual_stride = K;
          f.add = has_add ? d_add.as<float>() : nullptr, f.add_stride = K;
          f.weight = d_w.as<float>(), f.eps = eps;
          f.residual_out = rout.as<float>(), f.residual_out_stride = K;
          f.xn_out = xn2.data(), f.xn_out_stride = K;
          cuda::SkinnyExtras ex;
          ex.norm = &f;
          ASSERT_EQ(cuda::skinny_gemm({M, N, K, nullptr, K, d_W.data(), K, DType::BF16, y2.data(), N, DType::F32},
                                      nullptr, 0, true, nullptr, ws.data(), ws.bytes(), cnt.as<unsigned>(), ex),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          auto down = [](const cuda::DeviceBuffer& b) {
            std::vector<uint8_t> h(b.bytes());
            b.download(h.data(), h.size());
            return h;
          };
          EXPECT_EQ(down(y1), down(y2)) << "y";
          EXPECT_EQ(down(xn1), down(xn2)) << "normed rows";
          EXPECT_EQ(down(d_res1), down(rout)) << "residual sum";
          EXPECT_EQ(down(d_res2), std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(res.data()),
                                                        reinterpret_cast<const uint8_t*>(res.data()) + M * K * 4))
              << "the fold's input residual must stay untouched";
        }
      }
    }
  }
}

TEST(CudaNormFold, RejectsUnsupportedFolds) {
  REQUIRE_GPU();
  EXPECT_TRUE(cuda::skinny_norm_fold_supported(16, 2560));
  EXPECT_FALSE(cuda::skinny_norm_fold_supported(17, 2560));
  EXPECT_FALSE(cuda::skinny_norm_fold_supported(1, 4100));
  EXPECT_FALSE(cuda::skinny_norm_fold_supported(1, 2562));
  cuda::DeviceBuffer w(64 * 256 * 2), y(4 * 64 * 4), res(4 * 256 * 4), nw(256 * 4);
  for (cuda::DeviceBuffer* b : {&w, &res, &nw}) b->fill_bytes(0);
  cuda::SkinnyNormFold f;
  f.residual = res.as<float>(), f.residual_stride = 256, f.weight = nw.as<float>(), f.eps = 1e-5f;
  cuda::SkinnyExtras ex;
  ex.norm = &f;
  const cuda::GemmArgs a{4, 64, 256, nullptr, 256, w.data(), 256, DType::BF16, y.data(), 64, DType::F32};
  EXPECT_EQ(cuda::skinny_gemm(a, nullptr, 0, false, nullptr, nullptr, 0, nullptr, ex), cudaSuccess);
  f.residual_out = res.as<float>(), f.residual_out_stride = 256;  // would race with the blocks' reads
  EXPECT_EQ(cuda::skinny_gemm(a, nullptr, 0, false, nullptr, nullptr, 0, nullptr, ex), cudaErrorInvalidValue);
  f.residual_out = nullptr, f.residual = res.as<float>() + 1;  // rows not 16-byte aligned
  EXPECT_EQ(cuda::skinny_gemm(a, nullptr, 0, false, nullptr, nullptr, 0, nullptr, ex), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace ssmserve
