// GPU decode path (issue 7, decode latency and batch invariance): the batch-invariant skinny GEMM and the fused
// decode kernels against their CPU references (and, bit for bit, against the kernels they replace); the skinny
// GEMM's rows bit-identical for every batch size and offset; the engine's batch-invariance test (smaller sweep) on
// the GPU for Mamba-1 and Mamba-2 dummy shapes in batch-invariant mode. DISABLED_ benchmarks (run by
// scripts/gpu-check.sh): skinny GEMM vs cuBLASLt per M at mamba-2.8b shapes, copy bandwidth, bf16 GEMM rate.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <span>

#include "core/error.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "engine/llm_engine.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/persistent_decode.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"
#include "engine/sampler.h"
#include "model/weight.h"
#include "runtime/cuda_mamba.h"
#include "test_util.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// A device buffer of `bytes` bytes, every byte 0xFF.
DeviceBuffer poisoned_bytes(size_t bytes) {
  DeviceBuffer b(bytes);
  b.fill_bytes(0xff);
  return b;
}
std::vector<float> bf16_bits_to_f32(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
  return f;
}

// ---- skinny GEMM ------------------------------------------------------------------------------------------------

/// skinny_gemm with its workspace (allocated per call; counters zeroed).
cudaError_t skinny(const cuda::GemmArgs& g, void* y2, int64_t y2s, bool pdl, cudaStream_t s,
                   const cuda::SkinnyExtras& ex = {}) {
  size_t cb = 0;
  const size_t wb = cuda::skinny_gemm_workspace(g.M, g.N, g.K, &cb, ex.tuning);
  static DeviceBuffer ws, counters;
  if (wb > ws.bytes()) ws = DeviceBuffer(wb);
  if (cb > counters.bytes()) {
    counters = DeviceBuffer(cb);
    counters.fill_bytes(0);
  }
  return cuda::skinny_gemm(g, y2, y2s, pdl, s, ws.data(), ws.bytes(), counters.as<unsigned>(), ex);
}

struct Shape {
  std::string name;
  int64_t N, K;
};
std::vector<Shape> gemm_shapes() {
  std::vector<Shape> c;
  for (const auto& s : mamba1_shapes()) {
    c.push_back({std::string(s.name) + ".in_proj", 2 * s.d_inner, s.d_model});
    c.push_back({std::string(s.name) + ".x_proj", s.dt_rank + 2 * s.d_state, s.d_inner});
    c.push_back({std::string(s.name) + ".dt_proj", s.d_inner, s.dt_rank});
    c.push_back({std::string(s.name) + ".out_proj", s.d_model, s.d_inner});
  }
  for (const auto& s : mamba2_shapes())
    c.push_back({std::string(s.name) + ".in_proj", 2 * s.d_inner() + 2LL * s.n_groups * s.d_state + s.heads, s.d_model});
  c.push_back({"lm_head", 50280, quick() ? 768 : 2560});
  c.push_back({"odd", 70, 35});   // K % 8 != 0: scalar loads
  c.push_back({"tiny", 5, 3});
  return c;
}

/// Random bf16 operands for one shape: x [M, xs], w [N, K]; device copies.
struct Operands {
  int64_t M, N, K, xs;
  std::vector<float> x, w;
  DeviceBuffer dx, dw;
  Operands(std::mt19937& rng, int64_t m, int64_t n, int64_t k, int64_t x_stride)
      : M(m), N(n), K(k), xs(x_stride), x(rand_vec(rng, m * x_stride)), w(rand_vec(rng, n * k, -0.05f, 0.05f)) {
    round_bf16(x), round_bf16(w);
    dx = to_device(to_bf16_bits(x)), dw = to_device(to_bf16_bits(w));
  }
  std::vector<float> reference(int64_t ys) const {
    Weight W = Weight::allocate(DType::F32, N, K);
    std::memcpy(const_cast<void*>(W.data), w.data(), w.size() * 4);
    std::vector<float> ref(M * ys, 0.0f);
    cpu::linear(x.data(), M, xs, W, nullptr, ref.data(), ys);
    return ref;
  }
};

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
    DeviceBuffer full(Mmax * sh.N * 4);
    gemm.run({Mmax, sh.N, sh.K, op.dx.data(), sh.K, op.dw.data(), sh.K, DType::BF16, full.data(), sh.N, DType::F32}, nullptr);
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto want = to_host<float>(full, Mmax * sh.N);
    for (int64_t M : {1, 2, 5, 8, 9, 16, 17, 33, 64}) {
      const int64_t off = static_cast<int64_t>(rng() % (Mmax - M + 1));
      DeviceBuffer part(M * sh.N * 4);
      const auto* x0 = static_cast<const uint16_t*>(op.dx.data()) + off * sh.K;
      gemm.run({M, sh.N, sh.K, x0, sh.K, op.dw.data(), sh.K, DType::BF16, part.data(), sh.N, DType::F32}, nullptr);
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<float>(part, M * sh.N);
      ASSERT_EQ(std::memcmp(got.data(), want.data() + off * sh.N, M * sh.N * 4), 0) << "M=" << M << " offset " << off;
    }
  }
  EXPECT_GT(gemm.skinny_calls(), 0);
}

/// Every launch variant of the skinny GEMM (unroll, pipelining, register cap) gives the default's bits; other
/// split counts stay within bf16-GEMM tolerance of the CPU.
/// The tuning variants the tests and the benchmark sweep; the default's summation order first (cta 4, shift 0).
std::vector<cuda::SkinnyTuning> tunings() {
  std::vector<cuda::SkinnyTuning> t;
  for (int u : {2, 4, 8})
    for (bool pipe : {false, true})
      for (bool cap : {false, true}) t.push_back({u, pipe, cap, 0, 4});
  for (int cta : {8, 16}) {
    t.push_back({4, false, true, 0, cta});
    t.push_back({2, true, false, 0, cta});
  }
  for (int shift : {-1, 1}) {
    t.push_back({2, true, false, shift, 4});
    t.push_back({4, false, false, shift, 4});
  }
  return t;
}

/// True when tuning `tu` sums in the default's order for an N x K weight.
bool same_order(const cuda::SkinnyTuning& tu, int64_t M, int64_t N, int64_t K) {
  const cuda::SkinnyTuning d = cuda::skinny_default_tuning(M, N, K);
  const int s0 = cuda::skinny_gemm_splits(N, K, d.split_shift), s1 = cuda::skinny_gemm_splits(N, K, tu.split_shift);
  return s0 == s1 && std::min(s0, d.cta_splits) == std::min(s1, tu.cta_splits);
}

TEST(CudaSkinnyGemm, TuningVariantsEqualDefaultBits) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& sh : gemm_shapes()) {
    for (int64_t M : {1, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << sh.name << " M=" << M);
      const int64_t ys = sh.N;
      Operands op(rng, M, sh.N, sh.K, sh.K);
      const auto ref = op.reference(ys);
      DeviceBuffer d0(M * ys * 4);
      SSM_CUDA_CHECK(skinny({M, sh.N, sh.K, op.dx.data(), sh.K, op.dw.data(), sh.K, DType::BF16, d0.data(), ys,
                             DType::F32}, nullptr, 0, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto want = to_host<float>(d0, M * ys);
      for (const auto& tu : tunings()) {
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

/// in_proj with the fused conv epilogue == in_proj, then conv1d_update_dual (y, conv output, bf16 copy, windows),
/// for Mamba-1 (conv over the first d_inner columns) and Mamba-2 (conv over xBC in the middle) layouts.
TEST(CudaSkinnyGemm, ConvEpilogueEqualsConvUpdateDual) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    const char* name;
    int64_t N, K, lo, dim;
  };
  std::vector<Case> cases = {{"m1-130m", 3072, 768, 0, 1536}, {"m2-odd", 600, 256, 100, 300}};
  if (!quick()) cases.push_back({"m2-2.7b", 10576, 2560, 5120, 5376});
  for (const Case& cs : cases) {
    for (DType sd : {DType::F32, DType::BF16}) {
      for (int M : {1, 5, 16}) {
        SCOPED_TRACE(::testing::Message() << cs.name << " M=" << M << " state " << dtype_name(sd));
        const int width = 4;
        std::vector<int> lens(M, 1);
        const Batch b = make_batch(lens, M > 1 ? std::vector<int>{1} : std::vector<int>{});
        Operands op(rng, M, cs.N, cs.K, cs.K);
        auto w = rand_vec(rng, cs.dim * width), bias = rand_vec(rng, cs.dim, -0.1f, 0.1f);
        StatePool pool(sd, (width - 1) * cs.dim, M + 1, rng), pool2(sd, (width - 1) * cs.dim, M + 1, rng);
        pool2.host = pool.host;
        pool2.dev.upload(pool.host.data(), pool.host.size());
        DeviceBuffer dw = to_device(w), dbias = to_device(bias), dsi = to_device(b.state_indices);
        cuda::ConvParams g1{cs.dim, width, dw.as<float>(), dbias.as<float>(), pool.dev_view(), true};
        cuda::ConvParams g2{cs.dim, width, dw.as<float>(), dbias.as<float>(), pool2.dev_view(), true};
        const int64_t ys = cs.N + 2, os = cs.dim + 1;
        DeviceBuffer y1 = poisoned_bytes(M * ys * 4), y2 = poisoned_bytes(M * ys * 4);
        DeviceBuffer o1 = poisoned_bytes(M * os * 4), o1b = poisoned_bytes(M * os * 2);
        DeviceBuffer o2 = poisoned_bytes(M * os * 4), o2b = poisoned_bytes(M * os * 2);
        const cuda::GemmArgs g{M, cs.N, cs.K, op.dx.data(), cs.K, op.dw.data(), cs.K, DType::BF16, y1.data(), ys, DType::F32};
        SSM_CUDA_CHECK(skinny(g, nullptr, 0, true, nullptr));
        SSM_CUDA_CHECK(cuda::conv1d_update_dual(y1.as<float>() + cs.lo, ys, o1.as<float>(), os, o1b.data(), os, g1,
                                                dsi.as<int32_t>(), M, true, nullptr));
        const cuda::SkinnyConvEpilogue ce{g2, cs.lo, dsi.as<int32_t>(), o2.as<float>(), os, o2b.data(), os};
        cuda::SkinnyExtras ex;
        ex.conv = &ce;
        cuda::GemmArgs g2a = g;
        g2a.y = y2.data();
        SSM_CUDA_CHECK(skinny(g2a, nullptr, 0, true, nullptr, ex));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(to_host<uint8_t>(y1, M * ys * 4), to_host<uint8_t>(y2, M * ys * 4)) << "y";
        EXPECT_EQ(to_host<uint8_t>(o1, M * os * 4), to_host<uint8_t>(o2, M * os * 4)) << "conv out";
        EXPECT_EQ(to_host<uint8_t>(o1b, M * os * 2), to_host<uint8_t>(o2b, M * os * 2)) << "conv out bf16";
        std::vector<uint8_t> s1(pool.host.size()), s2(pool.host.size());
        pool.dev.download(s1.data(), s1.size());
        pool2.dev.download(s2.data(), s2.size());
        EXPECT_EQ(s1, s2) << "windows";
      }
    }
  }
  // A malformed epilogue is refused.
  DeviceBuffer x(16 * 2), w(8 * 16 * 2), y(8 * 4), out(8 * 4), si(4);
  cuda::SkinnyConvEpilogue bad{{8, 4, w.as<float>(), nullptr, {}, true}, 4, si.as<int32_t>(), out.as<float>(), 8, nullptr, 0};
  cuda::SkinnyExtras ex;
  ex.conv = &bad;
  EXPECT_EQ(cuda::skinny_gemm({1, 8, 16, x.data(), 16, w.data(), 16, DType::BF16, y.data(), 8, DType::F32}, nullptr, 0,
                              false, nullptr, nullptr, 0, nullptr, ex),
            cudaErrorInvalidValue);  // columns past N, no state pool
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

// ---- fused decode kernels ---------------------------------------------------------------------------------------

TEST(CudaDecodeOps, NormRowsMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {256, 768, 2560, 1000, 5120})
  for (int64_t pad : {2, 4}) {  // pad 4: 16-byte aligned rows (the float4 form for H % 4 == 0, H <= 4096)
    SCOPED_TRACE(::testing::Message() << "pad " << pad);
    const int64_t T = 9, xs = H + 4, rs = H + pad, os = H + 1;
    auto x = rand_vec(rng, T * xs), res = rand_vec(rng, T * rs), w = rand_vec(rng, H, 0.5f, 1.5f);
    std::vector<float> sum(T * H), ref(T * H);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) sum[t * H + h] = res[t * rs + h] + x[t * xs + h];
    cpu::rms_norm(sum.data(), w.data(), 1e-5f, T, H, ref.data());
    DeviceBuffer dx = to_device(x), dr = to_device(res), dw = to_device(w);
    // All rows, residual written back, fp32 out.
    DeviceBuffer dout = poisoned_bytes(T * os * 4);
    SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx.as<float>(), xs, dr.as<float>(), rs, dw.as<float>(), 1e-5f, nullptr, T, H,
                                           true, dout.data(), DType::F32, os, true, nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    auto got = to_host<float>(dout, T * os);
    EXPECT_LT(rel_err(got.data(), os, ref.data(), H, T, H), 1e-5) << "H=" << H;
    auto r = to_host<float>(dr, T * rs);
    EXPECT_LT(rel_err(r.data(), rs, sum.data(), H, T, H), 1e-7) << "residual H=" << H;
    // Gathered rows (the LM head's logits rows), residual untouched, bf16 out.
    dr.upload(res.data(), res.size() * 4);
    const std::vector<int32_t> rows = {8, 0, 3};
    DeviceBuffer drows = to_device(rows), dob = poisoned_bytes(3 * os * 2);
    SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx.as<float>(), xs, dr.as<float>(), rs, dw.as<float>(), 1e-5f,
                                           drows.as<int32_t>(), 3, H, false, dob.data(), DType::BF16, os, false, nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    auto gb = bf16_bits_to_f32(to_host<uint16_t>(dob, 3 * os));
    std::vector<float> refg(3 * H);
    for (int i = 0; i < 3; ++i) std::copy_n(ref.data() + rows[i] * H, H, refg.data() + i * H);
    EXPECT_LT(rel_err(gb.data(), os, refg.data(), H, 3, H), 8e-3) << "gathered H=" << H;
    EXPECT_EQ(to_host<float>(dr, T * rs), res) << "residual modified with rows given";
  }
  EXPECT_EQ(cuda::add_rms_norm_rows(nullptr, 0, nullptr, 8, nullptr, 1e-5f, nullptr, 1, 8, true, nullptr, DType::F32, 8,
                                    false, nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaDecodeOps, GatedNormPdlEqualsGatedNorm) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t D : {512, 5120}) {
    for (int layout = 0; layout < 4; ++layout) {  // bit 0: norm_before_gate; bit 1: strides of 4 (float4 kernel)
      const bool nbg = layout & 1, vec = layout & 2;
      const int64_t T = 5, ys = D + (vec ? 4 : 3), zs = D + (vec ? 8 : 7), group = D / 2;
      auto y = rand_vec(rng, T * ys), z = rand_vec(rng, T * zs, -3, 3), w = rand_vec(rng, D, 0.5f, 1.5f);
      DeviceBuffer dy = to_device(y), dz = to_device(z), dw = to_device(w);
      DeviceBuffer o1 = poisoned_bytes(T * D * 4), o2 = poisoned_bytes(T * D * 4);
      SSM_CUDA_CHECK(cuda::gated_rms_norm(dy.as<float>(), ys, dz.as<float>(), zs, dw.as<float>(), 1e-5f, T, D, group, nbg,
                                          o1.data(), DType::F32, D, nullptr));
      SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(dy.as<float>(), ys, dz.as<float>(), zs, dw.as<float>(), 1e-5f, T, D, group,
                                              nbg, o2.data(), DType::F32, D, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(to_host<float>(o1, T * D), to_host<float>(o2, T * D))
          << "D=" << D << " norm_before_gate " << nbg << " float4 " << vec;
    }
  }
}

TEST(CudaDecodeOps, ConvUpdateDualEqualsConvUpdateAndCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t dim : {1536, 5120, 200}) {
    for (DType sd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << "dim " << dim << " state " << dtype_name(sd));
      const int width = 4;
      const Batch b = make_batch({1, 1, 1, 1, 1}, {2});
      const int B = b.num_seqs();
      const int64_t xs = 2 * dim, os = dim + 3;
      auto x = rand_vec(rng, B * xs), w = rand_vec(rng, dim * width), bias = rand_vec(rng, dim, -0.1f, 0.1f);
      StatePool pool(sd, (width - 1) * dim, B + 1, rng);
      StatePool pool2(sd, (width - 1) * dim, B + 1, rng);
      pool2.host = pool.host;
      pool2.dev.upload(pool.host.data(), pool.host.size());
      DeviceBuffer dx = to_device(x), dw = to_device(w), dbias = to_device(bias), dsi = to_device(b.state_indices);
      cpu::ConvParams cp{dim, width, w.data(), bias.data(), pool.host_view(), true};
      cuda::ConvParams g1{dim, width, dw.as<float>(), dbias.as<float>(), pool.dev_view(), true};
      cuda::ConvParams g2{dim, width, dw.as<float>(), dbias.as<float>(), pool2.dev_view(), true};
      std::vector<float> ref(B * os, 0.0f);
      cpu::causal_conv1d_update(x.data(), xs, ref.data(), os, cp, sp(b.state_indices));
      DeviceBuffer o1 = poisoned_bytes(B * os * 4), o2 = poisoned_bytes(B * os * 4), o2b = poisoned_bytes(B * os * 2);
      SSM_CUDA_CHECK(cuda::causal_conv1d_update(dx.as<float>(), xs, o1.as<float>(), os, g1, dsi.as<int32_t>(), B, nullptr));
      SSM_CUDA_CHECK(cuda::conv1d_update_dual(dx.as<float>(), xs, o2.as<float>(), os, o2b.data(), os, g2,
                                              dsi.as<int32_t>(), B, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      auto a1 = to_host<float>(o1, B * os), a2 = to_host<float>(o2, B * os);
      auto a2b = to_host<uint16_t>(o2b, B * os);
      EXPECT_EQ(std::memcmp(a1.data(), a2.data(), a1.size() * 4), 0) << "differs from causal_conv1d_update";
      std::vector<uint8_t> mask(B);
      for (int i = 0; i < B; ++i) mask[i] = b.state_indices[i] != 0;
      EXPECT_LT(rel_err(a2.data(), os, ref.data(), os, B, dim, &mask), 1e-6) << "vs cpu";
      for (int i = 0; i < B; ++i)
        for (int64_t c = 0; c < dim && mask[i]; ++c) ASSERT_EQ(a2b[i * os + c], f32_to_bf16(a2[i * os + c]));
      std::vector<uint8_t> s1(pool.host.size()), s2(pool.host.size());
      pool.dev.download(s1.data(), s1.size());
      pool2.dev.download(s2.data(), s2.size());
      EXPECT_EQ(s1, s2) << "window update differs";
      pool2.host = pool.host;  // the CPU-updated windows
      EXPECT_LT(pool2.rel_err_blocks(b.state_indices), 1e-7) << "windows vs cpu";
    }
  }
}

TEST(CudaDecodeOps, ScanUpdateOutEqualsStateUpdateAndCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& s : mamba1_shapes()) {
    for (DType sd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << s.name << " state " << dtype_name(sd));
      const int64_t dim = s.d_inner;
      const int N = s.d_state;
      const Batch b = make_batch({1, 1, 1, 1}, {1});
      const int B = b.num_seqs();
      const int64_t us = dim + 3, ds = dim + 5, bcs = s.dt_rank + 2 * N, zs = 2 * dim, ys = dim + 2;
      auto u = rand_vec(rng, B * us), delta = rand_vec(rng, B * ds, -4.0f, 1.0f), bc = rand_vec(rng, B * bcs),
           z = rand_vec(rng, B * zs, -3, 3);
      std::vector<float> A(dim * N), D = rand_vec(rng, dim), dbias = rand_vec(rng, dim, -1, 0.5f);
      for (int64_t c = 0; c < dim; ++c)
        for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (c % 97));
      StatePool pool(sd, dim * N, B + 1, rng, 0.5f), pool2(sd, dim * N, B + 1, rng, 0.5f);
      pool2.host = pool.host;
      pool2.dev.upload(pool.host.data(), pool.host.size());
      const std::vector<uint8_t> initial = pool.host;
      DeviceBuffer du = to_device(u), dd = to_device(delta), dbc = to_device(bc), dz = to_device(z), dA = to_device(A),
                   dD = to_device(D), dbi = to_device(dbias), dsi = to_device(b.state_indices);
      cpu::ScanInputs ci{{u.data(), us}, {delta.data(), ds}, {bc.data() + s.dt_rank, bcs},
                         {bc.data() + s.dt_rank + N, bcs}, {z.data() + dim, zs}};
      cuda::ScanInputs gi{{du.as<float>(), us}, {dd.as<float>(), ds}, {dbc.as<float>() + s.dt_rank, bcs},
                          {dbc.as<float>() + s.dt_rank + N, bcs}, {dz.as<float>() + dim, zs}};
      cpu::ScanParams cp{dim, N, A.data(), D.data(), dbias.data(), true, pool.host_view()};
      cuda::ScanParams g1{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool.dev_view()};
      cuda::ScanParams g2{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool2.dev_view()};
      std::vector<float> ref(B * ys, 0.0f);
      cpu::selective_state_update(ci, cp, ref.data(), ys, sp(b.state_indices));
      DeviceBuffer y1 = poisoned_bytes(B * ys * 4), y2 = poisoned_bytes(B * ys * 4);
      SSM_CUDA_CHECK(cuda::selective_state_update(gi, g1, y1.as<float>(), ys, dsi.as<int32_t>(), B, nullptr));
      SSM_CUDA_CHECK(cuda::selective_state_update_out(gi, g2, y2.data(), DType::F32, ys, dsi.as<int32_t>(), B, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      auto a1 = to_host<float>(y1, B * ys), a2 = to_host<float>(y2, B * ys);
      EXPECT_EQ(std::memcmp(a1.data(), a2.data(), a1.size() * 4), 0) << "differs from selective_state_update";
      std::vector<uint8_t> mask(B);
      for (int i = 0; i < B; ++i) mask[i] = b.state_indices[i] != 0;
      EXPECT_LT(rel_err(a2.data(), ys, ref.data(), ys, B, dim, &mask), sd == DType::F32 ? 1e-4 : 1e-2) << "vs cpu";
      EXPECT_TRUE(untouched(a2.data(), ys, B, dim, mask)) << "null rows written";
      std::vector<uint8_t> s1(pool.host.size()), s2(pool.host.size());
      pool.dev.download(s1.data(), s1.size());
      pool2.dev.download(s2.data(), s2.size());
      EXPECT_EQ(s1, s2) << "state update differs";
      // bf16 output: the rounding of the fp32 one (states restored first).
      pool2.dev.upload(initial.data(), initial.size());
      DeviceBuffer y3 = poisoned_bytes(B * ys * 2);
      SSM_CUDA_CHECK(cuda::selective_state_update_out(gi, g2, y3.data(), DType::BF16, ys, dsi.as<int32_t>(), B, false, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      auto a3 = to_host<uint16_t>(y3, B * ys);
      for (int i = 0; i < B; ++i)
        for (int64_t c = 0; c < dim && mask[i]; ++c) ASSERT_EQ(a3[i * ys + c], f32_to_bf16(a1[i * ys + c]));
    }
  }
}

/// dt_proj_scan_update == skinny dt_proj (fp32 delta) then selective_state_update_out, bit for bit (y and
/// states), and within tolerance of the CPU's dt_proj + selective_state_update.
TEST(CudaDecodeOps, DtProjScanEqualsSkinnyThenScanAndCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& s : mamba1_shapes()) {
    for (DType sd : {DType::F32, DType::BF16}) {
      for (int B : {1, 4, 13}) {
        SCOPED_TRACE(::testing::Message() << s.name << " B=" << B << " state " << dtype_name(sd));
        const int64_t dim = s.d_inner, R = s.dt_rank;
        const int N = s.d_state;
        ASSERT_EQ(cuda::skinny_gemm_splits(dim, R), 1);
        std::vector<int> lens(B, 1);
        const Batch b = make_batch(lens, B > 1 ? std::vector<int>{B / 2} : std::vector<int>{});
        const int64_t XD = R + 2 * N, us = dim + 3, zs = 2 * dim, ys = dim + 2;
        Operands op(rng, B, dim, R, XD);  // x = dt_low rows of xdbl (stride XD), w = dt_proj
        for (float& v : op.w) v = bf16_to_f32(f32_to_bf16(v * 20.0f));
        op.dw = to_device(to_bf16_bits(op.w));
        auto bc = rand_vec(rng, B * XD), u = rand_vec(rng, B * us), z = rand_vec(rng, B * zs, -3, 3);
        std::vector<float> A(dim * N), D = rand_vec(rng, dim), dbias = rand_vec(rng, dim, -1, 0.5f);
        for (int64_t c = 0; c < dim; ++c)
          for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (c % 97));
        StatePool pool(sd, dim * N, B + 1, rng, 0.5f), pool2(sd, dim * N, B + 1, rng, 0.5f);
        pool2.host = pool.host;
        pool2.dev.upload(pool.host.data(), pool.host.size());
        DeviceBuffer du = to_device(u), dbc = to_device(bc), dz = to_device(z), dA = to_device(A), dD = to_device(D),
                     dbi = to_device(dbias), dsi = to_device(b.state_indices), delta(B * dim * 4);
        // Reference chain on the GPU: skinny dt_proj -> delta fp32, then the state update.
        SSM_CUDA_CHECK(skinny({B, dim, R, op.dx.data(), XD, op.dw.data(), R, DType::BF16, delta.data(), dim, DType::F32},
                              nullptr, 0, true, nullptr));
        cuda::ScanInputs gi{{du.as<float>(), us}, {delta.as<float>(), dim}, {dbc.as<float>() + R, XD},
                            {dbc.as<float>() + R + N, XD}, {dz.as<float>() + dim, zs}};
        cuda::ScanParams g1{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool.dev_view()};
        cuda::ScanParams g2{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool2.dev_view()};
        for (DType yd : {DType::F32, DType::BF16}) {
          const size_t yb = B * ys * dtype_size(yd);
          DeviceBuffer y1 = poisoned_bytes(yb), y2 = poisoned_bytes(yb);
          SSM_CUDA_CHECK(cuda::selective_state_update_out(gi, g1, y1.data(), yd, ys, dsi.as<int32_t>(), B, true, nullptr));
          SSM_CUDA_CHECK(cuda::dt_proj_scan_update(op.dx.data(), XD, op.dw.data(), R, gi, g2, y2.data(), yd, ys,
                                                   dsi.as<int32_t>(), B, op.dw.data(), dim * R * 2, true, nullptr));
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(to_host<uint8_t>(y1, yb), to_host<uint8_t>(y2, yb)) << "y " << dtype_name(yd);
          std::vector<uint8_t> s1(pool.host.size()), s2(pool.host.size());
          pool.dev.download(s1.data(), s1.size());
          pool2.dev.download(s2.data(), s2.size());
          EXPECT_EQ(s1, s2) << "states";
          if (yd != DType::F32) continue;
          // CPU: delta = dt_low W^T (fp32), then the state update from the initial states.
          std::vector<float> dref = op.reference(dim);
          cpu::ScanInputs ci{{u.data(), us}, {dref.data(), dim}, {bc.data() + R, XD}, {bc.data() + R + N, XD},
                             {z.data() + dim, zs}};
          std::vector<uint8_t> init(pool.host);
          StateView hv{init.data(), sd, dim * N};
          cpu::ScanParams cp{dim, N, A.data(), D.data(), dbias.data(), true, hv};
          std::vector<float> ref(B * ys, 0.0f);
          cpu::selective_state_update(ci, cp, ref.data(), ys, sp(b.state_indices));
          auto got = to_host<float>(y2, B * ys);
          std::vector<uint8_t> mask(B);
          for (int i = 0; i < B; ++i) mask[i] = b.state_indices[i] != 0;
          EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, B, dim, &mask), sd == DType::F32 ? 1e-4 : 1e-2) << "vs cpu";
          EXPECT_TRUE(untouched(got.data(), ys, B, dim, mask)) << "null rows written";
          // Restore the initial states for the bf16-output pass.
          pool.dev.upload(pool.host.data(), pool.host.size());
          pool2.dev.upload(pool.host.data(), pool.host.size());
        }
      }
    }
  }
}

// ---- persistent decode kernel -------------------------------------------------------------------------------------

/// Random Mamba-1 decode layers (bf16 GEMM weights, fp32 rest, states in `sd`) on the device, and both ways of
/// running them: the runner's op-by-op decode chain and the persistent kernel.
struct PersistentCase {
  cuda::Mamba1DecodeShape sh;
  int layers, M, blocks;
  DType sd;
  struct LayerW {
    DeviceBuffer norm, in, cw, cb, x, dt, dtb, A, D, out;
  };
  std::vector<LayerW> w;
  std::vector<std::vector<uint8_t>> conv0, ssm0;  // initial states per layer
  std::vector<float> hidden0, out0;
  std::vector<int32_t> si;
  PersistentCase(std::mt19937& rng, cuda::Mamba1DecodeShape s, int nl, int m, DType state_dtype)
      : sh(s), layers(nl), M(m), blocks(m + 2), sd(state_dtype) {
    const int64_t H = s.H, I = s.I, N = s.N, R = s.R, W = s.W, XD = R + 2 * N;
    auto bf = [&](int64_t n, float a) { return to_device(to_bf16_bits(rand_vec(rng, n, -a, a))); };
    for (int l = 0; l < nl; ++l) {
      LayerW L;
      L.norm = to_device(rand_vec(rng, H, 0.8f, 1.2f));
      L.in = bf(2 * I * H, 1.0f / std::sqrt(static_cast<float>(H)));
      L.cw = to_device(rand_vec(rng, I * W, -0.4f, 0.4f)), L.cb = to_device(rand_vec(rng, I, -0.2f, 0.2f));
      L.x = bf(XD * I, 1.0f / std::sqrt(static_cast<float>(I)));
      L.dt = bf(I * R, 1.0f / std::sqrt(static_cast<float>(R)));
      L.dtb = to_device(rand_vec(rng, I, -4.0f, -1.0f));
      std::vector<float> A(I * N);
      for (int64_t c = 0; c < I; ++c)
        for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (c % 97));
      L.A = to_device(A), L.D = to_device(rand_vec(rng, I));
      L.out = bf(H * I, 0.5f / std::sqrt(static_cast<float>(I)));
      w.push_back(std::move(L));
      StatePool c(sd, (W - 1) * I, blocks, rng, 0.5f), q(sd, I * N, blocks, rng, 0.5f);
      conv0.push_back(c.host), ssm0.push_back(q.host);
    }
    hidden0 = rand_vec(rng, M * H), out0 = rand_vec(rng, M * H);
    for (int i = 0; i < M; ++i) si.push_back(M > 1 && i == 1 ? 0 : blocks - 1 - i);  // row 1 null
  }
  StateView view(const DeviceBuffer& b, int64_t elems) const { return StateView{b.data(), sd, elems}; }
  /// Per-run device state: states, hidden, out, scratch.
  struct Run {
    std::vector<DeviceBuffer> conv, ssm;
    DeviceBuffer hidden, out, normed, xz, xc, xc16, xdbl, xdbl16, delta, y16, si, ws;
  };
  Run fresh() const {
    const int64_t H = sh.H, I = sh.I, XD = sh.R + 2 * sh.N;
    Run r;
    for (int l = 0; l < layers; ++l) r.conv.push_back(to_device(conv0[l])), r.ssm.push_back(to_device(ssm0[l]));
    r.hidden = to_device(hidden0), r.out = to_device(out0);
    r.normed = DeviceBuffer(M * H * 2), r.xz = DeviceBuffer(M * 2 * I * 4), r.xc = DeviceBuffer(M * I * 4);
    r.xc16 = DeviceBuffer(M * I * 2), r.xdbl = DeviceBuffer(M * XD * 4), r.xdbl16 = DeviceBuffer(M * XD * 2);
    r.delta = DeviceBuffer(M * I * 4), r.y16 = DeviceBuffer(M * I * 2), r.si = to_device(si);
    for (DeviceBuffer* b : {&r.xz, &r.xc, &r.xc16, &r.xdbl, &r.xdbl16, &r.delta, &r.y16}) b->fill_bytes(0);
    r.ws = DeviceBuffer(cuda::mamba1_persistent_workspace(sh));
    r.ws.fill_bytes(0);
    return r;
  }
  cuda::Mamba1DecodeLayer layer(const Run& r, int l) const {
    const int64_t I = sh.I, N = sh.N, W = sh.W;
    const LayerW& L = w[l];
    return {L.norm.as<float>(), L.in.data(), L.cw.as<float>(), L.cb.as<float>(), L.x.data(), L.dt.data(),
            L.dtb.as<float>(), L.A.as<float>(), L.D.as<float>(), L.out.data(), view(r.conv[l], (W - 1) * I),
            view(r.ssm[l], I * N)};
  }
  /// The runner's unfused decode chain (cuda_mamba.cpp, bf16 weights), layer l.
  void chain(Run& r, int l, cudaStream_t s) const {
    const int64_t H = sh.H, I = sh.I, N = sh.N, R = sh.R, XD = R + 2 * N;
    const cuda::Mamba1DecodeLayer L = layer(r, l);
    SSM_CUDA_CHECK(cuda::add_rms_norm_rows(l == 0 ? nullptr : r.out.as<float>(), H, r.hidden.as<float>(), H, L.norm,
                                           sh.eps, nullptr, M, H, true, r.normed.data(), DType::BF16, H, true, s));
    auto gemm = [&](const void* x, int64_t xs, const void* wt, int64_t Nn, int64_t K, void* y, int64_t ys, void* y2) {
      SSM_CUDA_CHECK(skinny({M, Nn, K, x, xs, wt, K, DType::BF16, y, ys, DType::F32}, y2, ys, true, s));
    };
    gemm(r.normed.data(), H, L.in_proj, 2 * I, H, r.xz.data(), 2 * I, nullptr);
    cuda::ConvParams conv{I, static_cast<int>(sh.W), L.conv_weight, L.conv_bias, L.conv_states, true};
    SSM_CUDA_CHECK(cuda::conv1d_update_dual(r.xz.as<float>(), 2 * I, r.xc.as<float>(), I, r.xc16.data(), I, conv,
                                            r.si.as<int32_t>(), M, true, s));
    gemm(r.xc16.data(), I, L.x_proj, XD, I, r.xdbl.data(), XD, r.xdbl16.data());
    gemm(r.xdbl16.data(), XD, L.dt_proj, I, R, r.delta.data(), I, nullptr);
    cuda::ScanInputs in{{r.xc.as<float>(), I}, {r.delta.as<float>(), I}, {r.xdbl.as<float>() + R, XD},
                        {r.xdbl.as<float>() + R + N, XD}, {r.xz.as<float>() + I, 2 * I}};
    cuda::ScanParams sp{I, static_cast<int>(N), L.A, L.D, L.dt_bias, true, L.ssm_states};
    SSM_CUDA_CHECK(cuda::selective_state_update_out(in, sp, r.y16.data(), DType::BF16, I, r.si.as<int32_t>(), M, true, s));
    gemm(r.y16.data(), I, L.out_proj, H, I, r.out.data(), H, nullptr);
  }
  cuda::Mamba1DecodeBuffers buffers(Run& r) const {
    return {r.hidden.as<float>(), r.out.as<float>(), r.xz.as<float>(), r.xdbl.as<float>(), r.xdbl16.data(),
            r.y16.data(), r.si.as<int32_t>(), r.ws.data(), r.ws.bytes()};
  }
  /// Non-null rows of hidden and out, and every layer's states, as bytes.
  std::vector<uint8_t> result(const Run& r) const {
    std::vector<uint8_t> v;
    const auto h = to_host<float>(r.hidden, M * sh.H), o = to_host<float>(r.out, M * sh.H);
    for (int m = 0; m < M; ++m) {
      if (si[m] == 0) continue;
      const auto* a = reinterpret_cast<const uint8_t*>(h.data() + m * sh.H);
      const auto* b = reinterpret_cast<const uint8_t*>(o.data() + m * sh.H);
      v.insert(v.end(), a, a + sh.H * 4), v.insert(v.end(), b, b + sh.H * 4);
    }
    for (int l = 0; l < layers; ++l) {
      std::vector<uint8_t> c(conv0[l].size()), q(ssm0[l].size());
      r.conv[l].download(c.data(), c.size()), r.ssm[l].download(q.data(), q.size());
      v.insert(v.end(), c.begin(), c.end()), v.insert(v.end(), q.begin(), q.end());
    }
    return v;
  }
};

TEST(CudaPersistentDecode, EqualsOpChainBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::pair<const char*, cuda::Mamba1DecodeShape>> shapes = {
      {"mamba-130m", {768, 1536, 16, 48, 4, 1e-5f}}, {"odd", {520, 1048, 8, 24, 3, 1e-5f}},
      {"tiny-mamba", {256, 512, 16, 16, 4, 1e-5f}}};
  if (!quick()) shapes.push_back({"mamba-2.8b", {2560, 5120, 16, 160, 4, 1e-5f}});
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (const auto& [name, sh] : shapes) {
    for (DType sd : {DType::F32, DType::BF16}) {
      for (int M : {1, 3, 8}) {
        SCOPED_TRACE(::testing::Message() << name << " M=" << M << " state " << dtype_name(sd));
        ASSERT_TRUE(cuda::mamba1_persistent_supported(sh, M, sd));
        const int nl = 3;
        PersistentCase pc(rng, sh, nl, M, sd);
        auto ref = pc.fresh();
        for (int l = 0; l < nl; ++l) pc.chain(ref, l, s);
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto want = pc.result(ref);
        for (int prefetch : {0, 1, 2, 3, 4, 5}) {
          // Per layer (the runner's form).
          auto r = pc.fresh();
          for (int l = 0; l < nl; ++l)
            SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(sh, nullptr, pc.layer(r, l), 1, l == 0, M, pc.buffers(r),
                                                          {prefetch}, s));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          EXPECT_TRUE(pc.result(r) == want) << "per-layer, prefetch " << prefetch;
          // The whole stack in one launch.
          auto r2 = pc.fresh();
          std::vector<cuda::Mamba1DecodeLayer> ls;
          for (int l = 0; l < nl; ++l) ls.push_back(pc.layer(r2, l));
          DeviceBuffer dl(ls.size() * sizeof(cuda::Mamba1DecodeLayer));
          dl.upload(ls.data(), dl.bytes());
          SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(sh, static_cast<const cuda::Mamba1DecodeLayer*>(dl.data()),
                                                        ls[0], nl, true, M, pc.buffers(r2), {prefetch}, s));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          EXPECT_TRUE(pc.result(r2) == want) << "stack, prefetch " << prefetch;
        }
        // Inside a CUDA graph (captured once, replayed): same bits as the chain.
        auto r3 = pc.fresh();
        cudaGraph_t g = nullptr;
        cudaGraphExec_t e = nullptr;
        SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < nl; ++l)
          SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(sh, nullptr, pc.layer(r3, l), 1, l == 0, M, pc.buffers(r3), {}, s));
        SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        SSM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
        SSM_CUDA_CHECK(cudaGraphLaunch(e, s));
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_TRUE(pc.result(r3) == want) << "graph";
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);
      }
    }
  }
}

// ---- greedy sampling on the device --------------------------------------------------------------------------------

TEST(CudaSampling, GreedyPicksMatchCpuSampler) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t V = 50280, ld = V + 7;
  const int n = 7;
  auto logits = rand_vec(rng, n * ld, -8.0f, 8.0f);
  // Row 1: ties for the max (lowest id wins), row 2: masked tokens (-inf), row 3: coarse values (many ties in
  // the top-k), row 5: a NaN (error row), row 6: all -inf (error row).
  logits[1 * ld + 100] = logits[1 * ld + 40000] = logits[1 * ld + 7] = 20.0f;
  for (int i = 0; i < 1000; ++i) logits[2 * ld + i * 13] = -INFINITY;
  for (int64_t v = 0; v < V; ++v) logits[3 * ld + v] = std::round(logits[3 * ld + v]);
  logits[5 * ld + 123] = NAN;
  for (int64_t v = 0; v < V; ++v) logits[6 * ld + v] = -INFINITY;
  DeviceBuffer dl = to_device(logits), dout(n * sizeof(cuda::GreedyRow));
  for (int k : {0, 1, 5, 20}) {
    SSM_CUDA_CHECK(cuda::greedy_sample(dl.as<float>(), ld, n, V, k, dout.as<cuda::GreedyRow>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<cuda::GreedyRow>(dout, n);
    SamplingParams sp;
    sp.temperature = 0;
    sp.logprobs = k;
    RequestRng r(1);
    std::vector<float> scratch;
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE(::testing::Message() << "row " << i << " k " << k);
      std::span<const float> row(logits.data() + i * ld, V);
      if (i >= 5) {
        EXPECT_EQ(got[i].token, -1);
        continue;
      }
      const SampleResult want = sample_token(row, sp, {}, {}, {}, r, scratch);
      EXPECT_EQ(got[i].token, want.token);
      EXPECT_NEAR(got[i].logprob, want.logprob, 2e-6);
      ASSERT_EQ(static_cast<int>(want.top.size()), k);
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(got[i].top_ids[j], want.top[j].id) << "top " << j;
        EXPECT_NEAR(got[i].top_logprobs[j], want.top[j].logprob, 2e-6) << "top " << j;
      }
    }
  }
  EXPECT_EQ(cuda::greedy_sample(dl.as<float>(), V - 1, n, V, 0, dout.as<cuda::GreedyRow>(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::greedy_sample(dl.as<float>(), ld, n, V, 21, dout.as<cuda::GreedyRow>(), nullptr), cudaErrorInvalidValue);
}

// ---- batch invariance through the engine (the engine core's test, smaller sweep) --------------------------------

struct Outcome {
  std::vector<int> ids;
  std::vector<float> logprobs;
};

Outcome outcome_of(const RequestOutput& out) {
  Outcome o{out.outputs[0].token_ids, {}};
  for (const auto& step : out.outputs[0].logprobs) o.logprobs.push_back(step.at(0).logprob);
  return o;
}

void check_batch_invariance(const std::filesystem::path& dir, LoadFormat format) {
  cuda::register_cuda_backend();
  ::setenv("SSMSERVE_BATCH_INVARIANT", "1", 1);
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.ignore_eos = true;
  greedy.logprobs = 0;
  EngineConfig base;
  base.model = dir;
  base.load_format = format;
  base.device = "cuda";
  LLMEngine reference(base);
  std::map<std::pair<std::vector<int>, int>, Outcome> solo;
  auto alone = [&](const std::vector<int>& prompt, int max_tokens) {
    auto key = std::make_pair(prompt, max_tokens);
    if (auto it = solo.find(key); it != solo.end()) return it->second;
    Request r;
    r.request_id = "ref";
    r.prompt_token_ids = prompt;
    r.params = greedy;
    r.params.max_tokens = max_tokens;
    reference.add_request(r);
    Outcome o;
    while (reference.has_unfinished_requests())
      for (const auto& out : reference.step())
        if (out.finished) o = outcome_of(out);
    return solo[key] = o;
  };
  const int budgets[] = {7, 61, 512, 4096};
  const int max_seqs[] = {3, 16};
  std::mt19937 rng(20261129);
  int bitwise = 0, total = 0;
  for (int trial = 0; trial < (quick() ? 2 : 6); ++trial) {
    const int budget = budgets[trial % 4], seqs = max_seqs[(trial / 2) % 2];
    const int blocks = trial % 3 == 2 ? 3 : 0;
    const int n = 1 + static_cast<int>(rng() % 12);
    std::vector<std::vector<int>> prompts(n);
    std::vector<int> max_tokens(n), arrival(n);
    for (int i = 0; i < n; ++i) {
      const int len = 1 + static_cast<int>(rng() % (rng() % 4 == 0 ? 300 : 40));
      for (int t = 0; t < len; ++t) prompts[i].push_back(2 + static_cast<int>(rng() % 50000));
      max_tokens[i] = 1 + static_cast<int>(rng() % 10);
      arrival[i] = static_cast<int>(rng() % 6);
    }
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": budget " << budget << ", max_num_seqs " << seqs << ", "
                                    << n << " prompts");
    EngineConfig cfg = base;
    cfg.scheduler.max_num_batched_tokens = budget;
    cfg.scheduler.max_num_seqs = seqs;
    cfg.num_state_blocks = blocks;
    LLMEngine engine(cfg);
    std::map<std::string, Outcome> got;
    int added = 0;
    for (int step = 0; added < n || engine.has_unfinished_requests(); ++step) {
      for (int i = 0; i < n; ++i)
        if (arrival[i] == step || (step > 6 && i >= added && arrival[i] > step)) {
          Request r;
          r.request_id = std::to_string(i);
          r.prompt_token_ids = prompts[i];
          r.params = greedy;
          r.params.max_tokens = max_tokens[i];
          engine.add_request(r);
          ++added;
        }
      if (blocks > 0 && step % 5 == 4 && step < 20) engine.preempt_newest_request();
      for (const auto& out : engine.step())
        if (out.finished) got[out.request_id] = outcome_of(out);
      ASSERT_LT(step, 100000) << "no progress";
    }
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int i = 0; i < n; ++i) {
      const Outcome want = alone(prompts[i], max_tokens[i]);
      const Outcome& have = got[std::to_string(i)];
      ASSERT_EQ(have.ids, want.ids) << "request " << i << " (prompt length " << prompts[i].size() << ")";
      for (size_t s = 0; s < want.logprobs.size(); ++s) EXPECT_NEAR(have.logprobs[s], want.logprobs[s], 1e-4);
      bitwise += have.logprobs == want.logprobs;
      ++total;
    }
  }
  ::unsetenv("SSMSERVE_BATCH_INVARIANT");
  std::printf("batch invariance %s: %d of %d requests bit-identical to their solo run\n", dir.filename().c_str(),
              bitwise, total);
  ::testing::Test::RecordProperty("bitwise", bitwise);
  ::testing::Test::RecordProperty("requests", total);
}

TEST(CudaBatchInvariance, Mamba1RandomSchedulesEqualRunningAlone) {
  REQUIRE_GPU();
  const auto dir = testing::model_dir("tiny-mamba");
  SSM_SKIP_IF_NO_MODEL(dir);
  check_batch_invariance(dir, LoadFormat::Auto);
}

TEST(CudaBatchInvariance, Mamba2DummyRandomSchedulesEqualRunningAlone) {
  REQUIRE_GPU();
  check_batch_invariance(testing::source_dir() / "tests/cuda/configs/tiny-mamba2", LoadFormat::Dummy);
}

// ---- benchmarks (DISABLED_: scripts/gpu-check.sh runs them with --gtest_also_run_disabled_tests) ----------------

/// Mean milliseconds of `f` over `iters` runs after 3 warmups, by CUDA events on the legacy stream.
template <class F>
double time_ms(F&& f, int iters = 20, cudaStream_t s = nullptr) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  SSM_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  SSM_CUDA_CHECK(cudaEventRecord(b, s));
  SSM_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

TEST(CudaDecodeBench, DISABLED_RooflinesAndGemms) {
  REQUIRE_GPU();
  // 1. Device-to-device copy bandwidth (bytes read + written) and the bf16 GEMM rate (cuBLASLt, 8192^3).
  {
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer a(bytes), b(bytes);
    a.fill_bytes(1);
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr)); }, 10);
    std::printf("roofline copy_bandwidth_TBps %.3f\n", 2.0 * bytes / (ms * 1e-3) / 1e12);
  }
  cuda::GemmHandle gemm;
  gemm.set_skinny_max_m(0);  // cuBLASLt
  {
    const int64_t n = 8192;
    std::mt19937 rng(1);
    auto v = rand_vec(rng, n * n);
    DeviceBuffer x = to_device(to_bf16_bits(v)), w = to_device(to_bf16_bits(v)), y(n * n * 2);
    const double ms = time_ms([&] { gemm.run({n, n, n, x.data(), n, w.data(), n, DType::BF16, y.data(), n, DType::BF16}, nullptr); }, 10);
    std::printf("roofline bf16_gemm_TFLOPs %.1f\n", 2.0 * n * n * n / (ms * 1e-3) / 1e12);
  }
  // 2. Skinny GEMM vs cuBLASLt at the decode projections and LM heads, per M, with the weights rotated over
  //    copies of >= 256 MB in all (so every launch streams its weight from HBM, not from the 60 MB L2); launches
  //    back to back on one stream with PDL, as in the decode graphs. Then every tuning variant at M = 1 and 16.
  const std::vector<Shape> shapes = {
      {"m1-2.8b.in_proj", 10240, 2560}, {"m1-2.8b.x_proj", 192, 5120},  {"m1-2.8b.dt_proj", 5120, 160},
      {"m1-2.8b.out_proj", 2560, 5120}, {"m2-2.7b.in_proj", 10576, 2560}, {"m1-1.4b.in_proj", 8192, 2048},
      {"m1-1.4b.x_proj", 160, 4096},    {"m1-1.4b.out_proj", 2048, 4096}, {"m1-130m.in_proj", 3072, 768},
      {"m1-130m.x_proj", 80, 1536},     {"m1-130m.out_proj", 768, 1536},  {"lm_head.2560", 50280, 2560},
      {"lm_head.2048", 50280, 2048},    {"lm_head.768", 50280, 768}};
  cuda::Stream stream;
  std::mt19937 rng(2);
  for (const auto& sh : shapes) {
    const int64_t Mmax = 256;
    const size_t wbytes = static_cast<size_t>(sh.N * sh.K * 2);
    const int copies = static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / wbytes + 1, 2, 256));
    auto xv = rand_vec(rng, Mmax * sh.K), wv = rand_vec(rng, sh.N * sh.K, -0.05f, 0.05f);
    DeviceBuffer x = to_device(to_bf16_bits(xv)), y(Mmax * sh.N * 4);
    const auto wb = to_bf16_bits(wv);
    std::vector<DeviceBuffer> w;
    for (int i = 0; i < copies; ++i) w.push_back(to_device(wb));
    int next = 0;
    auto args = [&](int64_t M) {
      next = (next + 1) % copies;
      return cuda::GemmArgs{M, sh.N, sh.K, x.data(), sh.K, w[next].data(), sh.K, DType::BF16, y.data(), sh.N, DType::F32};
    };
    auto on_stream = [&](auto&& f) {
      return time_ms([&] { f(); }, 40, stream.get());
    };
    for (int64_t M : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      const double sk = on_stream([&] { SSM_CUDA_CHECK(skinny(args(M), nullptr, 0, true, stream.get())); });
      const double lt = on_stream([&] { gemm.run(args(M), stream.get()); });
      std::printf("gemm %-18s M=%-4ld skinny %8.2f us (%6.2f TB/s, %6.1f TFLOP/s)  cublaslt %8.2f us (%6.2f TB/s, %6.1f TFLOP/s)\n",
                  sh.name.c_str(), static_cast<long>(M), sk * 1e3, wbytes / (sk * 1e-3) / 1e12,
                  2.0 * M * sh.N * sh.K / (sk * 1e-3) / 1e12, lt * 1e3, wbytes / (lt * 1e-3) / 1e12,
                  2.0 * M * sh.N * sh.K / (lt * 1e-3) / 1e12);
    }
    for (int64_t M : {1, 16}) {
      double best = 1e30;
      std::string best_name;
      for (const auto& tu : tunings()) {
        cuda::SkinnyExtras ex;
        ex.tuning = &tu;
        const double ms = on_stream([&] { SSM_CUDA_CHECK(skinny(args(M), nullptr, 0, true, stream.get(), ex)); });
        char name[64];
        std::snprintf(name, sizeof(name), "u%d%s%s%+d/%d", tu.unroll, tu.pipelined ? "p" : "", tu.reg_cap ? "c" : "",
                      tu.split_shift, tu.cta_splits);
        std::printf("tune %-18s M=%-3ld %-8s splits %-3d %8.2f us (%6.2f TB/s)\n", sh.name.c_str(), static_cast<long>(M),
                    name, cuda::skinny_gemm_splits(sh.N, sh.K, tu.split_shift), ms * 1e3, wbytes / (ms * 1e-3) / 1e12);
        if (ms < best) best = ms, best_name = name;
      }
      std::printf("best %-18s M=%-3ld %-8s %8.2f us (%6.2f TB/s)\n", sh.name.c_str(), static_cast<long>(M),
                  best_name.c_str(), best * 1e3, wbytes / (best * 1e-3) / 1e12);
    }
  }
}

/// The mamba-2.8b decode layer stack (64 layers, random bf16 weights, fp32 states) as the runner enqueues it,
/// captured into one CUDA graph per variant and replayed: where a decode step's time goes inside a graph (GEMMs
/// alone, the unfused / fused kernel chains, with and without the L2 prefetch, per GEMM tuning).
TEST(CudaDecodeBench, DISABLED_LayerChain) {
  REQUIRE_GPU();
  {  // the decode roofline's bandwidth in the same run: device-to-device copy (bytes read + written)
    const size_t bytes = size_t{2} << 30;
    DeviceBuffer a(bytes), b(bytes);
    a.fill_bytes(1);
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, nullptr)); }, 10);
    std::printf("roofline copy_bandwidth_TBps %.3f\n", 2.0 * bytes / (ms * 1e-3) / 1e12);
  }
  const int64_t H = 2560, I = 5120, N = 16, R = 160, XD = R + 2 * N, W = 4;
  const int layers = 64;
  const float eps = 1e-5f;
  std::mt19937 rng(3);
  auto bf = [&](int64_t n, float a) { return to_bf16_bits(rand_vec(rng, n, -a, a)); };
  const auto w_in = bf(2 * I * H, 0.02f), w_x = bf(XD * I, 0.02f), w_dt = bf(I * R, 0.05f), w_out = bf(H * I, 0.02f);
  const auto normw = rand_vec(rng, H, 0.9f, 1.1f), convw = rand_vec(rng, I * W, -0.3f, 0.3f),
             convb = rand_vec(rng, I, -0.1f, 0.1f), dtb = rand_vec(rng, I, -4.0f, -2.0f), Dv = rand_vec(rng, I);
  std::vector<float> A(I * N);
  for (int64_t c = 0; c < I; ++c)
    for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1);
  struct LayerW {
    DeviceBuffer in, x, dt, out, norm, cw, cb, dtb, A, D, conv_state, ssm_state;
  };
  const int Mmax = 16;
  std::vector<LayerW> Ls(layers);
  for (auto& l : Ls) {
    l.in = to_device(w_in), l.x = to_device(w_x), l.dt = to_device(w_dt), l.out = to_device(w_out);
    l.norm = to_device(normw), l.cw = to_device(convw), l.cb = to_device(convb), l.dtb = to_device(dtb);
    l.A = to_device(A), l.D = to_device(Dv);
    l.conv_state = DeviceBuffer((Mmax + 1) * (W - 1) * I * 4), l.ssm_state = DeviceBuffer((Mmax + 1) * I * N * 4);
    l.conv_state.fill_bytes(0), l.ssm_state.fill_bytes(0);
  }
  std::vector<int32_t> si(Mmax);
  for (int i = 0; i < Mmax; ++i) si[i] = i + 1;
  DeviceBuffer dsi = to_device(si);
  DeviceBuffer hidden(Mmax * H * 4), out(Mmax * H * 4), normed(Mmax * H * 2), xz(Mmax * 2 * I * 4), xc(Mmax * I * 4),
      xc16(Mmax * I * 2), xdbl(Mmax * XD * 4), xdbl16(Mmax * XD * 2), delta(Mmax * I * 4), y16(Mmax * I * 2);
  hidden.fill_bytes(0), out.fill_bytes(0);
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const cuda::SkinnyTuning* tuning = nullptr;
  auto gemm = [&](int64_t M, const void* x, int64_t xs, const DeviceBuffer& w, int64_t Nn, int64_t K, void* y,
                  int64_t ys, void* y2 = nullptr, const cuda::SkinnyConvEpilogue* ce = nullptr) {
    cuda::SkinnyExtras ex;
    ex.tuning = tuning, ex.conv = ce;
    SSM_CUDA_CHECK(skinny({M, Nn, K, x, xs, w.data(), K, DType::BF16, y, ys, DType::F32}, y2, ys, true, s, ex));
  };
  enum Part { kNorm = 1, kGemms = 2, kSmall = 4, kFused = 8, kPrefetch = 16, kInOnly = 32, kOutOnly = 64 };
  auto layer = [&](int l, int64_t M, int parts) {
    const LayerW& L = Ls[l];
    const StateView cs{L.conv_state.data(), DType::F32, (W - 1) * I}, ss{L.ssm_state.data(), DType::F32, I * N};
    cuda::ConvParams conv{I, static_cast<int>(W), L.cw.as<float>(), L.cb.as<float>(), cs, true};
    cuda::ScanParams sp{I, static_cast<int>(N), L.A.as<float>(), L.D.as<float>(), L.dtb.as<float>(), true, ss};
    if (parts & kInOnly) return gemm(M, normed.data(), H, L.in, 2 * I, H, xz.data(), 2 * I);
    if (parts & kOutOnly) return gemm(M, y16.data(), I, L.out, H, I, out.data(), H);
    if (parts & kNorm)
      SSM_CUDA_CHECK(cuda::add_rms_norm_rows(l == 0 ? nullptr : out.as<float>(), H, hidden.as<float>(), H,
                                             L.norm.as<float>(), eps, nullptr, M, H, true, normed.data(), DType::BF16,
                                             H, true, s));
    cuda::ScanInputs in{{xc.as<float>(), I}, {delta.as<float>(), I}, {xdbl.as<float>() + R, XD},
                        {xdbl.as<float>() + R + N, XD}, {xz.as<float>() + I, 2 * I}};
    if (parts & kFused) {
      const cuda::SkinnyConvEpilogue ce{conv, 0, dsi.as<int32_t>(), xc.as<float>(), I, xc16.data(), I};
      gemm(M, normed.data(), H, L.in, 2 * I, H, xz.data(), 2 * I, nullptr, &ce);
      gemm(M, xc16.data(), I, L.x, XD, I, xdbl.data(), XD, xdbl16.data());
      SSM_CUDA_CHECK(cuda::dt_proj_scan_update(xdbl16.data(), XD, L.dt.data(), R, in, sp, y16.data(), DType::BF16, I,
                                               dsi.as<int32_t>(), static_cast<int>(M),
                                               (parts & kPrefetch) ? L.out.data() : nullptr,
                                               (parts & kPrefetch) ? L.out.bytes() : 0, true, s));
      gemm(M, y16.data(), I, L.out, H, I, out.data(), H);
      return;
    }
    if (parts & kGemms) gemm(M, normed.data(), H, L.in, 2 * I, H, xz.data(), 2 * I);
    if (parts & kSmall)
      SSM_CUDA_CHECK(cuda::conv1d_update_dual(xz.as<float>(), 2 * I, xc.as<float>(), I, xc16.data(), I, conv,
                                              dsi.as<int32_t>(), static_cast<int>(M), true, s));
    if (parts & kGemms) {
      gemm(M, xc16.data(), I, L.x, XD, I, xdbl.data(), XD, xdbl16.data());
      gemm(M, xdbl16.data(), XD, L.dt, I, R, delta.data(), I);
    }
    if (parts & kSmall)
      SSM_CUDA_CHECK(cuda::selective_state_update_out(in, sp, y16.data(), DType::BF16, I, dsi.as<int32_t>(),
                                                      static_cast<int>(M), true, s));
    if (parts & kGemms) gemm(M, y16.data(), I, L.out, H, I, out.data(), H);
  };
  auto time_graph = [&](const char* name, int64_t M, int parts) {
    for (int l = 0; l < layers; ++l) layer(l, M, parts);  // eager once (allocations, module loads)
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < layers; ++l) layer(l, M, parts);
    SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    SSM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaGraphLaunch(e, s)); }, 10, s);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    std::printf("chain %-26s M=%-3ld %8.1f us/step %6.2f us/layer\n", name, static_cast<long>(M), ms * 1e3,
                ms * 1e3 / layers);
  };
  const cuda::SkinnyTuning old_default{4, false, true, 0, 16}, nocap16{4, false, false, 0, 16},
      pipe16{2, true, false, 0, 16}, pipe4{2, true, false, 0, 4}, nocap4{4, false, false, 0, 4};
  const std::pair<const char*, const cuda::SkinnyTuning*> tus[] = {
      {"default", nullptr}, {"old(u4c/16)", &old_default}, {"u4/16", &nocap16}, {"u2p/16", &pipe16},
      {"u2p/4", &pipe4}, {"u4/4", &nocap4}};
  const bool chain_quick = std::getenv("SSMSERVE_CHAIN_QUICK") != nullptr;  // default tuning, M = 1 only
  for (int64_t M : {1, 4}) {
    for (const auto& [tname, tu] : tus) {
      if (chain_quick && (M > 1 || tu)) break;
      tuning = tu;
      const std::string t(tname);
      time_graph((t + " in_proj only").c_str(), M, kInOnly);
      time_graph((t + " out_proj only").c_str(), M, kOutOnly);
      time_graph((t + " gemms").c_str(), M, kGemms);
      time_graph((t + " unfused").c_str(), M, kNorm | kGemms | kSmall);
      time_graph((t + " fused").c_str(), M, kNorm | kFused);
      time_graph((t + " fused+prefetch").c_str(), M, kNorm | kFused | kPrefetch);
      if (M > 1) break;
    }
  }
  tuning = nullptr;
  time_graph("default norm only", 1, kNorm);
  time_graph("default small only", 1, kSmall);
  // The persistent kernel (persistent_decode.h): one launch per layer, or the whole stack in one launch.
  const cuda::Mamba1DecodeShape psh{H, I, N, R, W, eps};
  DeviceBuffer pws(cuda::mamba1_persistent_workspace(psh));
  pws.fill_bytes(0);
  std::vector<cuda::Mamba1DecodeLayer> pls;
  for (int l = 0; l < layers; ++l) {
    const LayerW& L = Ls[l];
    pls.push_back({L.norm.as<float>(), L.in.data(), L.cw.as<float>(), L.cb.as<float>(), L.x.data(), L.dt.data(),
                   L.dtb.as<float>(), L.A.as<float>(), L.D.as<float>(), L.out.data(),
                   StateView{L.conv_state.data(), DType::F32, (W - 1) * I}, StateView{L.ssm_state.data(), DType::F32, I * N}});
  }
  DeviceBuffer dls(pls.size() * sizeof(cuda::Mamba1DecodeLayer));
  dls.upload(pls.data(), dls.bytes());
  const cuda::Mamba1DecodeBuffers pb{hidden.as<float>(), out.as<float>(), xz.as<float>(), xdbl.as<float>(),
                                     xdbl16.data(), y16.data(), dsi.as<int32_t>(), pws.data(), pws.bytes()};
  auto time_persistent = [&](const char* name, int64_t M, bool stack, int prefetch) {
    auto enqueue = [&] {
      if (stack) {
        SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(psh, static_cast<const cuda::Mamba1DecodeLayer*>(dls.data()),
                                                      pls[0], layers, true, static_cast<int>(M), pb, {prefetch}, s));
      } else {
        for (int l = 0; l < layers; ++l)
          SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(psh, nullptr, pls[l], 1, l == 0, static_cast<int>(M), pb,
                                                        {prefetch}, s));
      }
    };
    enqueue();
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g = nullptr;
    cudaGraphExec_t e = nullptr;
    SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    enqueue();
    SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    SSM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    const double ms = time_ms([&] { SSM_CUDA_CHECK(cudaGraphLaunch(e, s)); }, 10, s);
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    std::printf("chain %-26s M=%-3ld %8.1f us/step %6.2f us/layer\n", name, static_cast<long>(M), ms * 1e3,
                ms * 1e3 / layers);
  };
  // Block 0's phase boundaries (clock64, shown at 1.98 GHz), the stack form, M = 1, mean over layers 1..63.
  for (int pf : {0, 1, 4, 5}) {
    DeviceBuffer tim(layers * 9 * sizeof(long long));
    cuda::Mamba1PersistentOptions o{pf};
    o.timing = static_cast<long long*>(tim.data());
    for (int rep = 0; rep < 3; ++rep)
      SSM_CUDA_CHECK(cuda::mamba1_persistent_decode(psh, static_cast<const cuda::Mamba1DecodeLayer*>(dls.data()),
                                                    pls[0], layers, true, 1, pb, o, s));
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto t = to_host<long long>(tim, layers * 9);
    const char* names[8] = {"norm", "in_proj", "barrier1", "conv+x_proj", "barrier2", "dt+scan", "barrier3", "out_proj"};
    std::printf("phases pf%d (us, block 0):", pf);
    for (int k = 0; k < 8; ++k) {
      double sum = 0;
      for (int l = 1; l < layers; ++l) sum += static_cast<double>(t[l * 9 + k + 1] - t[l * 9 + k]);
      std::printf(" %s %.2f", names[k], sum / (layers - 1) / 1980.0);
    }
    double gap = 0;
    for (int l = 1; l < layers; ++l) gap += static_cast<double>(t[l * 9] - t[(l - 1) * 9 + 8]);
    std::printf(" layer-barrier %.2f\n", gap / (layers - 1) / 1980.0);
  }
  for (int64_t M : {1, 4}) {
    for (int pf : {0, 1, 4}) time_persistent(("persistent/layer pf" + std::to_string(pf)).c_str(), M, false, pf);
    for (int pf : {0, 1, 3, 4, 5}) time_persistent(("persistent/stack pf" + std::to_string(pf)).c_str(), M, true, pf);
  }
}

}  // namespace
}  // namespace ssmserve
