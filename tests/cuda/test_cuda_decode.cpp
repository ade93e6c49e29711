// GPU decode path (issue 7, decode latency and batch invariance): the batch-invariant skinny GEMM and the fused
// decode kernels against their CPU references (and, bit for bit, against the kernels they replace); the skinny
// GEMM's rows bit-identical for every batch size and offset; the engine's batch-invariance test (smaller sweep) on
// the GPU for Mamba-1 and Mamba-2 dummy shapes in batch-invariant mode. DISABLED_ benchmarks (run by
// scripts/gpu-check.sh): skinny GEMM vs cuBLASLt per M at mamba-2.8b shapes, copy bandwidth, bf16 GEMM rate.
// Skips without a GPU.
#include <gtest/gtest.h>

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
cudaError_t skinny(const cuda::GemmArgs& g, void* y2, int64_t y2s, bool pdl, cudaStream_t s) {
  size_t cb = 0;
  const size_t wb = cuda::skinny_gemm_workspace(g.M, g.N, g.K, &cb);
  static DeviceBuffer ws, counters;
  if (wb > ws.bytes()) ws = DeviceBuffer(wb);
  if (cb > counters.bytes()) {
    counters = DeviceBuffer(cb);
    counters.fill_bytes(0);
  }
  return cuda::skinny_gemm(g, y2, y2s, pdl, s, ws.data(), ws.bytes(), counters.as<unsigned>());
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
  for (int64_t H : {256, 768, 2560, 1000}) {
    const int64_t T = 9, xs = H + 4, rs = H + 2, os = H + 1;
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
    for (bool nbg : {false, true}) {
      const int64_t T = 5, ys = D + 3, zs = D + 7, group = D / 2;
      auto y = rand_vec(rng, T * ys), z = rand_vec(rng, T * zs, -3, 3), w = rand_vec(rng, D, 0.5f, 1.5f);
      DeviceBuffer dy = to_device(y), dz = to_device(z), dw = to_device(w);
      DeviceBuffer o1 = poisoned_bytes(T * D * 4), o2 = poisoned_bytes(T * D * 4);
      SSM_CUDA_CHECK(cuda::gated_rms_norm(dy.as<float>(), ys, dz.as<float>(), zs, dw.as<float>(), 1e-5f, T, D, group, nbg,
                                          o1.data(), DType::F32, D, nullptr));
      SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(dy.as<float>(), ys, dz.as<float>(), zs, dw.as<float>(), 1e-5f, T, D, group,
                                              nbg, o2.data(), DType::F32, D, true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(to_host<float>(o1, T * D), to_host<float>(o2, T * D)) << "D=" << D << " norm_before_gate " << nbg;
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
double time_ms(F&& f, int iters = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  SSM_CUDA_CHECK(cudaEventRecord(a, nullptr));
  for (int i = 0; i < iters; ++i) f();
  SSM_CUDA_CHECK(cudaEventRecord(b, nullptr));
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
  // 2. Skinny GEMM vs cuBLASLt at the mamba-2.8b / mamba2-2.7b projections and the LM head, per M.
  const std::vector<Shape> shapes = {{"m1-2.8b.in_proj", 10240, 2560}, {"m1-2.8b.x_proj", 192, 5120},
                                     {"m1-2.8b.dt_proj", 5120, 160},   {"m1-2.8b.out_proj", 2560, 5120},
                                     {"m2-2.7b.in_proj", 10576, 2560}, {"lm_head", 50280, 2560}};
  std::mt19937 rng(2);
  for (const auto& sh : shapes) {
    const int64_t Mmax = 256;
    auto xv = rand_vec(rng, Mmax * sh.K), wv = rand_vec(rng, sh.N * sh.K, -0.05f, 0.05f);
    DeviceBuffer x = to_device(to_bf16_bits(xv)), w = to_device(to_bf16_bits(wv)), y(Mmax * sh.N * 4);
    for (int64_t M : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      const cuda::GemmArgs g{M, sh.N, sh.K, x.data(), sh.K, w.data(), sh.K, DType::BF16, y.data(), sh.N, DType::F32};
      const double sk = time_ms([&] { SSM_CUDA_CHECK(skinny(g, nullptr, 0, true, nullptr)); });
      const double lt = time_ms([&] { gemm.run(g, nullptr); });
      const double wbytes = 2.0 * sh.N * sh.K;
      std::printf("gemm %-18s M=%-4ld skinny %8.2f us (%6.2f TB/s, %6.1f TFLOP/s)  cublaslt %8.2f us (%6.2f TB/s, %6.1f TFLOP/s)\n",
                  sh.name.c_str(), static_cast<long>(M), sk * 1e3, wbytes / (sk * 1e-3) / 1e12,
                  2.0 * M * sh.N * sh.K / (sk * 1e-3) / 1e12, lt * 1e3, wbytes / (lt * 1e-3) / 1e12,
                  2.0 * M * sh.N * sh.K / (lt * 1e-3) / 1e12);
    }
  }
}

}  // namespace
}  // namespace ssmserve
