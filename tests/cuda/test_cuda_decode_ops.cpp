// GPU fused decode kernels (issue 7): add + RMSNorm over all or gathered rows, the PDL gated norm, the dual-output
// conv update and the scan update with its output cast, each against its CPU
// reference and, bit for bit, against the kernels it replaces. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

TEST(CudaDecodeOps, NormRowsMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {256, 768, 2560, 1000, 5120})
  for (int64_t pad : {2, 4}) {  // pad 4: 16-byte aligned rows (the float4 form for H % 4 == 0, H <= 8192)
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

// The norm taking over a sublayer's scaled residual (residual_scale, x_scale) equals scaled_residual then the plain
// norm, bit for bit, both kernel forms (pad 4: the float4 one).
TEST(CudaDecodeOps, NormRowsScalesEqualScaledResidualThenNorm) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {256, 1536, 1000, 5120})
    for (int64_t pad : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << "H " << H << " pad " << pad);
      const int64_t T = 5, xs = H + 4, rs = H + pad, os = H + 4;
      const float b = 0.22f;  // Granite's residual_multiplier form (alpha 1, beta < 1); alpha != 1 too
      auto x = rand_vec(rng, T * xs), res = rand_vec(rng, T * rs), w = rand_vec(rng, H, 0.5f, 1.5f);
      DeviceBuffer dx = to_device(x), dw = to_device(w);
      for (float ra : {1.0f, 0.75f}) {
        // Separate: h = scaled_residual(h, ra, x, b) row by row, then the norm with nothing added.
        DeviceBuffer r1 = to_device(res), o1 = poisoned_bytes(T * os * 4);
        for (int64_t t = 0; t < T; ++t)
          SSM_CUDA_CHECK(cuda::scaled_residual(r1.as<float>() + t * rs, r1.as<float>() + t * rs, ra, dx.as<float>() + t * xs,
                                               b, H, nullptr, false));
        SSM_CUDA_CHECK(cuda::add_rms_norm_rows(nullptr, 0, r1.as<float>(), rs, dw.as<float>(), 1e-5f, nullptr, T, H, true,
                                               o1.data(), DType::F32, os, false, nullptr));
        // Fused: the scales in the norm.
        DeviceBuffer r2 = to_device(res), o2 = poisoned_bytes(T * os * 4);
        SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx.as<float>(), xs, r2.as<float>(), rs, dw.as<float>(), 1e-5f, nullptr, T, H,
                                               true, o2.data(), DType::F32, os, true, nullptr, ra, b));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto h1 = to_host<float>(r1, T * rs), h2 = to_host<float>(r2, T * rs);
        const auto f1 = to_host<float>(o1, T * os), f2 = to_host<float>(o2, T * os);
        for (int64_t t = 0; t < T; ++t) {
          ASSERT_EQ(std::memcmp(&h1[t * rs], &h2[t * rs], H * 4), 0) << "residual row " << t << " ra " << ra;
          ASSERT_EQ(std::memcmp(&f1[t * os], &f2[t * os], H * 4), 0) << "output row " << t << " ra " << ra;
        }
      }
    }
}

/// The norm's bf16 copy (add_rms_norm_rows' out_bf16, CudaModelOptions::fuse_casts) equals cast_rows of its fp32
/// output bit for bit, on the scalar kernel (H % 4 != 0), the float4 form and its wide form (H > 4096), with and without
/// the residual write; the fp32 output is unchanged by the copy; the copy's row padding stays untouched; a BF16 out with
/// a copy is refused.
TEST(CudaDecodeOps, NormRowsBf16CopyEqualsCast) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {1002, 1536, 4480})
    for (bool write_residual : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "H " << H << " write_residual " << write_residual);
      const int64_t T = 3, rs = H + 4, os = H + 4, bs = H + 6;
      auto x = rand_vec(rng, T * rs), res = rand_vec(rng, T * rs), w = rand_vec(rng, H, 0.5f, 1.5f);
      DeviceBuffer dx = to_device(x), dw = to_device(w), r1 = to_device(res), r2 = to_device(res);
      DeviceBuffer o1 = poisoned_bytes(T * os * 4), o2 = poisoned_bytes(T * os * 4);
      DeviceBuffer c1 = poisoned_bytes(T * bs * 2), c2 = poisoned_bytes(T * bs * 2);
      SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx.as<float>(), rs, r1.as<float>(), rs, dw.as<float>(), 1e-5f, nullptr, T, H,
                                             write_residual, o1.data(), DType::F32, os, false, nullptr));
      SSM_CUDA_CHECK(cuda::cast_rows(o1.as<float>(), os, T, H, c1.data(), DType::BF16, bs, nullptr));
      SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx.as<float>(), rs, r2.as<float>(), rs, dw.as<float>(), 1e-5f, nullptr, T, H,
                                             write_residual, o2.data(), DType::F32, os, true, nullptr, 1.0f, 1.0f, c2.data(), bs));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      ASSERT_EQ(to_host<uint8_t>(o1, T * os * 4), to_host<uint8_t>(o2, T * os * 4)) << "fp32 output changed by the copy";
      ASSERT_EQ(to_host<uint8_t>(c1, T * bs * 2), to_host<uint8_t>(c2, T * bs * 2)) << "bf16 copy differs from cast_rows";
      ASSERT_EQ(to_host<uint8_t>(r1, T * rs * 4), to_host<uint8_t>(r2, T * rs * 4)) << "residual differs";
    }
  DeviceBuffer r(8 * 4), w(8 * 4), o(8 * 2), c(8 * 2);
  EXPECT_EQ(cuda::add_rms_norm_rows(nullptr, 0, r.as<float>(), 8, w.as<float>(), 1e-5f, nullptr, 1, 8, true, o.data(),
                                    DType::BF16, 8, false, nullptr, 1.0f, 1.0f, c.data(), 8),
            cudaErrorInvalidValue);
}

/// The norm's addend (add_rms_norm_rows' NormAddend: a MoE layer's shared-expert rows left to the next norm,
/// CudaModelOptions::moe_shared_add_in_norm) equals the add's own launch (scaled_residual(x, x, 1, rows, 1)) then the
/// norm, bit for bit: the residual, the fp32 / bf16 output and the bf16 copy, on the scalar kernel (H % 4 != 0), the float4 form and its wide form (also with misaligned addend
/// rows, which must not change the form), with residual scales (Granite's), with and without the residual write and
/// with output rows (the LM head's); an addend without x is refused.
TEST(CudaDecodeOps, NormRowsAddendEqualsAddThenNorm) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t H : {1002, 1536, 4480})
    for (int64_t as_pad : {4, 3})
      for (bool gated : {false, true})  // gated: Qwen's shared add, its gate from sigmoid_gate_rows (NormAddend::gate)
        for (int mode = 0; mode < 3; ++mode) {  // residual write + bf16 out; residual write + fp32 out and copy; rows
          SCOPED_TRACE(::testing::Message() << "H " << H << " addend stride pad " << as_pad << " gated " << gated
                                            << " mode " << mode);
          const int64_t T = 3, rs = H + 4, as = H + as_pad, os = H + 4, bs = H + 6;
          const bool write_residual = mode < 2;
          const float ra = mode == 1 ? 1.0f : 0.5f, xb = mode == 1 ? 1.0f : 0.22f;
          auto x = rand_vec(rng, T * rs), y = rand_vec(rng, T * as), res = rand_vec(rng, T * rs),
               w = rand_vec(rng, H, 0.5f, 1.5f);
          DeviceBuffer dx1 = to_device(x), dx2 = to_device(x), dy = to_device(y), dw = to_device(w), r1 = to_device(res),
                       r2 = to_device(res);
          DeviceBuffer rows = to_device(std::vector<int32_t>{2, 0});
          const int64_t n = mode == 2 ? 2 : T;
          const int32_t* rp = mode == 2 ? rows.as<int32_t>() : nullptr;
          const DType od = mode == 0 ? DType::BF16 : DType::F32;
          DeviceBuffer o1 = poisoned_bytes(T * os * 4), o2 = poisoned_bytes(T * os * 4);
          DeviceBuffer c1 = poisoned_bytes(T * bs * 2), c2 = poisoned_bytes(T * bs * 2);
          void* copy1 = mode == 1 ? c1.data() : nullptr;
          void* copy2 = mode == 1 ? c2.data() : nullptr;
          const auto xg = rand_vec(rng, T * H), wg = rand_vec(rng, H, -0.05f, 0.05f);
          DeviceBuffer dxg = to_device(xg), dwg = to_device(wg), ds = poisoned_bytes(T * 4);
          if (gated) {
            SSM_CUDA_CHECK(cuda::sigmoid_gated_add(dx1.as<float>(), rs, dy.as<float>(), as, dxg.as<float>(), H,
                                                   dwg.as<float>(), T, H, nullptr, false));
            SSM_CUDA_CHECK(cuda::sigmoid_gate_rows(dxg.as<float>(), H, dwg.as<float>(), T, H, ds.as<float>(), nullptr, true));
          } else {
            for (int64_t t = 0; t < T; ++t)
              SSM_CUDA_CHECK(cuda::scaled_residual(dx1.as<float>() + t * rs, dx1.as<float>() + t * rs, 1.0f,
                                                   dy.as<float>() + t * as, 1.0f, H, nullptr, false));
          }
          SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx1.as<float>(), rs, r1.as<float>(), rs, dw.as<float>(), 1e-5f, rp, n, H,
                                                 write_residual, o1.data(), od, os, false, nullptr, ra, xb, copy1, bs));
          const cuda::NormAddend add{dy.as<float>(), as, gated ? ds.as<float>() : nullptr};
          SSM_CUDA_CHECK(cuda::add_rms_norm_rows(dx2.as<float>(), rs, r2.as<float>(), rs, dw.as<float>(), 1e-5f, rp, n, H,
                                                 write_residual, o2.data(), od, os, true, nullptr, ra, xb, copy2, bs, add));
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          ASSERT_EQ(to_host<uint8_t>(o1, T * os * 4), to_host<uint8_t>(o2, T * os * 4)) << "output differs";
          ASSERT_EQ(to_host<uint8_t>(c1, T * bs * 2), to_host<uint8_t>(c2, T * bs * 2)) << "bf16 copy differs";
          ASSERT_EQ(to_host<uint8_t>(r1, T * rs * 4), to_host<uint8_t>(r2, T * rs * 4)) << "residual differs";
        }
  DeviceBuffer r(8 * 4), w(8 * 4), o(8 * 4), a(8 * 4);
  const cuda::NormAddend plain{a.as<float>(), 8};
  EXPECT_EQ(cuda::add_rms_norm_rows(nullptr, 0, r.as<float>(), 8, w.as<float>(), 1e-5f, nullptr, 1, 8, true, o.data(),
                                    DType::F32, 8, false, nullptr, 1.0f, 1.0f, nullptr, 0, plain),
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

}  // namespace
}  // namespace ssmserve
