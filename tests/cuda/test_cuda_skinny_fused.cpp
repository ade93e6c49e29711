// GPU skinny GEMM's fused forms (skinny_gemm.h): the x input computed in its loads (the MLP activation, the gated
// RMSNorm, an fp32 cast) and the Mamba-2 conv update in its epilogue, each bit-identical to the separate kernel
// followed by (or following) the plain skinny GEMM, and refused where it does not serve. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// The fused GEMM `a` (y set per launch) with extras `ex` gives `want` (M x N fp32) bit for bit in every way it can be
/// launched: the default launch shape, both explicit forms in the default's summation order (pipelined unroll 2,
/// plain unroll 4), and through GemmHandle as the runner calls it (no x, x_stride 0) with a plain launch (the first
/// kernel after a fork).
void expect_every_launch_gives(const cuda::GemmArgs& a, const cuda::SkinnyExtras& ex, const std::vector<float>& want) {
  const cuda::SkinnyTuning d = cuda::skinny_default_tuning(a.M, a.N, a.K);
  cuda::SkinnyTuning forms[2] = {d, d};
  forms[0].auto_shape = forms[1].auto_shape = false;
  forms[0].pipelined = true, forms[0].unroll = 2, forms[1].pipelined = false, forms[1].unroll = 4;
  cuda::GemmHandle gemm;
  for (int f = 0; f < 4; ++f) {
    cuda::SkinnyExtras e = ex;
    if (f == 1 || f == 2) e.tuning = &forms[f - 1];
    DeviceBuffer got_d = poisoned_bytes(a.M * a.N * 4);
    cuda::GemmArgs g = a;
    g.y = got_d.data();
    if (f < 3) {
      SSM_CUDA_CHECK(skinny(g, nullptr, 0, true, nullptr, e));
    } else {
      e.plain_launch = true;
      gemm.run(g, nullptr, nullptr, 0, &e);
    }
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(got_d, a.M * a.N);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
        << (f == 0 ? "default launch" : f == 1 ? "pipelined form" : f == 2 ? "plain form" : "GemmHandle, plain launch");
  }
}

/// The MLP activation in the down GEMM's x loads (SkinnyEwInput kSiluMul / kRelu2): bit-identical to mlp_activation's bf16 rows
/// followed by the plain skinny GEMM, gated (silu(gate) * up) and relu^2, for decode row counts, K not a multiple of
/// 32, the default and explicit launch forms and split counts from 1 to 64 blocks; refused where it does not serve.
TEST(CudaSkinnyGemm, ActInputEqualsActivationThenGemmBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct S { int64_t N, K; };
  const std::vector<S> shapes = quick() ? std::vector<S>{{64, 40}, {3072, 12288}, {100, 1032}}
                                        : std::vector<S>{{64, 40}, {3072, 12288}, {100, 1032}, {17, 8}, {4096, 2048}, {192, 5120}};
  for (const S& sh : shapes)
    for (bool gated : {true, false})
      for (int64_t M : {1, 3, 8, 9, 16}) {
        SCOPED_TRACE(::testing::Message() << "N=" << sh.N << " K=" << sh.K << " gated " << gated << " M=" << M);
        const int64_t gs = (gated ? 2 * sh.K : sh.K) + 4;  // 16-byte aligned rows
        std::vector<float> gu = rand_vec(rng, static_cast<size_t>(M * gs), -4.0f, 4.0f);
        std::vector<float> w = rand_vec(rng, static_cast<size_t>(sh.N * sh.K), -0.05f, 0.05f);
        DeviceBuffer dgu = to_device(gu), dw = to_device(to_bf16_bits(w)), dact(M * sh.K * 2);
        SSM_CUDA_CHECK(cuda::mlp_activation(dgu.as<float>(), gs, M, sh.K, gated, dact.data(), DType::BF16, sh.K, nullptr));
        DeviceBuffer want_d(M * sh.N * 4);
        SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, dact.data(), sh.K, dw.data(), sh.K, DType::BF16, want_d.data(), sh.N,
                               DType::F32}, nullptr, 0, true, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto want = to_host<float>(want_d, M * sh.N);
        const cuda::GemmArgs a{M, sh.N, sh.K, nullptr, 0, dw.data(), sh.K, DType::BF16, nullptr, sh.N, DType::F32};
        cuda::SkinnyExtras ex;
        ex.ew = {dgu.as<float>(), gs, dgu.as<float>() + sh.K, gs, gated ? cuda::SkinnyEwOp::kSiluMul : cuda::SkinnyEwOp::kRelu2};
        ASSERT_TRUE(cuda::skinny_ew_input_serves(a, ex.ew));
        expect_every_launch_gives(a, ex, want);
      }
  // Where it does not serve: more than 16 rows, K % 8 != 0, an unaligned a row, a row stride below K, no b row.
  DeviceBuffer w(64 * 48 * 2), gu(17 * 96 * 4 + 16);
  const cuda::GemmArgs ok{1, 64, 48, nullptr, 0, w.data(), 48, DType::BF16, nullptr, 64, DType::F32};
  const float* g0 = gu.as<float>();
  using Op = cuda::SkinnyEwOp;
  EXPECT_TRUE(cuda::skinny_ew_input_serves(ok, {g0, 96, g0 + 48, 96, Op::kSiluMul}));
  cuda::GemmArgs big = ok;
  big.M = 17;
  EXPECT_FALSE(cuda::skinny_ew_input_serves(big, {g0, 96, g0 + 48, 96, Op::kSiluMul}));
  cuda::GemmArgs odd = ok;
  odd.K = 44, odd.w_stride = 44;
  EXPECT_FALSE(cuda::skinny_ew_input_serves(odd, {g0, 96, g0 + 44, 96, Op::kSiluMul}));
  EXPECT_FALSE(cuda::skinny_ew_input_serves(ok, {g0 + 1, 96, g0 + 49, 96, Op::kSiluMul}));
  EXPECT_FALSE(cuda::skinny_ew_input_serves(ok, {g0, 44, g0 + 48, 96, Op::kSiluMul}));
  EXPECT_FALSE(cuda::skinny_ew_input_serves(ok, {g0, 96, nullptr, 0, Op::kSigmoidGate}));
  EXPECT_TRUE(cuda::skinny_ew_input_serves(ok, {g0, 48, nullptr, 0, Op::kRelu2}));
  DeviceBuffer y(64 * 4);
  cuda::GemmArgs bad = big;
  bad.y = y.data();
  cuda::SkinnyExtras e;
  e.ew = {g0, 96, g0 + 48, 96, Op::kSiluMul};
  EXPECT_EQ(cuda::skinny_gemm(bad, nullptr, 0, false, nullptr, nullptr, 0, nullptr, e), cudaErrorInvalidValue);
}

/// The gated RMSNorm in the out projection's x loads (SkinnyGatedNormInput): bit-identical to gated_rms_norm_pdl's
/// bf16 rows followed by the plain skinny GEMM, for Falcon-H1 / Granite (one group of 3072), Nemotron-style 8 groups,
/// DeltaNet heads of 128 (norm before gate), decode row counts and both explicit launch forms; refused where the
/// (row, group) pairs or the layout do not serve.
TEST(CudaSkinnyGemm, GatedNormInputEqualsNormThenGemmBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct S { int64_t N, K, group; bool nbg; };
  // Plans of 4, 1, 1, 8 and (full) 2 runs per thread.
  std::vector<S> shapes = {{3072, 3072, 3072, false}, {512, 2048, 128, true}, {96, 640, 80, false}, {256, 5120, 5120, true}};
  if (!quick())
    for (const S& e : {S{1536, 4096, 512, false}, S{64, 256, 256, true}, S{2048, 4096, 128, true}, S{128, 2048, 2048, false}})
      shapes.push_back(e);
  for (const S& sh : shapes)
    for (int64_t M : {1, 3, 8, 9, 16}) {
      SCOPED_TRACE(::testing::Message() << "N=" << sh.N << " K=" << sh.K << " group " << sh.group << " M=" << M);
      const int64_t ys = sh.K + 4, zs = 2 * sh.K + 8;
      std::vector<float> y = rand_vec(rng, static_cast<size_t>(M * ys), -2.0f, 2.0f);
      std::vector<float> z = rand_vec(rng, static_cast<size_t>(M * zs), -4.0f, 4.0f);
      std::vector<float> nw = rand_vec(rng, static_cast<size_t>(sh.K), 0.5f, 1.5f);
      std::vector<float> w = rand_vec(rng, static_cast<size_t>(sh.N * sh.K), -0.05f, 0.05f);
      DeviceBuffer dy = to_device(y), dz = to_device(z), dnw = to_device(nw), dw = to_device(to_bf16_bits(w));
      const cuda::GemmArgs a{M, sh.N, sh.K, nullptr, 0, dw.data(), sh.K, DType::BF16, nullptr, sh.N, DType::F32};
      cuda::SkinnyExtras ex;
      ex.norm = {dy.as<float>(), ys, dz.as<float>(), zs, dnw.as<float>(), 1e-5f, sh.group, sh.nbg};
      const bool serves = std::min<int64_t>(M, 16) * (sh.K / sh.group) <= 128;
      ASSERT_EQ(cuda::skinny_gated_norm_input_serves(a, ex.norm), serves);
      if (!serves) continue;
      DeviceBuffer dn(M * sh.K * 2), want_d(M * sh.N * 4);
      SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(dy.as<float>(), ys, dz.as<float>(), zs, dnw.as<float>(), 1e-5f, M, sh.K, sh.group,
                                              sh.nbg, dn.data(), DType::BF16, sh.K, true, nullptr));
      SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, dn.data(), sh.K, dw.data(), sh.K, DType::BF16, want_d.data(), sh.N,
                             DType::F32}, nullptr, 0, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto want = to_host<float>(want_d, M * sh.N);
      expect_every_launch_gives(a, ex, want);
    }
  // Not served: group not a multiple of 8, unaligned y, with the activation input too (refused by skinny_gemm).
  DeviceBuffer w(64 * 256 * 2), y(256 * 4 + 16), z(256 * 4), nw(256 * 4), out(64 * 4);
  const cuda::GemmArgs ok{1, 64, 256, nullptr, 0, w.data(), 256, DType::BF16, out.as<float>(), 64, DType::F32};
  cuda::SkinnyGatedNormInput n{y.as<float>(), 256, z.as<float>(), 256, nw.as<float>(), 1e-5f, 256, false};
  EXPECT_TRUE(cuda::skinny_gated_norm_input_serves(ok, n));
  cuda::SkinnyGatedNormInput odd = n;
  odd.group_size = 4;
  EXPECT_FALSE(cuda::skinny_gated_norm_input_serves(ok, odd));
  cuda::SkinnyGatedNormInput shifted = n;
  shifted.y = y.as<float>() + 1;
  EXPECT_FALSE(cuda::skinny_gated_norm_input_serves(ok, shifted));
  cuda::SkinnyExtras both;
  both.norm = n, both.ew = {y.as<float>(), 256, nullptr, 0, cuda::SkinnyEwOp::kCopy};
  EXPECT_EQ(cuda::skinny_gemm(ok, nullptr, 0, false, nullptr, nullptr, 0, nullptr, both), cudaErrorInvalidValue);
}

/// The Mamba-2 decode conv update in the input projection's epilogue (SkinnyConvEpilogue): the projection, the conv
/// outputs and the conv states bit-identical to the plain skinny GEMM followed by conv1d_update_dual, for fp32 and bf16
/// states, widths 4 and 2, with and without bias, padding rows (block 0) and fewer conv rows than GEMM rows, channels
/// inside a wider output (a stacked pair's columns).
TEST(CudaSkinnyGemm, ConvEpilogueEqualsGemmThenConvUpdateBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct S { int64_t N, K, col0, dim; int width; bool bias; DType sd; };
  // Mamba-2-like (channels after z, bias), DeltaNet-like (channels from column 0, no bias), widths 1 to 8.
  const std::vector<S> shapes = {{3328, 1024, 1024, 2304, 4, true, DType::F32}, {600, 256, 40, 520, 2, false, DType::BF16},
                                 {12000, 3072, 6400, 3328, 4, true, DType::BF16}, {4096, 512, 0, 2048, 4, false, DType::F32},
                                 {256, 128, 64, 128, 1, true, DType::F32}, {1024, 256, 128, 512, 8, true, DType::BF16}};
  for (const S& sh : shapes)
    for (int64_t M : {1, 4, 6, 9, 16}) {
      SCOPED_TRACE(::testing::Message() << "N=" << sh.N << " K=" << sh.K << " dim " << sh.dim << " width " << sh.width
                                        << " bf16 state " << (sh.sd == DType::BF16) << " M=" << M);
      const int64_t rows = M > 4 ? M - 2 : M, blocks = M + 3, stride = (sh.width - 1) * sh.dim + 8;
      const size_t es = sh.sd == DType::F32 ? 4 : 2;
      std::vector<int32_t> idx(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m) idx[m] = m % 3 == 2 ? 0 : static_cast<int32_t>(m + 1);  // every third row padding
      Operands op(rng, M, sh.N, sh.K, sh.K);
      std::vector<float> cw = rand_vec(rng, static_cast<size_t>(sh.dim * sh.width), -0.5f, 0.5f);
      std::vector<float> cb = rand_vec(rng, static_cast<size_t>(sh.dim));
      std::vector<float> st = rand_vec(rng, static_cast<size_t>(blocks * stride));
      std::vector<uint8_t> st_bytes(st.size() * es);
      if (es == 4) std::memcpy(st_bytes.data(), st.data(), st_bytes.size());
      else {
        const auto b = to_bf16_bits(st);
        std::memcpy(st_bytes.data(), b.data(), st_bytes.size());
      }
      DeviceBuffer dcw = to_device(cw), dcb = to_device(cb), didx = to_device(idx);
      DeviceBuffer s1 = to_device(st_bytes), s2 = to_device(st_bytes);
      const auto conv_on = [&](DeviceBuffer& states) {
        cuda::ConvParams c{sh.dim, sh.width, dcw.as<float>(), sh.bias ? dcb.as<float>() : nullptr, {}, true};
        c.conv_states.data = states.data(), c.conv_states.dtype = sh.sd, c.conv_states.block_stride = stride;
        return c;
      };
      // Separate: the GEMM, then the conv update of its xBC columns.
      DeviceBuffer y1 = poisoned_bytes(M * sh.N * 4), o1 = poisoned_bytes(rows * sh.dim * 4);
      SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, op.dx.data(), sh.K, op.dw.data(), sh.K, DType::BF16, y1.data(), sh.N, DType::F32},
                            nullptr, 0, true, nullptr));
      SSM_CUDA_CHECK(cuda::conv1d_update_dual(y1.as<float>() + sh.col0, sh.N, o1.as<float>(), sh.dim, nullptr, 0, conv_on(s1),
                                              cuda::DeviceDecodeRows{didx.as<int32_t>()}, static_cast<int>(rows), true, nullptr));
      // Fused.
      DeviceBuffer y2 = poisoned_bytes(M * sh.N * 4), o2 = poisoned_bytes(rows * sh.dim * 4);
      cuda::SkinnyExtras ex;
      ex.conv = {conv_on(s2), sh.col0, didx.as<int32_t>(), rows, o2.as<float>(), sh.dim};
      const cuda::GemmArgs g{M, sh.N, sh.K, op.dx.data(), sh.K, op.dw.data(), sh.K, DType::BF16, y2.data(), sh.N, DType::F32};
      ASSERT_TRUE(cuda::skinny_conv_epilogue_serves(g, ex.conv));
      SSM_CUDA_CHECK(skinny(g, nullptr, 0, true, nullptr, ex));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto b = [](DeviceBuffer& d, size_t n) { return to_host<uint8_t>(d, n); };
      ASSERT_EQ(b(y1, M * sh.N * 4), b(y2, M * sh.N * 4)) << "projection";
      ASSERT_EQ(b(o1, rows * sh.dim * 4), b(o2, rows * sh.dim * 4)) << "conv outputs";
      ASSERT_EQ(b(s1, st_bytes.size()), b(s2, st_bytes.size())) << "conv states";
    }
  // Not served: channels past N, a bf16 y, more conv rows than GEMM rows, an F16 state.
  DeviceBuffer x(16 * 64 * 2), w(128 * 64 * 2), y(16 * 128 * 4), cw(64 * 4 * 4), idx(16 * 4), out(16 * 64 * 4), st(4096);
  cuda::SkinnyConvEpilogue e;
  e.conv = {64, 4, cw.as<float>(), nullptr, {}, true};
  e.conv.conv_states.data = st.data(), e.conv.conv_states.block_stride = 3 * 64;
  e.col0 = 64, e.state_indices = idx.as<int32_t>(), e.rows = 1, e.out = out.as<float>(), e.out_stride = 64;
  const cuda::GemmArgs ok{1, 128, 64, x.data(), 64, w.data(), 64, DType::BF16, y.data(), 128, DType::F32};
  EXPECT_TRUE(cuda::skinny_conv_epilogue_serves(ok, e));
  cuda::SkinnyConvEpilogue past = e;
  past.col0 = 65;
  EXPECT_FALSE(cuda::skinny_conv_epilogue_serves(ok, past));
  cuda::GemmArgs ybf = ok;
  ybf.y_dtype = DType::BF16;
  EXPECT_FALSE(cuda::skinny_conv_epilogue_serves(ybf, e));
  cuda::SkinnyConvEpilogue many = e;
  many.rows = 2;
  EXPECT_FALSE(cuda::skinny_conv_epilogue_serves(ok, many));
  cuda::SkinnyConvEpilogue f16 = e;
  f16.conv.conv_states.dtype = DType::F16;
  EXPECT_FALSE(cuda::skinny_conv_epilogue_serves(ok, f16));
}

/// The cast and the attention output gate in the loads (SkinnyEwInput kCopy: the MoE shared expert's fp32 rows and
/// the attention output; kSigmoidGate: Qwen's gated attention): bit-identical to cast_rows / sigmoid_gate into bf16
/// followed by the plain skinny GEMM, for decode row counts, K not a multiple of 32, padded rows, both explicit launch
/// forms and a plain launch through GemmHandle; refused for an unaligned row.
TEST(CudaSkinnyGemm, EwCopyAndGateEqualCastThenGemmBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct S { int64_t N, K; };
  for (const bool gate : {false, true})
    for (const S& sh : {S{2048, 1536}, S{64, 40}, S{1856, 2688}, S{300, 1032}})
      for (int64_t M : {1, 3, 8, 9, 16}) {
        SCOPED_TRACE(::testing::Message() << "gate " << gate << " N=" << sh.N << " K=" << sh.K << " M=" << M);
        const int64_t xs = sh.K + 12, gs = 3 * sh.K + 4;
        std::vector<float> x = rand_vec(rng, static_cast<size_t>(M * xs), -3.0f, 3.0f);
        std::vector<float> g = rand_vec(rng, static_cast<size_t>(M * gs), -6.0f, 6.0f);
        std::vector<float> w = rand_vec(rng, static_cast<size_t>(sh.N * sh.K), -0.05f, 0.05f);
        DeviceBuffer dx = to_device(x), dg = to_device(g), dw = to_device(to_bf16_bits(w)), dc(M * sh.K * 2);
        DeviceBuffer want_d(M * sh.N * 4);
        const float* gr = dg.as<float>() + sh.K;  // the gate columns inside a wider projection row
        if (gate)
          SSM_CUDA_CHECK(cuda::sigmoid_gate(dx.as<float>(), xs, gr, gs, M, sh.K, dc.data(), DType::BF16, sh.K, nullptr));
        else
          SSM_CUDA_CHECK(cuda::cast_rows(dx.as<float>(), xs, M, sh.K, dc.data(), DType::BF16, sh.K, nullptr));
        SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, dc.data(), sh.K, dw.data(), sh.K, DType::BF16, want_d.data(), sh.N, DType::F32},
                              nullptr, 0, true, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto want = to_host<float>(want_d, M * sh.N);
        const cuda::GemmArgs a{M, sh.N, sh.K, nullptr, 0, dw.data(), sh.K, DType::BF16, nullptr, sh.N, DType::F32};
        cuda::SkinnyExtras ex;
        ex.ew = gate ? cuda::SkinnyEwInput{dx.as<float>(), xs, gr, gs, cuda::SkinnyEwOp::kSigmoidGate}
                     : cuda::SkinnyEwInput{dx.as<float>(), xs, nullptr, 0, cuda::SkinnyEwOp::kCopy};
        ASSERT_TRUE(cuda::skinny_ew_input_serves(a, ex.ew));
        expect_every_launch_gives(a, ex, want);
        cuda::SkinnyEwInput shifted = ex.ew;
        shifted.a = dx.as<float>() + 2;
        EXPECT_FALSE(cuda::skinny_ew_input_serves(a, shifted));
      }
}

}  // namespace
}  // namespace ssmserve
