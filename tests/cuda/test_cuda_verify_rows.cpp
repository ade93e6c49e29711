// GPU op harness of speculative decoding's verify rows (kernels/cuda/device_decode_rows.h, vllm-ssm-design.md §6.1):
// every recurrent decode kernel (conv window update, Mamba-1 scan update, SSD update, lightning decode, gated-delta
// decode) run over rows of 1..k+1 tokens with one state column per token, against the CPU kernels on the same
// DecodeRows (kernels/decode_rows.h): every token's output and every column's state. Random row lengths, shuffled
// block ids, a null row, fp32 and bf16 states; fresh seed per run (printed on failure), poisoned outputs. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/lightning.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cpu/ssd.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/ssd.h"
#include "kernels/decode_rows.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// R decode rows of 1..k+1 tokens (at least one of k+1), each token with its own state block (ids shuffled over
/// the pool), plus optionally a null row of one token (column 0 = block 0).
struct VerifyRows {
  std::vector<int32_t> qsl{0};
  std::vector<int32_t> blocks;  ///< [R, cols]
  std::vector<int32_t> used;    ///< every block a token writes
  int cols = 1, num_blocks = 1;
  DeviceBuffer dqsl, dblocks;

  VerifyRows(std::mt19937& rng, int R, int k, int null_row) {
    cols = k + 1;
    std::vector<int> len(R);
    for (int r = 0; r < R; ++r) len[r] = r == null_row ? 1 : std::uniform_int_distribution<int>(1, k + 1)(rng);
    if (R > 0 && null_row != 0) len[0] = k + 1;
    int total = 0;
    for (int r = 0; r < R; ++r) total += r == null_row ? 0 : len[r];
    num_blocks = total + 1;
    std::vector<int32_t> ids(total);
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), rng);
    blocks.assign(static_cast<size_t>(R) * cols, 0);
    size_t next = 0;
    for (int r = 0; r < R; ++r) {
      qsl.push_back(qsl.back() + len[r]);
      if (r == null_row) continue;
      for (int j = 0; j < len[r]; ++j) blocks[static_cast<size_t>(r) * cols + j] = ids[next++], used.push_back(blocks[r * cols + j]);
    }
    dqsl = to_device(qsl), dblocks = to_device(blocks);
  }
  int rows() const { return static_cast<int>(qsl.size()) - 1; }
  int64_t T() const { return qsl.back(); }
  DecodeRows host() const { return DecodeRows(std::span<const int32_t>(blocks), cols, std::span<const int32_t>(qsl)); }
  cuda::DeviceDecodeRows dev() const { return {dblocks.as<int32_t>(), cols, dqsl.as<int32_t>()}; }
  /// 1 for the tokens of non-null rows.
  std::vector<uint8_t> token_mask() const {
    std::vector<uint8_t> m(static_cast<size_t>(T()));
    for (int r = 0; r < rows(); ++r)
      for (int32_t t = qsl[r]; t < qsl[r + 1]; ++t) m[t] = blocks[static_cast<size_t>(r) * cols] != 0;
    return m;
  }
};

struct Case {
  int R, k, null_row;
};
std::vector<Case> cases() { return {{1, 4, -1}, {5, 4, 2}, {3, 1, -1}, {8, 8, 5}, {20, 2, 7}}; }

double state_tol(DType t) { return t == DType::F32 ? 1e-5 : 1e-2; }

TEST(CudaVerifyRows, ConvUpdateMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : cases())
    for (DType sd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << "rows " << c.R << " k " << c.k << " " << dtype_name(sd));
      VerifyRows vr(rng, c.R, c.k, c.null_row);
      const int64_t dim = 200, T = vr.T(), xs = dim + 4, os = dim + 3;
      const int width = 4;
      auto x = rand_vec(rng, T * xs), w = rand_vec(rng, dim * width), bias = rand_vec(rng, dim, -0.1f, 0.1f);
      StatePool pool(sd, (width - 1) * dim, vr.num_blocks, rng);
      DeviceBuffer dx = to_device(x), dw = to_device(w), dbias = to_device(bias);
      cpu::ConvParams cp{dim, width, w.data(), bias.data(), pool.host_view(), true};
      cuda::ConvParams gp{dim, width, dw.as<float>(), dbias.as<float>(), pool.dev_view(), true};
      std::vector<float> ref(T * os, 0.0f);
      cpu::causal_conv1d_update(x.data(), xs, ref.data(), os, cp, vr.host());
      DeviceBuffer o = poisoned(T * os), o16 = poisoned(T * os);
      SSM_CUDA_CHECK(cuda::conv1d_update_dual(dx.as<float>(), xs, o.as<float>(), os, o16.data(), os, gp, vr.dev(),
                                              vr.rows(), true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<float>(o, T * os);
      const auto mask = vr.token_mask();
      EXPECT_LT(rel_err(got.data(), os, ref.data(), os, T, dim, &mask), 1e-6) << "outputs";
      EXPECT_TRUE(untouched(got.data(), os, T, dim, mask)) << "null row written";
      EXPECT_LT(pool.rel_err_blocks(vr.used), 1e-7) << "windows";
      EXPECT_TRUE(pool.null_block_intact());
    }
}

TEST(CudaVerifyRows, ScanUpdateMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : cases())
    for (DType sd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << "rows " << c.R << " k " << c.k << " " << dtype_name(sd));
      VerifyRows vr(rng, c.R, c.k, c.null_row);
      const int64_t dim = 384, T = vr.T();
      const int N = 16;
      const int64_t us = dim + 3, ds = dim + 5, bcs = 2 * N + 2, zs = dim + 1, ys = dim + 2;
      auto u = rand_vec(rng, T * us), delta = rand_vec(rng, T * ds, -4.0f, 1.0f), bc = rand_vec(rng, T * bcs),
           z = rand_vec(rng, T * zs, -3, 3);
      std::vector<float> A(dim * N), D = rand_vec(rng, dim), dbias = rand_vec(rng, dim, -1, 0.5f);
      for (int64_t ch = 0; ch < dim; ++ch)
        for (int n = 0; n < N; ++n) A[ch * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (ch % 97));
      StatePool pool(sd, dim * N, vr.num_blocks, rng, 0.5f);
      DeviceBuffer du = to_device(u), dd = to_device(delta), dbc = to_device(bc), dz = to_device(z), dA = to_device(A),
                   dD = to_device(D), dbi = to_device(dbias);
      cpu::ScanInputs ci{{u.data(), us}, {delta.data(), ds}, {bc.data(), bcs}, {bc.data() + N, bcs}, {z.data(), zs}};
      cuda::ScanInputs gi{{du.as<float>(), us}, {dd.as<float>(), ds}, {dbc.as<float>(), bcs}, {dbc.as<float>() + N, bcs},
                          {dz.as<float>(), zs}};
      cpu::ScanParams cp{dim, N, A.data(), D.data(), dbias.data(), true, pool.host_view()};
      cuda::ScanParams gp{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool.dev_view()};
      std::vector<float> ref(T * ys, 0.0f);
      cpu::selective_state_update(ci, cp, ref.data(), ys, vr.host());
      DeviceBuffer y = poisoned(T * ys);
      SSM_CUDA_CHECK(cuda::selective_state_update_out(gi, gp, y.data(), DType::F32, ys, vr.dev(), vr.rows(), true, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<float>(y, T * ys);
      const auto mask = vr.token_mask();
      EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, T, dim, &mask), sd == DType::F32 ? 1e-4 : 1e-2) << "outputs";
      EXPECT_TRUE(untouched(got.data(), ys, T, dim, mask)) << "null row written";
      EXPECT_LT(pool.rel_err_blocks(vr.used), state_tol(sd) * 10) << "states";
      EXPECT_TRUE(pool.null_block_intact());
    }
}

TEST(CudaVerifyRows, SsdUpdateMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int H, P, G, N;
  };
  for (const Shape& s : {Shape{8, 64, 1, 64}, Shape{4, 32, 2, 128}})
    for (const Case& c : cases())
      for (DType sd : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << "H " << s.H << " N " << s.N << " rows " << c.R << " k " << c.k << " "
                                        << dtype_name(sd));
        VerifyRows vr(rng, c.R, c.k, c.null_row);
        const int64_t T = vr.T(), HP = int64_t{s.H} * s.P, GN = int64_t{s.G} * s.N;
        const int64_t xs = HP + 3, dts = s.H + 1, bcs = 2 * GN + 4, ys = HP + 2;
        auto x = rand_vec(rng, T * xs), dt = rand_vec(rng, T * dts, -3.0f, 1.0f), bc = rand_vec(rng, T * bcs);
        auto A = rand_vec(rng, s.H, -2.0f, -0.1f), D = rand_vec(rng, s.H), dtb = rand_vec(rng, s.H, -1.0f, 0.5f);
        StatePool pool(sd, HP * s.N, vr.num_blocks, rng, 0.5f);
        DeviceBuffer dx = to_device(x), ddt = to_device(dt), dbc = to_device(bc), dA = to_device(A), dD = to_device(D),
                     ddtb = to_device(dtb);
        cpu::SsdInputs ci{{x.data(), xs}, {dt.data(), dts}, {bc.data(), bcs}, {bc.data() + GN, bcs}};
        cuda::SsdInputs gi{{dx.as<float>(), xs}, {ddt.as<float>(), dts}, {dbc.as<float>(), bcs}, {dbc.as<float>() + GN, bcs}, {}, {}, {}};
        cpu::SsdParams cp{s.H, s.P, s.G, s.N, A.data(), D.data(), dtb.data(), 0.0f, 0.5f, pool.host_view()};
        cuda::SsdParams gp{s.H, s.P, s.G, s.N, dA.as<float>(), dD.as<float>(), ddtb.as<float>(), 0.0f, 0.5f, pool.dev_view()};
        std::vector<float> ref(T * ys, 0.0f);
        cpu::ssd_state_update(ci, cp, ref.data(), ys, vr.host());
        DeviceBuffer y = poisoned(T * ys);
        SSM_CUDA_CHECK(cuda::ssd_state_update(gi, gp, y.as<float>(), ys, vr.dev(), vr.rows(), nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(y, T * ys);
        const auto mask = vr.token_mask();
        EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, T, HP, &mask), sd == DType::F32 ? 1e-4 : 1e-2) << "outputs";
        EXPECT_TRUE(untouched(got.data(), ys, T, HP, mask)) << "null row written";
        EXPECT_LT(pool.rel_err_blocks(vr.used), state_tol(sd) * 10) << "states";
        EXPECT_TRUE(pool.null_block_intact());
      }
}

TEST(CudaVerifyRows, LightningDecodeMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int D : {64, 128})
    for (const Case& c : cases())
      for (DType sd : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << "D " << D << " rows " << c.R << " k " << c.k << " " << dtype_name(sd));
        VerifyRows vr(rng, c.R, c.k, c.null_row);
        const int H = 4;
        const int64_t T = vr.T(), qs = 3LL * H * D + 4, os = int64_t{H} * D + 4;
        std::vector<float> slopes = {0.95f, 0.3f, 0.05f, 0.001f};
        StatePool pool(sd, int64_t{H} * D * D, vr.num_blocks, rng, 0.5f);
        auto qkv = rand_vec(rng, T * qs);
        DeviceBuffer dqkv = to_device(qkv), dsl = to_device(slopes), dout = poisoned(T * os);
        cpu::LightningParams hp{H, D, 256, slopes.data(), pool.host_view()};
        cuda::LightningDevParams gp{H, D, 256, dsl.as<float>(), pool.dev_view()};
        std::vector<float> ref(T * os, 0.0f);
        cpu::lightning_decode(qkv.data(), qs, ref.data(), os, hp, vr.host());
        SSM_CUDA_CHECK(cuda::lightning_decode(dqkv.as<float>(), qs, dout.as<float>(), os, gp, vr.dev(), vr.rows(), nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dout, T * os);
        const auto mask = vr.token_mask();
        EXPECT_LT(rel_err(got.data(), os, ref.data(), os, T, int64_t{H} * D, &mask), sd == DType::F32 ? 1e-5 : 1e-2) << "outputs";
        for (int64_t t = 0; t < T; ++t)
          if (!mask[t]) { ASSERT_EQ(got[t * os], 0.0f) << "null row output"; }
        EXPECT_LT(pool.rel_err_blocks(vr.used), state_tol(sd)) << "states";
        EXPECT_TRUE(pool.null_block_intact());
      }
}

TEST(CudaVerifyRows, GatedDeltaDecodeMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Shape {
    int Hk, Hv, Dk, Dv;
  };
  for (const Shape& s : {Shape{4, 8, 32, 32}, Shape{2, 4, 128, 128}})
    for (const Case& c : cases())
      for (DType sd : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << "Dk " << s.Dk << " rows " << c.R << " k " << c.k << " " << dtype_name(sd));
        VerifyRows vr(rng, c.R, c.k, c.null_row);
        const int64_t T = vr.T(), qks = int64_t{s.Hk} * s.Dk + 4, vs = int64_t{s.Hv} * s.Dv + 4, gs = s.Hv + 3;
        const int64_t os = int64_t{s.Hv} * s.Dv + 4;
        auto q = rand_vec(rng, T * qks, -0.2f, 0.2f), k = rand_vec(rng, T * qks, -0.2f, 0.2f), v = rand_vec(rng, T * vs);
        auto g = rand_vec(rng, T * gs, -2.0f, -0.01f), beta = rand_vec(rng, T * gs, 0.0f, 1.0f);
        StatePool pool(sd, int64_t{s.Hv} * s.Dk * s.Dv, vr.num_blocks, rng, 0.5f);
        DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dg = to_device(g), db = to_device(beta);
        cpu::GatedDeltaInputs hi{q.data(), qks, k.data(), qks, v.data(), vs, g.data(), gs, beta.data(), gs};
        cuda::GatedDeltaInputs gi{dq.as<float>(), qks, dk.as<float>(), qks, dv.as<float>(), vs, dg.as<float>(), gs,
                                  db.as<float>(), gs};
        cpu::GatedDeltaParams hp{s.Hk, s.Hv, s.Dk, s.Dv, 64, pool.host_view()};
        cuda::GatedDeltaParams gp{s.Hk, s.Hv, s.Dk, s.Dv, 64, pool.dev_view()};
        std::vector<float> ref(T * os, 0.0f);
        cpu::gated_delta_decode(hi, hp, ref.data(), os, vr.host());
        DeviceBuffer dout = poisoned(T * os);
        SSM_CUDA_CHECK(cuda::gated_delta_decode(gi, gp, dout.as<float>(), os, vr.dev(), vr.rows(), nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dout, T * os);
        const auto mask = vr.token_mask();
        EXPECT_LT(rel_err(got.data(), os, ref.data(), os, T, int64_t{s.Hv} * s.Dv, &mask), sd == DType::F32 ? 1e-5 : 1e-2)
            << "outputs";
        for (int64_t t = 0; t < T; ++t)
          if (!mask[t]) { ASSERT_EQ(got[t * os], 0.0f) << "null row output"; }
        EXPECT_LT(pool.rel_err_blocks(vr.used), state_tol(sd)) << "states";
        EXPECT_TRUE(pool.null_block_intact());
      }
}

}  // namespace
}  // namespace ssmserve
