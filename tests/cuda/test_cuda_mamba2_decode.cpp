// The Mamba-2 decode step in one launch (kernels/cuda/mamba2_decode.h) against the three kernels it replaces
// (conv1d_update_dual, ssd_state_update, gated_rms_norm_pdl), bit for bit: out_proj's input, the SSD output, the conv
// windows and the SSM states, over random shapes (groups, head_dim not a multiple of 32, d_state 16..256, conv widths,
// fp32 / bf16 states, the norm before or after the gate), 1..16 rows with padding rows (zero out rows), two steps in a row (the
// arrival counters are left at zero) and inside a CUDA graph. The separate kernels are checked against the CPU in
// test_cuda_decode_ops / test_cuda_scan_ops. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/mamba2_decode.h"
#include "kernels/cuda/ssd.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct Shape {
  int H, P, G, N, W;
};

/// One layer's parameters and two copies of its state pool (separate / fused), on the device.
struct Layer {
  Shape s;
  DType sd;
  int64_t I, C, PW, nblocks, conv_stride, ssm_stride;
  DeviceBuffer conv_w, conv_b, A, D, dt_bias, norm_w;
  DeviceBuffer conv_state[2], ssm_state[2];

  Layer(std::mt19937& rng, Shape sh, DType state_dtype, int blocks) : s(sh), sd(state_dtype), nblocks(blocks) {
    I = int64_t{s.H} * s.P, C = I + 2 * int64_t{s.G} * s.N;
    PW = (I + C + s.H + 4 + 3) / 4 * 4;  // proj rows padded, a multiple of 4 (the norm's float4 form)
    conv_stride = (s.W - 1) * C + 8, ssm_stride = int64_t{s.H} * s.P * s.N + 8;  // 16-byte aligned blocks
    conv_w = to_device(rand_vec(rng, C * s.W, -0.6f, 0.6f)), conv_b = to_device(rand_vec(rng, C));
    std::vector<float> a = rand_vec(rng, s.H, 0.2f, 2.0f);
    for (float& v : a) v = -v;
    A = to_device(a), D = to_device(rand_vec(rng, s.H)), dt_bias = to_device(rand_vec(rng, s.H, -2.0f, 0.5f));
    norm_w = to_device(rand_vec(rng, I, 0.5f, 1.5f));
    const auto fill = [&](int64_t elems) {
      std::vector<float> v = rand_vec(rng, elems, -0.8f, 0.8f);
      if (sd == DType::F32) return to_device(v);
      return to_device(to_bf16_bits(v));
    };
    DeviceBuffer c0 = fill(blocks * conv_stride), s0 = fill(blocks * ssm_stride);
    for (int k = 0; k < 2; ++k) {
      conv_state[k] = DeviceBuffer(c0.bytes()), ssm_state[k] = DeviceBuffer(s0.bytes());
      SSM_CUDA_CHECK(cudaMemcpy(conv_state[k].data(), c0.data(), c0.bytes(), cudaMemcpyDeviceToDevice));
      SSM_CUDA_CHECK(cudaMemcpy(ssm_state[k].data(), s0.data(), s0.bytes(), cudaMemcpyDeviceToDevice));
    }
  }
  cuda::ConvParams conv(int k) {
    return {C, s.W, conv_w.as<float>(), conv_b.as<float>(), StateView{conv_state[k].data(), sd, conv_stride}, true};
  }
  cuda::SsdParams ssd(int k) {
    cuda::SsdParams p;
    p.num_heads = s.H, p.head_dim = s.P, p.n_groups = s.G, p.d_state = s.N;
    p.A = A.as<float>(), p.D = D.as<float>(), p.dt_bias = dt_bias.as<float>();
    p.time_step_min = 0.001f, p.time_step_max = 10.0f;
    p.ssm_states = StateView{ssm_state[k].data(), sd, ssm_stride};
    return p;
  }
};

/// Runs one decode step both ways on the same proj rows and compares every output and state bit for bit.
void step_and_compare(Layer& L, const std::vector<float>& proj, const std::vector<int32_t>& rows, bool nbg,
                      DeviceBuffer& counters, bool graph) {
  const int R = static_cast<int>(rows.size());
  const int64_t I = L.I, C = L.C, PW = L.PW, OS = I + 8;
  DeviceBuffer dproj = to_device(proj), dsi = to_device(rows);
  DeviceBuffer xbc = poisoned(R * C), y0 = poisoned(R * I), y1 = poisoned(R * I);
  DeviceBuffer out0 = poisoned_bytes(R * OS * 2), out1 = poisoned_bytes(R * OS * 2);
  const float eps = 1e-5f;
  // Separate: conv (fp32 xBC), SSD update, gated norm.
  const cuda::ConvParams cv = L.conv(0);
  SSM_CUDA_CHECK(cuda::conv1d_update_dual(dproj.as<float>() + I, PW, xbc.as<float>(), C, nullptr, 0, cv,
                                          dsi.as<int32_t>(), R, false, nullptr));
  const int64_t GN = int64_t{L.s.G} * L.s.N;
  cuda::SsdInputs in{{xbc.as<float>(), C}, {dproj.as<float>() + I + C, PW}, {xbc.as<float>() + I, C},
                     {xbc.as<float>() + I + GN, C}, {}, {}, {}};
  SSM_CUDA_CHECK(cuda::ssd_state_update(in, L.ssd(0), y0.as<float>(), I, dsi.as<int32_t>(), R, nullptr, false));
  SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(y0.as<float>(), I, dproj.as<float>(), PW, L.norm_w.as<float>(), eps, R, I,
                                          I / L.s.G, nbg, out0.data(), DType::BF16, OS, false, nullptr));
  // Fused.
  cuda::Mamba2DecodeArgs a{dproj.as<float>(), PW, L.conv(1), L.ssd(1), dsi.as<int32_t>(), y1.as<float>(),
                           L.norm_w.as<float>(), eps, nbg, out1.data(), OS, DType::BF16, counters.as<int32_t>()};
  ASSERT_TRUE(cuda::mamba2_decode_fused_fits(a, R));
  launch_once(graph, [&](cudaStream_t st) { return cuda::mamba2_decode_fused(a, R, st, true); });
  const auto o0 = to_host<uint16_t>(out0, R * OS), o1 = to_host<uint16_t>(out1, R * OS);
  const auto h0 = to_host<float>(y0, R * I), h1 = to_host<float>(y1, R * I);
  for (int r = 0; r < R; ++r) {
    if (rows[r] == 0) {  // a padding row: zeros
      for (int64_t i = 0; i < I; ++i) ASSERT_EQ(o1[r * OS + i], 0) << "padding row " << r;
      continue;
    }
    ASSERT_EQ(std::memcmp(&h0[r * I], &h1[r * I], I * 4), 0) << "y row " << r;
    ASSERT_EQ(std::memcmp(&o0[r * OS], &o1[r * OS], I * 2), 0) << "out row " << r;
    for (int64_t i = I; i < OS; ++i) ASSERT_EQ(o1[r * OS + i], 0xffff) << "out row padding " << r;
  }
  ASSERT_TRUE(same_bytes(L.conv_state[0], L.conv_state[1])) << "conv windows";
  ASSERT_TRUE(same_bytes(L.ssm_state[0], L.ssm_state[1])) << "SSM states";
  for (int32_t c : to_host<int32_t>(counters, counters.bytes() / 4)) ASSERT_EQ(c, 0) << "a counter left non-zero";
}

TEST(CudaMamba2Decode, FusedStepEqualsConvSsdAndNormBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Granite-4.0-H (one group), Nemotron-H (8 groups, 2 heads each), head_dim 40 (a partial 32-row block), d_state
  // 256 / 64 / 16, conv widths 4 / 2 / 1 / 8.
  // Granite-4.0-H-Tiny's 3072-wide norm group (4 runs of 192 threads) and a 5120-wide one (8 runs of 160).
  const std::vector<Shape> shapes = {{8, 64, 1, 128, 4}, {16, 64, 8, 128, 4}, {6, 40, 2, 64, 4},
                                     {4, 32, 4, 256, 2}, {4, 16, 1, 16, 4},   {3, 24, 3, 32, 1},
                                     {2, 64, 1, 128, 8}, {48, 64, 1, 128, 4}, {80, 64, 1, 64, 4}};
  const std::vector<std::vector<int32_t>> batches = {{3}, {2, 0, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0, 15}};
  int cases = 0;
  for (const Shape& s : shapes)
    for (DType sd : {DType::F32, DType::BF16})
      for (bool nbg : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "H " << s.H << " P " << s.P << " G " << s.G << " N " << s.N << " W "
                                          << s.W << " state " << dtype_name(sd) << " norm_before_gate " << nbg);
        Layer L(rng, s, sd, 17);
        DeviceBuffer counters(cuda::kMamba2FusedMaxRows * s.G * 4);
        counters.fill_bytes(0);
        for (const auto& rows : batches)
          for (int step = 0; step < 2; ++step) {  // the second step continues from the first's states and counters
            SCOPED_TRACE(::testing::Message() << rows.size() << " rows, step " << step);
            const std::vector<float> proj = rand_vec(rng, rows.size() * L.PW, -1.5f, 1.5f);
            step_and_compare(L, proj, rows, nbg, counters, step == 1 && rows.size() == 3);
            if (HasFatalFailure()) return;
            ++cases;
          }
      }
  EXPECT_EQ(cases, 9 * 2 * 2 * 3 * 2);
}

// Runs without a GPU: the checks are on the host (fake, aligned device addresses; nothing is launched).
TEST(CudaMamba2Decode, FitsOnlyWhatItComputes) {
  const auto addr = [](uintptr_t mb) { return reinterpret_cast<float*>(mb << 20); };
  const Shape s{4, 16, 1, 16, 4};
  const int64_t I = 64, C = I + 32;
  cuda::Mamba2DecodeArgs a;
  a.proj = addr(1), a.proj_stride = I + C + 4;
  a.conv = {C, 4, addr(2), nullptr, StateView{addr(3), DType::F32, 3 * C}, true};
  a.ssd.num_heads = s.H, a.ssd.head_dim = s.P, a.ssd.n_groups = s.G, a.ssd.d_state = s.N, a.ssd.A = addr(4);
  a.ssd.ssm_states = StateView{addr(5), DType::F32, I * s.N};
  a.state_indices = reinterpret_cast<const int32_t*>(addr(6)), a.y = addr(7), a.norm_weight = addr(8);
  a.out = addr(9), a.out_stride = I, a.counters = reinterpret_cast<int32_t*>(addr(10));
  EXPECT_TRUE(cuda::mamba2_decode_fused_fits(a, 1));
  EXPECT_TRUE(cuda::mamba2_decode_fused_fits(a, cuda::kMamba2FusedMaxRows));
  EXPECT_FALSE(cuda::mamba2_decode_fused_fits(a, 0));
  EXPECT_FALSE(cuda::mamba2_decode_fused_fits(a, cuda::kMamba2FusedMaxRows + 1));
  auto refused = [&](auto edit) {
    cuda::Mamba2DecodeArgs b = a;
    edit(b);
    return !cuda::mamba2_decode_fused_fits(b, 1) &&
           cuda::mamba2_decode_fused(b, 1, nullptr, false) == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.out_dtype = DType::F32; }));  // fp32-weight models
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.conv.conv_states.dtype = DType::BF16; }));  // mixed dtypes
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.ssd.ssm_states.dtype = b.conv.conv_states.dtype = DType::F16; }));
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.ssd.d_state = 512; }));
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.conv.dim = 95; }));  // not d_inner + 2 G N
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.norm_weight += 1; }));  // the norm's scalar form
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.proj_stride = 64 + 96 + 3; }));  // no room for dt
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.counters = nullptr; }));
  EXPECT_TRUE(refused([](cuda::Mamba2DecodeArgs& b) { b.ssd.n_groups = 3; }));  // heads not a multiple of groups
}

}  // namespace
}  // namespace ssmserve
