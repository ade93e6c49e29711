// GPU op harness: every CUDA op against its CPU kernel (the reference) on named model shapes (mamba-130m,
// mamba-2.8b, mamba2-2.7b, Codestral-7B heads, tiny-mamba2) and the edge-case schedules of cuda_test_util.h, with
// fresh random inputs per run and poisoned outputs. Here GEMM, embedding, norms (scaled_residual2 bit-identical to
// its two launches), causal conv1d and every op's bad arguments; the scans (selective scan, SSD) are in
// test_cuda_scan_ops.cpp. Skips without a GPU. SSMSERVE_CUDA_TEST_QUICK=1 keeps the small shapes only (the
// compute-sanitizer runs of scripts/gpu-check.sh).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_rms_norm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/ssd.h"
#include "device/cuda_check.h"
#include "model/weight.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;


TEST(CudaDevice, ReportsDeviceAndErrors) {
  REQUIRE_GPU();
  std::printf("device: %s\n", cuda::device_description(0).c_str());
  EXPECT_THROW(DeviceBuffer(size_t{1} << 62), Error);  // allocation failure is an ssmserve::Error
  EXPECT_THROW(SSM_CUDA_CHECK(cudaErrorInvalidValue), Error);
  DeviceBuffer b(16);
  float v[4] = {1, 2, 3, 4};
  EXPECT_THROW(b.upload(v, 32), Error);
  b.upload(v, 16);
  EXPECT_EQ(to_host<float>(b, 4)[3], 4.0f);
}

// ---- GEMM -------------------------------------------------------------------------------------------------------

struct GemmCase {
  std::string name;
  int64_t N, K;
};
std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> c;
  for (const auto& s : mamba1_shapes()) {
    c.push_back({std::string(s.name) + ".in_proj", 2 * s.d_inner, s.d_model});
    c.push_back({std::string(s.name) + ".x_proj", s.dt_rank + 2 * s.d_state, s.d_inner});
    c.push_back({std::string(s.name) + ".out_proj", s.d_model, s.d_inner});
  }
  for (const auto& s : mamba2_shapes())
    c.push_back({std::string(s.name) + ".in_proj", 2 * s.d_inner() + 2LL * s.n_groups * s.d_state + s.heads, s.d_model});
  return c;
}

TEST(CudaGemm, MatchesCpuLinearOnModelShapes) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  cuda::GemmHandle gemm;
  cuda::Stream stream;
  for (const auto& gc : gemm_cases()) {
    for (int64_t M : {int64_t{1}, int64_t{7}, quick() ? int64_t{64} : int64_t{300}}) {
      for (DType ab : {DType::BF16, DType::F32}) {
        SCOPED_TRACE(testing::Message() << gc.name << " M=" << M << " " << dtype_name(ab));
        const int64_t K = gc.K, N = gc.N, xs = K + 8, ys = N + 4;
        auto w = rand_vec(rng, N * K, -0.05f, 0.05f);
        auto x = rand_vec(rng, M * xs);
        Weight W = Weight::allocate(ab, N, K);
        DeviceBuffer dw, dx;
        if (ab == DType::BF16) {
          round_bf16(w);
          round_bf16(x);
          auto wb = to_bf16_bits(w);
          std::memcpy(const_cast<void*>(W.data), wb.data(), wb.size() * 2);
          dw = to_device(wb);
          dx = to_device(to_bf16_bits(x));
        } else {
          std::memcpy(const_cast<void*>(W.data), w.data(), w.size() * 4);
          dw = to_device(w);
          dx = to_device(x);
        }
        std::vector<float> ref(M * ys, 0.0f);
        cpu::linear(x.data(), M, xs, W, nullptr, ref.data(), ys);
        for (int variant = 0; variant < 4; ++variant) {
          const DType yt = variant % 2 ? DType::BF16 : DType::F32;
          const bool fallback = variant >= 2;
          SCOPED_TRACE(fallback ? "fallback kernel" : "cuBLASLt");
          gemm.set_force_fallback(fallback);
          DeviceBuffer dy = poisoned(M * ys);
          gemm.run({M, N, K, dx.data(), xs, dw.data(), K, ab, dy.data(), ys, yt}, stream.get());
          stream.synchronize();
          std::vector<float> got(M * ys);
          if (yt == DType::F32) {
            got = to_host<float>(dy, M * ys);
          } else {
            auto bits = to_host<uint16_t>(dy, M * ys);  // bf16 rows at stride ys (elements of 2 bytes)
            for (int64_t i = 0; i < M * ys; ++i) got[i] = bf16_to_f32(bits[i]);
          }
          const double tol = yt == DType::BF16 ? 8e-3 : (ab == DType::F32 ? 1e-5 : 1e-4);
          EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, M, N), tol) << "y " << dtype_name(yt);
        }
        gemm.set_force_fallback(false);
      }
    }
  }
}

TEST(CudaGemm, UnalignedRowsFallBackToTiledKernel) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  cuda::GemmHandle gemm;
  // dt_proj on a slice of x_proj's output: K = dt_rank = 3, x rows of R + 2N = 35 floats (not 16-byte aligned).
  const int64_t M = 9, N = 70, K = 3, xs = 35, ys = 71;
  auto x = rand_vec(rng, M * xs), w = rand_vec(rng, N * K);
  Weight W = Weight::allocate(DType::F32, N, K);
  std::memcpy(const_cast<void*>(W.data), w.data(), w.size() * 4);
  std::vector<float> ref(M * ys, 0.0f);
  cpu::linear(x.data() + 1, M, xs, W, nullptr, ref.data(), ys);
  DeviceBuffer dx = to_device(x), dw = to_device(w), dy = poisoned(M * ys);
  gemm.run({M, N, K, dx.as<float>() + 1, xs, dw.data(), K, DType::F32, dy.data(), ys, DType::F32}, nullptr);
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(gemm.fallback_calls(), 1);
  auto got = to_host<float>(dy, M * ys);
  EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, M, N), 1e-6);
}

TEST(CudaGemm, RejectsBadArguments) {
  REQUIRE_GPU();
  cuda::GemmHandle gemm;
  EXPECT_THROW(gemm.run({4, 8, 16, nullptr, 8, nullptr, 16, DType::F32, nullptr, 8, DType::F32}, nullptr), Error);
  EXPECT_THROW(gemm.run({4, 8, 16, nullptr, 16, nullptr, 16, DType::F16, nullptr, 8, DType::F32}, nullptr), Error);
}

// ---- embedding and norms ----------------------------------------------------------------------------------------

TEST(CudaEmbedding, GathersRowsExactly) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t V = 50280, H = quick() ? 768 : 2560;
  auto table = rand_vec(rng, V * H);
  round_bf16(table);
  DeviceBuffer dt = to_device(to_bf16_bits(table));
  std::vector<int32_t> ids = {0, static_cast<int32_t>(V - 1), 17, 17, 50000, 3};
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(V - 1));
  for (int i = 0; i < 200; ++i) ids.push_back(d(rng));
  const int64_t T = static_cast<int64_t>(ids.size()), os = H + 5;
  DeviceBuffer di = to_device(ids), dout = poisoned(T * os);
  SSM_CUDA_CHECK(cuda::embedding(di.as<int32_t>(), T, dt.data(), DType::BF16, V, H, dout.as<float>(), os, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto got = to_host<float>(dout, T * os);
  for (int64_t t = 0; t < T; ++t)
    ASSERT_EQ(std::memcmp(got.data() + t * os, table.data() + ids[t] * H, H * 4), 0) << "row " << t;
}

TEST(CudaNorms, FusedAddRmsNormMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {int64_t{256}, int64_t{768}, int64_t{2560}, int64_t{4096}}) {
    for (int64_t T : {int64_t{1}, int64_t{33}}) {
      for (bool with_x : {true, false}) {
        SCOPED_TRACE(testing::Message() << "H=" << H << " T=" << T << " x=" << with_x);
        const int64_t xs = H + 4, rs = H + 2, os = H + 1;
        auto x = rand_vec(rng, T * xs), res = rand_vec(rng, T * rs), w = rand_vec(rng, H, 0.5f, 1.5f);
        std::vector<float> sum(T * H), ref(T * H);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h) sum[t * H + h] = res[t * rs + h] + (with_x ? x[t * xs + h] : 0.0f);
        cpu::rms_norm(sum.data(), w.data(), 1e-5f, T, H, ref.data());
        DeviceBuffer dx = to_device(x), dr = to_device(res), dw = to_device(w);
        for (DType ot : {DType::F32, DType::BF16}) {
          dr.upload(res.data(), res.size() * 4);
          DeviceBuffer dout = poisoned(T * os);
          SSM_CUDA_CHECK(cuda::fused_add_rms_norm(with_x ? dx.as<float>() : nullptr, xs, dr.as<float>(), rs,
                                                  dw.as<float>(), 1e-5f, T, H, dout.data(), ot, os, nullptr));
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          auto r = to_host<float>(dr, T * rs);
          EXPECT_LT(rel_err(r.data(), rs, sum.data(), H, T, H), 1e-7) << "residual";
          std::vector<float> got(T * os);
          if (ot == DType::F32) {
            got = to_host<float>(dout, T * os);
          } else {
            auto bits = to_host<uint16_t>(dout, T * os);
            for (int64_t i = 0; i < T * os; ++i) got[i] = bf16_to_f32(bits[i]);
          }
          EXPECT_LT(rel_err(got.data(), os, ref.data(), H, T, H), ot == DType::F32 ? 1e-6 : 5e-3);
        }
      }
    }
  }
}

// A parallel mixer pair's two residual updates in one launch (Falcon-H1, cuda_decoder.cpp): bit-identical to the two
// scaled_residual launches it replaces.
TEST(CudaNorms, ScaledResidual2EqualsTwoLaunches) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t n = 3 * 4096 + 17;
  auto h = rand_vec(rng, n, -4.0f, 4.0f), x = rand_vec(rng, n), y = rand_vec(rng, n);
  DeviceBuffer ha = to_device(h), hb = to_device(h), dx = to_device(x), dy = to_device(y);
  SSM_CUDA_CHECK(cuda::scaled_residual(ha.as<float>(), ha.as<float>(), 1.0f, dx.as<float>(), 0.6f, n, nullptr));
  SSM_CUDA_CHECK(cuda::scaled_residual(ha.as<float>(), ha.as<float>(), 0.9f, dy.as<float>(), 0.75f, n, nullptr));
  SSM_CUDA_CHECK(cuda::scaled_residual2(hb.as<float>(), 1.0f, dx.as<float>(), 0.6f, 0.9f, dy.as<float>(), 0.75f, n, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto a = to_host<float>(ha, n), b = to_host<float>(hb, n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  EXPECT_EQ(cuda::scaled_residual2(hb.as<float>(), 1, dx.as<float>(), 1, 1, dy.as<float>(), 1, -1, nullptr), cudaErrorInvalidValue);
}

TEST(CudaNorms, GatedRmsNormMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& s : mamba2_shapes()) {
    const int64_t D = s.d_inner(), gs = D / s.n_groups;
    for (int64_t T : {int64_t{1}, int64_t{19}}) {
      for (int layout = 0; layout < 4; ++layout) {  // bit 0: norm_before_gate; bit 1: strides of 4 (float4 kernel)
        const bool nbg = layout & 1, vec = layout & 2;
        SCOPED_TRACE(testing::Message() << s.name << " T=" << T << " norm_before_gate=" << nbg << " float4 " << vec);
        const int64_t ys = D + 8, zs = 2 * D + (vec ? 4 : 3), os = D + (vec ? 4 : 2);
        auto y = rand_vec(rng, T * ys), z = rand_vec(rng, T * zs, -3, 3), w = rand_vec(rng, D, 0.5f, 1.5f);
        std::vector<float> ref(T * D);
        cpu::gated_rms_norm(y.data(), ys, z.data(), zs, w.data(), 1e-5f, T, D, gs, nbg, ref.data());
        DeviceBuffer dy = to_device(y), dz = to_device(z), dw = to_device(w), dout = poisoned(T * os);
        SSM_CUDA_CHECK(cuda::gated_rms_norm(dy.as<float>(), ys, dz.as<float>(), zs, dw.as<float>(), 1e-5f, T, D, gs,
                                            nbg, dout.data(), DType::F32, os, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        auto got = to_host<float>(dout, T * os);
        EXPECT_LT(rel_err(got.data(), os, ref.data(), D, T, D), 5e-6);
      }
    }
  }
}

// ---- causal conv1d ----------------------------------------------------------------------------------------------

/// Prefill over `b` then one decode step over the same blocks; outputs and windows against the CPU.
void check_conv(std::mt19937& rng, int64_t dim, int width, DType state_dtype, const Batch& b) {
  const int64_t T = b.num_tokens(), xs = dim + 16, os = dim + 1;
  const int nblocks = b.num_seqs() + 1, S = width - 1;
  StatePool pool(state_dtype, S * dim, nblocks, rng);
  auto w = rand_vec(rng, dim * width, -0.5f, 0.5f), bias = rand_vec(rng, dim, -0.2f, 0.2f), x = rand_vec(rng, T * xs);
  DeviceBuffer dw = to_device(w), dbias = to_device(bias), dx = to_device(x), dout = poisoned(T * os);
  DeviceBuffer dq = to_device(b.query_start_loc), dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states);
  cpu::ConvParams cp{dim, width, w.data(), bias.data(), pool.host_view(), true};
  cuda::ConvParams gp{dim, width, dw.as<float>(), dbias.as<float>(), pool.dev_view(), true};
  std::vector<float> ref(T * os, 0.0f);
  cpu::causal_conv1d_fwd(x.data(), xs, ref.data(), os, cp, sp(b.query_start_loc), sp(b.state_indices),
                         sp(b.has_initial_states));
  // The dual-output form (fp32 out and its bf16 rounding, x_proj's input) is the prefill path's.
  DeviceBuffer dout16 = poisoned(T * os);  // bf16 rows with stride os (half the buffer)
  SSM_CUDA_CHECK(cuda::causal_conv1d_fwd_dual(dx.as<float>(), xs, dout.as<float>(), os, dout16.data(), os, gp,
                                              dq.as<int32_t>(), dsi.as<int32_t>(), dh.as<uint8_t>(), b.num_seqs(), T,
                                              nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto got = to_host<float>(dout, T * os);
  const auto mask = b.token_mask();
  {
    auto got16 = to_host<uint16_t>(dout16, T * os);
    int64_t bad = 0;
    for (int64_t t = 0; t < T; ++t)
      if (mask[t])
        for (int64_t c = 0; c < dim; ++c) bad += got16[t * os + c] != f32_to_bf16(got[t * os + c]);
    EXPECT_EQ(bad, 0) << "bf16 copy is not the rounding of the fp32 out";
  }
  const double tol = 1e-6;  // same fma order: equal up to expf rounding in SiLU
  EXPECT_LT(rel_err(got.data(), os, ref.data(), os, T, dim, &mask), tol) << "prefill out";
  EXPECT_TRUE(untouched(got.data(), os, T, dim, mask)) << "null rows written";
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), 1e-7) << "prefill windows";
  EXPECT_TRUE(pool.null_block_intact());

  // Decode: one token for every sequence of the batch (null rows included, skipped).
  const int B = b.num_seqs();
  auto xd = rand_vec(rng, B * xs);
  DeviceBuffer dxd = to_device(xd), doutd = poisoned(B * os);
  std::vector<float> refd(B * os, 0.0f);
  cpu::causal_conv1d_update(xd.data(), xs, refd.data(), os, cp, sp(b.state_indices));
  SSM_CUDA_CHECK(cuda::causal_conv1d_update(dxd.as<float>(), xs, doutd.as<float>(), os, gp, dsi.as<int32_t>(), B, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto gotd = to_host<float>(doutd, B * os);
  std::vector<uint8_t> rmask(B);
  for (int i = 0; i < B; ++i) rmask[i] = b.state_indices[i] != 0;
  EXPECT_LT(rel_err(gotd.data(), os, refd.data(), os, B, dim, &rmask), tol) << "decode out";
  EXPECT_TRUE(untouched(gotd.data(), os, B, dim, rmask)) << "null decode rows written";
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), 1e-7) << "decode windows";
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaConv1d, PrefillAndDecodeMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::pair<std::string, int64_t>> dims;
  for (const auto& s : mamba1_shapes()) dims.push_back({s.name, s.d_inner});
  for (const auto& s : mamba2_shapes()) dims.push_back({s.name, s.conv_dim()});
  for (const auto& [name, dim] : dims)
    for (const auto& sch : schedules())
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << name << " " << sch.name << " state " << dtype_name(dt));
        check_conv(rng, dim, 4, dt, make_batch(sch.lens, sch.null_at));
      }
  // Other widths (2 and the maximum 8) on a small odd channel count.
  for (int width : {2, 8}) check_conv(rng, 200, width, DType::F32, make_batch({1, 3, 9, 2}, {2}));
}

TEST(CudaConv1d, Bf16OnlyOutputEqualsDualOutput) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 1536, xs = 2 * dim, os = dim + 4;
  Batch b = make_batch({5, 1, 37, 2, 64, 3}, {1, 4});
  for (auto& h : b.has_initial_states) h = 0;  // the window write-back of the first call does not change the second
  const int64_t T = b.num_tokens();
  StatePool pool(DType::F32, 3 * dim, b.num_seqs() + 1, rng);
  auto w = rand_vec(rng, dim * 4, -0.5f, 0.5f), bias = rand_vec(rng, dim, -0.2f, 0.2f), x = rand_vec(rng, T * xs);
  DeviceBuffer dw = to_device(w), dbias = to_device(bias), dx = to_device(x), dout = poisoned(T * os),
               d16a = poisoned(T * os), d16b = poisoned(T * os);
  DeviceBuffer dq = to_device(b.query_start_loc), dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states);
  cuda::ConvParams gp{dim, 4, dw.as<float>(), dbias.as<float>(), pool.dev_view(), true};
  SSM_CUDA_CHECK(cuda::causal_conv1d_fwd_dual(dx.as<float>(), xs, dout.as<float>(), os, d16a.data(), os, gp,
                                              dq.as<int32_t>(), dsi.as<int32_t>(), dh.as<uint8_t>(), b.num_seqs(), T,
                                              nullptr));
  SSM_CUDA_CHECK(cuda::causal_conv1d_fwd_dual(dx.as<float>(), xs, nullptr, 0, d16b.data(), os, gp, dq.as<int32_t>(),
                                              dsi.as<int32_t>(), dh.as<uint8_t>(), b.num_seqs(), T, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(to_host<uint16_t>(d16a, T * os), to_host<uint16_t>(d16b, T * os));
  EXPECT_EQ(cuda::causal_conv1d_fwd_dual(dx.as<float>(), xs, nullptr, 0, nullptr, 0, gp, dq.as<int32_t>(),
                                         dsi.as<int32_t>(), dh.as<uint8_t>(), b.num_seqs(), T, nullptr),
            cudaErrorInvalidValue);
}

// ---- bad arguments ----------------------------------------------------------------------------------------------

TEST(CudaOps, RejectBadSizes) {
  // No device work: argument checks come first (runs without a GPU too).
  cuda::ConvParams cp{16, 9, nullptr, nullptr, {}, true};
  EXPECT_EQ(cuda::causal_conv1d_update(nullptr, 16, nullptr, 16, cp, nullptr, 1, nullptr), cudaErrorInvalidValue);
  cuda::ScanParams sp{16, 512, nullptr, nullptr, nullptr, true, {}};
  EXPECT_EQ(cuda::selective_state_update({}, sp, nullptr, 16, nullptr, 1, nullptr), cudaErrorInvalidValue);
  cuda::SsdParams dp;
  dp.num_heads = 6, dp.head_dim = 8, dp.n_groups = 4, dp.d_state = 16;  // 6 % 4 != 0
  EXPECT_EQ(cuda::ssd_state_update({}, dp, nullptr, 48, nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gated_rms_norm(nullptr, 10, nullptr, 10, nullptr, 1e-5f, 1, 10, 3, false, nullptr, DType::F32, 10,
                                 nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssmserve
