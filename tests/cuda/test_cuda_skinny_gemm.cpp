// GPU skinny GEMM (issue 7, decode latency and batch invariance): the batch-invariant skinny GEMM against the CPU
// linear; its rows bit-identical for every batch size and offset; every tuning variant equal to the default's bits;
// bad arguments refused; the fp32 GEMV of few rows (the MoE router) against float64; the MLP activation epilogue
// against the GEMM followed by mlp_activation. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

TEST(CudaSkinnyGemm, MatchesCpuLinear) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& sh : gemm_shapes()) {
    for (int64_t M : {1, 3, 8, 13, 16, 40}) {
      for (int64_t pad : {0, 3}) {  // pad 3: x rows not 16-byte aligned (scalar loads)
        SCOPED_TRACE(::testing::Message() << sh.name << " M=" << M << " x pad " << pad);
        const int64_t xs = sh.K + pad, ys = sh.N + 4;
        Operands op(rng, M, sh.N, sh.K, xs);
        const auto ref = op.reference(ys);
        // y fp32 + bf16 copy, then y bf16.
        DeviceBuffer dy = poisoned_bytes(M * ys * 4), dy2 = poisoned_bytes(M * ys * 2);
        SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, op.dx.data(), xs, op.dw.data(), sh.K, DType::BF16, dy.data(), ys,
                                DType::F32}, dy2.data(), ys, true, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        auto y = to_host<float>(dy, M * ys);
        auto y2 = bf16_bits_to_f32(to_host<uint16_t>(dy2, M * ys));
        EXPECT_LT(rel_err(y.data(), ys, ref.data(), ys, M, sh.N), 1e-4) << "y f32";
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < sh.N; ++n)
            ASSERT_EQ(y2[m * ys + n], bf16_to_f32(f32_to_bf16(y[m * ys + n]))) << "bf16 copy " << m << "," << n;
        DeviceBuffer dyb = poisoned_bytes(M * ys * 2);
        SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, op.dx.data(), xs, op.dw.data(), sh.K, DType::BF16, dyb.data(), ys,
                                DType::BF16}, nullptr, 0, false, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        auto yb = bf16_bits_to_f32(to_host<uint16_t>(dyb, M * ys));
        EXPECT_LT(rel_err(yb.data(), ys, ref.data(), ys, M, sh.N), 8e-3) << "y bf16";
        // Columns past N (row padding) stay untouched.
        for (int64_t m = 0; m < M; ++m) {
          uint32_t u;
          std::memcpy(&u, &y[m * ys + sh.N], 4);
          ASSERT_EQ(u, 0xffffffffu) << "padding written, row " << m;
        }
      }
    }
  }
}

/// Runs `gemm` on all op.M rows (into *full), then on slices of each of `Ms` rows at random offsets: every slice's
/// rows must equal the full run's bit for bit.
void expect_slices_equal_full(cuda::GemmHandle& gemm, std::mt19937& rng, const Operands& op,
                              std::initializer_list<int64_t> Ms, std::vector<float>* full) {
  const int64_t Mmax = op.M, N = op.N, K = op.K;
  DeviceBuffer dfull(Mmax * N * 4);
  gemm.run({Mmax, N, K, op.dx.data(), K, op.dw.data(), K, DType::BF16, dfull.data(), N, DType::F32}, nullptr);
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  *full = to_host<float>(dfull, Mmax * N);
  for (int64_t M : Ms) {
    const int64_t off = static_cast<int64_t>(rng() % (Mmax - M + 1));
    DeviceBuffer part(M * N * 4);
    const auto* x0 = static_cast<const uint16_t*>(op.dx.data()) + off * K;
    gemm.run({M, N, K, x0, K, op.dw.data(), K, DType::BF16, part.data(), N, DType::F32}, nullptr);
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(part, M * N);
    ASSERT_EQ(std::memcmp(got.data(), full->data() + off * N, M * N * 4), 0) << "M=" << M << " offset " << off;
  }
}

TEST(CudaSkinnyGemm, RowsAreBitIdenticalForEveryBatch) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  cuda::GemmHandle gemm;
  gemm.set_batch_invariant(true);
  for (const auto& sh : gemm_shapes()) {
    SCOPED_TRACE(sh.name);
    const int64_t Mmax = quick() ? 70 : 300;
    Operands op(rng, Mmax, sh.N, sh.K, sh.K);
    std::vector<float> full;
    ASSERT_NO_FATAL_FAILURE(expect_slices_equal_full(gemm, rng, op, {1, 2, 5, 8, 9, 16, 17, 33, 64}, &full));
  }
  EXPECT_GT(gemm.skinny_calls(), 0);
}

/// skinny_default_tuning's split rule (KernelTuning::skinny_split_rule, host only): the splits and blocks it picks at
/// the MoE hybrids' projections on a 132-SM GPU, every split of a tile in one block, small weights left to the rules
/// before it.
TEST(CudaSkinnyGemm, SplitRuleChoosesOneBlockPerTile) {
  REQUIRE_GPU();
  struct Want {
    int64_t N, K;
    int splits;  // with cta == splits (one block), or -1: the previous rules' choice
  };
  int sms = 0, dev = 0;
  SSM_CUDA_CHECK(cudaGetDevice(&dev));
  SSM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms != 132) GTEST_SKIP() << "the expected choices are for 132 SMs (this GPU has " << sms << ")";
  const cuda::KernelTuning saved = cuda::kernel_tuning();
  cuda::KernelTuning old_rules = saved;
  old_rules.skinny_split_rule = 0;
  for (const Want& w : std::vector<Want>{{6448, 1536, 4},   // 403 tiles: > 3 per SM
                                         {1536, 3072, 16},  // 96 tiles: one 16-warp block per SM
                                         {2048, 1536, 16},  // 48 chunks: 3 per split
                                         {1536, 1024, 8},   // 32 chunks: 16 splits would get 2
                                         {2688, 4096, 8},   // 168 tiles
                                         {2048, 512, 4},    // 16 chunks
                                         {248320, 4096, 4}, // LM head
                                         {256, 4096, -1},   // 16 tiles: the previous rules
                                         {4096, 256, -1}}) {  // 8 chunks: the previous rules
    SCOPED_TRACE(::testing::Message() << w.N << " x " << w.K);
    const cuda::SkinnyTuning t = cuda::skinny_default_tuning(1, w.N, w.K);
    const int splits = cuda::skinny_gemm_splits(w.N, w.K, t.split_shift);
    if (w.splits > 0) {
      EXPECT_EQ(splits, w.splits);
      EXPECT_GE(t.cta_splits, splits);  // one block
    } else {
      cuda::set_kernel_tuning(old_rules);
      const cuda::SkinnyTuning o = cuda::skinny_default_tuning(1, w.N, w.K);
      cuda::set_kernel_tuning(saved);
      EXPECT_EQ(splits, cuda::skinny_gemm_splits(w.N, w.K, o.split_shift));
      EXPECT_EQ(t.cta_splits, o.cta_splits);
    }
    for (int64_t M : {2, 16, 64}) {  // never a function of M
      const cuda::SkinnyTuning m = cuda::skinny_default_tuning(M, w.N, w.K);
      EXPECT_EQ(m.split_shift, t.split_shift);
      EXPECT_EQ(m.cta_splits, t.cta_splits);
    }
  }
}

/// Under either split rule every row is bit-identical whatever the batch and its offset (the rule is a function of
/// N and K only), and the result stays within bf16-GEMM tolerance of the CPU, at shapes the new rule moves.
TEST(CudaSkinnyGemm, SplitRulesKeepRowsBatchInvariant) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<Shape> shapes = gemm_shapes();
  for (const Shape& sh : std::vector<Shape>{{"gt.in_proj", 6448, 1536}, {"gt.out_proj", 1536, 3072},
                                            {"gt.sh_down", 1536, 1024}, {"q35.sh_down", 2048, 512},
                                            {"odd", 1100, 1000}})
    shapes.push_back(sh);
  for (int rule : {1, 0}) {
    cuda::KernelTuning kt = cuda::kernel_tuning();
    kt.skinny_split_rule = rule;
    const TuningScope scope(kt);  // restored however the iteration ends
    cuda::GemmHandle gemm;
    gemm.set_batch_invariant(true);
    for (const auto& sh : shapes) {
      SCOPED_TRACE(::testing::Message() << sh.name << " rule " << rule);
      const int64_t Mmax = quick() ? 40 : 120;
      Operands op(rng, Mmax, sh.N, sh.K, sh.K);
      std::vector<float> full;
      ASSERT_NO_FATAL_FAILURE(expect_slices_equal_full(gemm, rng, op, {1, 3, 8, 16, 17}, &full));
      const auto ref = op.reference(sh.N);
      EXPECT_LT(rel_err(full.data(), sh.N, ref.data(), sh.N, Mmax, sh.N), 1e-4);
    }
  }
}

/// True when tuning `tu` sums in the default's order for an N x K weight.
bool same_order(const cuda::SkinnyTuning& tu, int64_t M, int64_t N, int64_t K) {
  const cuda::SkinnyTuning d = cuda::skinny_default_tuning(M, N, K);
  const int s0 = cuda::skinny_gemm_splits(N, K, d.split_shift), s1 = cuda::skinny_gemm_splits(N, K, tu.split_shift);
  return s0 == s1 && std::min(s0, d.cta_splits) == std::min(s1, tu.cta_splits);
}

/// Every launch variant of the skinny GEMM (unroll, pipelining, register cap) gives the default's bits, also with the
/// split rule's one-block reductions of 8 and 16 splits; other split counts stay within bf16-GEMM tolerance of the CPU.
TEST(CudaSkinnyGemm, TuningVariantsEqualDefaultBits) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<Shape> shapes = gemm_shapes();
  shapes.push_back({"gt.out_proj", 1536, 3072});  // the split rule: 16 splits in one block
  shapes.push_back({"n3.out_proj", 2688, 4096});  // 8 in one block
  for (const auto& sh : shapes) {
    for (int64_t M : {1, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << sh.name << " M=" << M);
      const int64_t ys = sh.N;
      // The fixed variants, then every launch form with the default's summation order (its split shift and splits
      // per block, which the split rule sets per shape).
      std::vector<cuda::SkinnyTuning> variants = tunings();
      const cuda::SkinnyTuning d = cuda::skinny_default_tuning(M, sh.N, sh.K);
      for (int u : {2, 4, 8})
        for (bool pipe : {false, true})
          for (bool cap : {false, true}) variants.push_back({u, pipe, cap, d.split_shift, d.cta_splits});
      Operands op(rng, M, sh.N, sh.K, sh.K);
      const auto ref = op.reference(ys);
      DeviceBuffer d0(M * ys * 4);
      SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, op.dx.data(), sh.K, op.dw.data(), sh.K, DType::BF16, d0.data(), ys,
                             DType::F32}, nullptr, 0, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto want = to_host<float>(d0, M * ys);
      for (const auto& tu : variants) {
        SCOPED_TRACE(::testing::Message() << "unroll " << tu.unroll << " pipelined " << tu.pipelined << " cap "
                                        << tu.reg_cap << " shift " << tu.split_shift << " cta " << tu.cta_splits);
        cuda::SkinnyExtras ex;
        ex.tuning = &tu;
        DeviceBuffer d1 = poisoned_bytes(M * ys * 4);
        SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, op.dx.data(), sh.K, op.dw.data(), sh.K, DType::BF16, d1.data(), ys,
                               DType::F32}, nullptr, 0, true, nullptr, ex));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(d1, M * ys);
        if (same_order(tu, M, sh.N, sh.K))
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
        else
          EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, M, sh.N), 1e-4);
      }
    }
  }
}

/// skinny_part_tuning (host only, runs without a GPU): for any row count of any decode-sized weight, the part's
/// split count and block splits equal the whole weight's default ones (the condition for the same bits).
TEST(CudaSkinnyGemm, PartTuningKeepsTheWholeSplitCount) {
  for (int64_t K : {160, 768, 2560, 5120})
    for (int64_t N : {192, 3072, 8192, 10240, 10576, 50280})
      for (int64_t rows = 16; rows < N; rows += std::max<int64_t>(16, N / 37 / 16 * 16)) {
        const cuda::SkinnyTuning w = cuda::skinny_default_tuning(1, N, K), p = cuda::skinny_part_tuning(1, rows, N, K);
        ASSERT_EQ(cuda::skinny_gemm_splits(rows, K, p.split_shift), cuda::skinny_gemm_splits(N, K, w.split_shift))
            << "N " << N << " K " << K << " rows " << rows;
        ASSERT_EQ(p.cta_splits, w.cta_splits);
      }
}

/// A weight cut into two row ranges run as separate GEMMs with skinny_part_tuning (the decode overlap's x + first
/// z rows / remaining z rows of in_proj) == the whole GEMM bit for bit, for the decode shapes' in_proj (where the
/// parts' own default split counts differ from the whole's, e.g. mamba-2.8b: 4 vs 8) at several cut points.
TEST(CudaSkinnyGemm, PartTuningsSumLikeTheWholeWeight) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // mamba-2.8b even in quick mode: its halves' own split count (8) differs from the whole in_proj's (4).
  for (const Mamba1Shape& s : {Mamba1Shape{"mamba-130m", 768, 1536, 16, 4, 48}, Mamba1Shape{"mamba-2.8b", 2560, 5120, 16, 4, 160}}) {
    const int64_t N = 2 * s.d_inner, K = s.d_model;
    for (int64_t M : {1, 5, 16}) {
      Operands op(rng, M, N, K, K);
      DeviceBuffer whole(M * N * 4);
      SSM_CUDA_CHECK(skinny({M, N, K, op.dx.data(), K, op.dw.data(), K, DType::BF16, whole.data(), N, DType::F32},
                            nullptr, 0, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto want = to_host<float>(whole, M * N);
      for (int64_t cut : {int64_t{16}, s.d_inner, s.d_inner + s.d_inner / 4 / 16 * 16, N - 16}) {
        SCOPED_TRACE(::testing::Message() << s.name << " M=" << M << " cut " << cut);
        DeviceBuffer parts = poisoned_bytes(M * N * 4);
        const cuda::SkinnyTuning t0 = cuda::skinny_part_tuning(M, cut, N, K), t1 = cuda::skinny_part_tuning(M, N - cut, N, K);
        cuda::SkinnyExtras e0, e1;
        e0.tuning = &t0, e1.tuning = &t1;
        const auto* w = static_cast<const uint16_t*>(op.dw.data());
        SSM_CUDA_CHECK(skinny({M, cut, K, op.dx.data(), K, w, K, DType::BF16, parts.data(), N, DType::F32}, nullptr, 0,
                              true, nullptr, e0));
        SSM_CUDA_CHECK(skinny({M, N - cut, K, op.dx.data(), K, w + cut * K, K, DType::BF16, parts.as<float>() + cut, N,
                               DType::F32}, nullptr, 0, true, nullptr, e1));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(parts, M * N);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
      }
    }
  }
}

/// The MLP activation in the epilogue (SkinnyActEpilogue) against the plain GEMM (gate over up, not interleaved)
/// followed by mlp_activation, bit for bit: SiLU-gated on the 8-interleaved weight and relu^2, bf16 and fp32 outputs,
/// M = 1..40 (every m-tile form), K from one chunk to deep weights reduced across blocks (group sums: I = 256, below the
/// split rule's 64 tiles) and in one block (I = 1536, the split rule's 8 / 16 splits) and K % 8 != 0
/// (the scalar-load forms), I from 8 to
/// Falcon-H1-7B's 12288. Also mlp_activation on the interleaved columns of the plain (no epilogue) GEMM, the path of
/// steps off the skinny kernel. The output's row padding stays untouched.
TEST(CudaSkinnyGemm, ActEpilogueEqualsSeparateActivation) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    int64_t I, K;
  };
  for (const Case c : {Case{8, 32}, Case{40, 200}, Case{40, 203}, Case{256, 12288}, Case{512, 1536}, Case{1536, 12288},
                       Case{12288, 3072}}) {
    for (int64_t M : {1, 2, 7, 9, 16, 40}) {
      if (c.I == 12288 && M > 2) continue;
      for (bool gated : {true, false}) {
        for (DType od : {DType::BF16, DType::F32}) {
          SCOPED_TRACE(::testing::Message() << "I=" << c.I << " K=" << c.K << " M=" << M << " gated " << gated << " out "
                                            << dtype_name(od));
          const int64_t I = c.I, K = c.K, N = gated ? 2 * I : I, os = I + 3, es = dtype_size(od);
          Operands op(rng, M, N, K, K);  // op.w: gate rows then up rows
          std::vector<float> wi(op.w.size());
          for (int64_t i = 0; i < N / 16 && gated; ++i)
            for (int64_t r = 0; r < 8; ++r) {
              std::memcpy(&wi[(16 * i + r) * K], &op.w[(8 * i + r) * K], K * 4);
              std::memcpy(&wi[(16 * i + 8 + r) * K], &op.w[(I + 8 * i + r) * K], K * 4);
            }
          DeviceBuffer dwi = to_device(to_bf16_bits(gated ? wi : op.w));
          // Reference: the plain GEMM, then mlp_activation.
          DeviceBuffer y(M * N * 4), ref = poisoned_bytes(M * os * es), got = poisoned_bytes(M * os * es);
          SSM_CUDA_CHECK(skinny({M, N, K, op.dx.data(), K, op.dw.data(), K, DType::BF16, y.data(), N, DType::F32}, nullptr,
                                0, true, nullptr));
          SSM_CUDA_CHECK(cuda::mlp_activation(y.as<float>(), N, M, I, gated, ref.data(), od, os, nullptr, true));
          cuda::SkinnyExtras ex;
          ex.act = {gated ? cuda::SkinnyAct::kSiluGatedInterleaved8 : cuda::SkinnyAct::kRelu2, got.data(), os, od};
          SSM_CUDA_CHECK(skinny({M, N, K, op.dx.data(), K, dwi.data(), K, DType::BF16, nullptr, N, DType::F32}, nullptr, 0,
                                true, nullptr, ex));
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          const auto a = to_host<uint8_t>(ref, M * os * es), b = to_host<uint8_t>(got, M * os * es);
          ASSERT_EQ(a, b) << "epilogue activation differs from GEMM + mlp_activation";
          for (int64_t m = 0; m < M; ++m)
            for (int64_t k = I * es; k < os * es; ++k) ASSERT_EQ(b[m * os * es + k], 0xff) << "padding written, row " << m;
          if (!gated) continue;
          // Steps off the skinny kernel: the interleaved GEMM's columns through mlp_activation(interleaved8).
          DeviceBuffer yi(M * N * 4), got2 = poisoned_bytes(M * os * es);
          SSM_CUDA_CHECK(skinny({M, N, K, op.dx.data(), K, dwi.data(), K, DType::BF16, yi.data(), N, DType::F32}, nullptr,
                                0, true, nullptr));
          SSM_CUDA_CHECK(cuda::mlp_activation(yi.as<float>(), N, M, I, true, got2.data(), od, os, nullptr, true, true));
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          ASSERT_EQ(a, to_host<uint8_t>(got2, M * os * es)) << "interleaved mlp_activation differs";
        }
      }
    }
  }
  // Bad epilogues: N not a multiple of 16 for the interleaved form, a y2 copy beside it, a short output stride.
  DeviceBuffer x(64 * 2), w(24 * 64 * 2), out(64 * 4), y2(64 * 2);
  cuda::SkinnyExtras ex;
  ex.act = {cuda::SkinnyAct::kSiluGatedInterleaved8, out.data(), 12, DType::BF16};
  EXPECT_EQ(skinny({1, 24, 64, x.data(), 64, w.data(), 64, DType::BF16, nullptr, 24, DType::F32}, nullptr, 0, false, nullptr, ex),
            cudaErrorInvalidValue);
  EXPECT_EQ(skinny({1, 16, 64, x.data(), 64, w.data(), 64, DType::BF16, out.data(), 16, DType::F32}, y2.data(), 16, false,
                   nullptr, ex),
            cudaErrorInvalidValue);
  ex.act.out_stride = 7;
  EXPECT_EQ(skinny({1, 16, 64, x.data(), 64, w.data(), 64, DType::BF16, nullptr, 16, DType::F32}, nullptr, 0, false, nullptr, ex),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::mlp_activation(out.as<float>(), 16, 1, 8, false, y2.data(), DType::BF16, 8, nullptr, false, true),
            cudaErrorInvalidValue);  // interleaved without the gate
}

TEST(CudaSkinnyGemm, RejectsBadArguments) {
  REQUIRE_GPU();
  EXPECT_EQ(cuda::skinny_gemm({1, 8, 16, nullptr, 16, nullptr, 16, DType::F32, nullptr, 8, DType::F32}, nullptr, 0,
                              false, nullptr),
            cudaErrorInvalidValue);
  DeviceBuffer w(8 * 16 * 2), y(64);
  EXPECT_EQ(cuda::skinny_gemm({1, 8, 16, w.data(), 8, w.data(), 16, DType::BF16, y.data(), 8, DType::F32}, nullptr, 0,
                              false, nullptr),
            cudaErrorInvalidValue);  // x stride < K
  EXPECT_EQ(cuda::skinny_gemm_splits(10240, 2560), 4);
  EXPECT_EQ(cuda::skinny_gemm_splits(5120, 160), 1);
  EXPECT_EQ(cuda::skinny_gemm_splits(192, 5120), 64);  // 4 blocks of 16 splits per tile
  EXPECT_GT(cuda::skinny_gemm_workspace(1, 192, 5120), 0u);
  DeviceBuffer x(5120 * 2), w2(192 * 5120 * 2), y2(192 * 4);
  EXPECT_EQ(cuda::skinny_gemm({1, 192, 5120, x.data(), 5120, w2.data(), 5120, DType::BF16, y2.data(), 192, DType::F32},
                              nullptr, 0, false, nullptr),
            cudaErrorInvalidValue);  // needs its workspace
}

/// The fp32 GEMV of few rows (the MoE router at decode): GemmHandle sends fp32 GEMMs of M <= 8 to it outside
/// batch-invariant mode; within 1e-5 of a float64 reference; each row bit-identical for every M and row offset;
/// padding columns untouched; the same bits with KernelTuning::f32_gemv_preload on and off (K = 36 and 4: fewer
/// chunks than the preload holds; 1536-2688: the rest after it; 1540: a partial chunk row past 1024); K % 4 != 0,
/// M > 8 and batch-invariant mode stay on the other paths.
TEST(CudaSkinnyGemm, F32GemvMatchesCpuForEveryRowCount) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  cuda::GemmHandle h;
  struct Sh { int64_t N, K; };
  for (const Sh sh : {Sh{64, 1536}, Sh{128, 2688}, Sh{256, 2048}, Sh{512, 2048}, Sh{13, 36}, Sh{9, 4}, Sh{24, 1540}}) {
    SCOPED_TRACE(::testing::Message() << "N " << sh.N << " K " << sh.K);
    const int64_t xs = sh.K + 4, ys = sh.N + 3, R = 10;
    std::vector<float> x(R * xs), w(sh.N * sh.K);
    for (auto& v : x) v = u(rng);
    for (auto& v : w) v = u(rng);
    DeviceBuffer dx = to_device(x), dw = to_device(w);
    std::vector<float> alone;  // row 0 .. R-1 computed with M = 1 at each offset
    for (int64_t M = 1; M <= 8; ++M) {
      for (int64_t off : {int64_t{0}, R - M}) {
        SCOPED_TRACE(::testing::Message() << "M " << M << " offset " << off);
        DeviceBuffer dy = poisoned_bytes(M * ys * 4);
        const int64_t before = h.f32_gemv_calls();
        h.run({M, sh.N, sh.K, dx.as<float>() + off * xs, xs, dw.data(), sh.K, DType::F32, dy.data(), ys, DType::F32},
              nullptr);
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(h.f32_gemv_calls(), before + 1);
        const auto y = to_host<float>(dy, M * ys);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < sh.N; ++n) {
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < sh.K; ++k) {
              ref += static_cast<double>(x[(off + m) * xs + k]) * w[n * sh.K + k];
              mag += std::abs(static_cast<double>(x[(off + m) * xs + k]) * w[n * sh.K + k]);
            }
            ASSERT_NEAR(y[m * ys + n], ref, 1e-5 * (mag + 1.0)) << "row " << m << " col " << n;
          }
          uint32_t pad;
          std::memcpy(&pad, &y[m * ys + sh.N], 4);
          ASSERT_EQ(pad, 0xffffffffu) << "padding written, row " << m;
        }
        {  // KernelTuning::f32_gemv_preload the other way round (loads before / after the wait): the same bits
          cuda::KernelTuning t = cuda::kernel_tuning();
          t.f32_gemv_preload = !t.f32_gemv_preload;
          TuningScope scope(t);
          DeviceBuffer dy0 = poisoned_bytes(M * ys * 4);
          h.run({M, sh.N, sh.K, dx.as<float>() + off * xs, xs, dw.data(), sh.K, DType::F32, dy0.data(), ys, DType::F32},
                nullptr);
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          ASSERT_EQ(std::memcmp(to_host<float>(dy0, M * ys).data(), y.data(), M * ys * 4), 0) << "preload changed bits";
        }
        if (M == 1 && off == 0) alone.assign(y.begin(), y.begin() + sh.N);
        if (off == 0) {  // row 0 of every M: the bits of M = 1
          ASSERT_EQ(std::memcmp(y.data(), alone.data(), sh.N * 4), 0) << "row 0 differs from its M = 1 result";
        }
      }
    }
  }
  // Not served: K % 4 != 0 (cuBLASLt or the fallback), M > 8, batch-invariant mode (gemm_fallback).
  std::vector<float> x(16 * 40, 0.5f), w(8 * 40, 0.25f);
  DeviceBuffer dx = to_device(x), dw = to_device(w), dy(16 * 8 * 4);
  const int64_t calls = h.f32_gemv_calls();
  h.run({1, 8, 38, dx.data(), 40, dw.data(), 40, DType::F32, dy.data(), 8, DType::F32}, nullptr);
  h.run({9, 8, 40, dx.data(), 40, dw.data(), 40, DType::F32, dy.data(), 8, DType::F32}, nullptr);
  h.set_batch_invariant(true);
  const int64_t fb = h.fallback_calls();
  h.run({1, 8, 40, dx.data(), 40, dw.data(), 40, DType::F32, dy.data(), 8, DType::F32}, nullptr);
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(h.f32_gemv_calls(), calls);
  EXPECT_EQ(h.fallback_calls(), fb + 1);
  EXPECT_EQ(cuda::skinny_gemm_f32({0, 8, 40, dx.data(), 40, dw.data(), 40, DType::F32, dy.data(), 8, DType::F32}, false,
                                  nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssmserve
