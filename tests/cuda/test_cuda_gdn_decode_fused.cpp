// The Gated DeltaNet decode step in one launch (kernels/cuda/gated_delta_decode_fused.h) against the four kernels it
// replaces (conv1d_update_dual, gated_delta_prepare, gated_delta_decode, gated_rms_norm_pdl), bit for bit: out_proj's
// input, the delta rule's output, the conv windows and the recurrent states, over head dims 32..256, 1..4 value heads
// per key head, conv widths, fp32 / bf16 states, 1..16 rows with padding rows (zero out rows), both column slices
// (16 and 32), two steps in a row (the arrival counters are left at zero) and inside a CUDA graph. The separate
// kernels are checked against the CPU in test_cuda_gated_delta_ops / test_cuda_decode_ops. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/gated_delta_decode_fused.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct Shape {
  int Hk, Hv, Dk, Dv, W;
};

/// One layer's parameters and two copies of its state pool (separate / fused), on the device.
struct Layer {
  Shape s;
  DType sd;
  int64_t Kd, Vd, C, PW, conv_stride, state_stride;
  DeviceBuffer conv_w, A_log, dt_bias, norm_w, conv_state[2], state[2];

  Layer(std::mt19937& rng, Shape sh, DType state_dtype, int blocks) : s(sh), sd(state_dtype) {
    Kd = int64_t{s.Hk} * s.Dk, Vd = int64_t{s.Hv} * s.Dv, C = 2 * Kd + Vd;
    PW = (C + Vd + 2 * s.Hv + 4 + 3) / 4 * 4;  // [q | k | v | z | b | a], padded to a multiple of 4
    conv_stride = (s.W - 1) * C + 8, state_stride = int64_t{s.Hv} * s.Dk * s.Dv + 16;
    conv_w = to_device(rand_vec(rng, C * s.W, -0.6f, 0.6f));
    A_log = to_device(rand_vec(rng, s.Hv, -1.0f, 1.0f)), dt_bias = to_device(rand_vec(rng, s.Hv, -1.0f, 1.0f));
    std::vector<float> w = rand_vec(rng, s.Dv, 0.5f, 1.5f), wf;
    for (int h = 0; h < s.Hv; ++h) wf.insert(wf.end(), w.begin(), w.end());
    norm_w = to_device(wf);
    const auto fill = [&](int64_t elems) {
      std::vector<float> v = rand_vec(rng, elems, -0.5f, 0.5f);
      return sd == DType::F32 ? to_device(v) : to_device(to_bf16_bits(v));
    };
    DeviceBuffer c0 = fill(blocks * conv_stride), s0 = fill(blocks * state_stride);
    for (int k = 0; k < 2; ++k) {
      conv_state[k] = DeviceBuffer(c0.bytes()), state[k] = DeviceBuffer(s0.bytes());
      SSM_CUDA_CHECK(cudaMemcpy(conv_state[k].data(), c0.data(), c0.bytes(), cudaMemcpyDeviceToDevice));
      SSM_CUDA_CHECK(cudaMemcpy(state[k].data(), s0.data(), s0.bytes(), cudaMemcpyDeviceToDevice));
    }
  }
  cuda::ConvParams conv(int k) {
    return {C, s.W, conv_w.as<float>(), nullptr, StateView{conv_state[k].data(), sd, conv_stride}, true};
  }
  cuda::GatedDeltaParams params(int k) {
    cuda::GatedDeltaParams p;
    p.num_k_heads = s.Hk, p.num_v_heads = s.Hv, p.head_k_dim = s.Dk, p.head_v_dim = s.Dv, p.chunk_size = 64;
    p.states = StateView{state[k].data(), sd, state_stride};
    return p;
  }
};

void step_and_compare(Layer& L, const std::vector<float>& proj, const std::vector<int32_t>& rows, DeviceBuffer& counters,
                      bool graph) {
  const int R = static_cast<int>(rows.size());
  const int64_t Kd = L.Kd, Vd = L.Vd, C = L.C, PW = L.PW, Hv = L.s.Hv, OS = Vd + 8;
  DeviceBuffer dproj = to_device(proj), dsi = to_device(rows);
  DeviceBuffer qkv = poisoned(R * C), gb = poisoned(R * 2 * Hv), o0 = poisoned(R * Vd), o1 = poisoned(R * Vd);
  DeviceBuffer out0 = poisoned_bytes(R * OS * 2), out1 = poisoned_bytes(R * OS * 2);
  const float eps = 1e-6f;
  // Separate: conv, prepare, decode, norm (the module's steps 2-5).
  SSM_CUDA_CHECK(cuda::conv1d_update_dual(dproj.as<float>(), PW, qkv.as<float>(), C, nullptr, 0, L.conv(0),
                                          dsi.as<int32_t>(), R, false, nullptr));
  cuda::GatedDeltaPrepareArgs pa;
  float* q = qkv.as<float>();
  const float* ab = dproj.as<float>() + C + Vd;
  pa.q = q, pa.q_stride = C, pa.k = q + Kd, pa.k_stride = C, pa.b = ab, pa.b_stride = PW, pa.a = ab + Hv;
  pa.a_stride = PW, pa.A_log = L.A_log.as<float>(), pa.dt_bias = L.dt_bias.as<float>();
  pa.q_out = q, pa.q_out_stride = C, pa.k_out = q + Kd, pa.k_out_stride = C;
  pa.g = gb.as<float>(), pa.g_stride = 2 * Hv, pa.beta = gb.as<float>() + Hv, pa.beta_stride = 2 * Hv;
  SSM_CUDA_CHECK(cuda::gated_delta_prepare(pa, R, L.s.Hk, L.s.Hv, L.s.Dk, nullptr, false));
  const cuda::GatedDeltaInputs in{q, C, q + Kd, C, q + 2 * Kd, C, gb.as<float>(), 2 * Hv, gb.as<float>() + Hv, 2 * Hv};
  SSM_CUDA_CHECK(cuda::gated_delta_decode(in, L.params(0), o0.as<float>(), Vd, dsi.as<int32_t>(), R, nullptr, false, false));
  SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(o0.as<float>(), Vd, dproj.as<float>() + C, PW, L.norm_w.as<float>(), eps, R, Vd,
                                          L.s.Dv, true, out0.data(), DType::BF16, OS, false, nullptr));
  // Fused.
  const cuda::GdnDecodeArgs a{dproj.as<float>(), PW, L.conv(1), L.params(1), L.A_log.as<float>(), L.dt_bias.as<float>(),
                              dsi.as<int32_t>(), o1.as<float>(), L.norm_w.as<float>(), eps, out1.data(), OS, DType::BF16,
                              counters.as<int32_t>()};
  ASSERT_TRUE(cuda::gated_delta_decode_fused_fits(a, R));
  launch_once(graph, [&](cudaStream_t st) { return cuda::gated_delta_decode_fused(a, R, st, true); });
  const auto h0 = to_host<float>(o0, R * Vd), h1 = to_host<float>(o1, R * Vd);
  const auto g0 = to_host<uint16_t>(out0, R * OS), g1 = to_host<uint16_t>(out1, R * OS);
  for (int r = 0; r < R; ++r) {
    if (rows[r] == 0) {  // a padding row: zeros
      for (int64_t i = 0; i < Vd; ++i) ASSERT_EQ(g1[r * OS + i], 0) << "padding row " << r;
      continue;
    }
    ASSERT_EQ(std::memcmp(&h0[r * Vd], &h1[r * Vd], Vd * 4), 0) << "delta-rule output row " << r;
    ASSERT_EQ(std::memcmp(&g0[r * OS], &g1[r * OS], Vd * 2), 0) << "out row " << r;
    for (int64_t i = Vd; i < OS; ++i) ASSERT_EQ(g1[r * OS + i], 0xffff) << "out row padding " << r;
  }
  ASSERT_TRUE(same_bytes(L.conv_state[0], L.conv_state[1])) << "conv windows";
  ASSERT_TRUE(same_bytes(L.state[0], L.state[1])) << "recurrent states";
  for (int32_t c : to_host<int32_t>(counters, counters.bytes() / 4)) ASSERT_EQ(c, 0) << "a counter left non-zero";
}

TEST(CudaGdnDecodeFused, EqualsFourKernelsBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // tiny-qwen3_5_moe's heads, Qwen3.5's (128 / 128, 2 value heads per key head), 64, a 256-wide key head, conv 2 / 1.
  // At 16 rows the 32-column slices run for {2, 4, 128, 128}, {2, 8, 128, 64}, {2, 4, 256, 128} (512 threads) and
  // {2, 8, 64, 64}.
  const std::vector<Shape> shapes = {{4, 8, 32, 32, 4}, {2, 4, 128, 128, 4}, {1, 4, 64, 64, 4}, {2, 2, 256, 128, 2},
                                     {2, 8, 128, 64, 1}, {2, 4, 256, 128, 4}, {2, 8, 64, 64, 4}};
  const std::vector<std::vector<int32_t>> batches = {{3}, {2, 0, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0, 15}};
  int cases = 0;
  for (const Shape& s : shapes)
    for (DType sd : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(::testing::Message() << "Hk " << s.Hk << " Hv " << s.Hv << " Dk " << s.Dk << " Dv " << s.Dv << " W "
                                        << s.W << " state " << dtype_name(sd));
      Layer L(rng, s, sd, 17);
      DeviceBuffer counters(cuda::kGdnFusedMaxRows * (s.Hv + s.Hk) * 4);
      counters.fill_bytes(0);
      for (const auto& rows : batches)
        for (int step = 0; step < 2; ++step) {  // the second step continues from the first's states and counters
          SCOPED_TRACE(::testing::Message() << rows.size() << " rows, step " << step);
          const std::vector<float> proj = rand_vec(rng, rows.size() * L.PW, -1.5f, 1.5f);
          step_and_compare(L, proj, rows, counters, step == 1 && rows.size() == 3);
          if (HasFatalFailure()) return;
          ++cases;
        }
    }
  EXPECT_EQ(cases, 7 * 2 * 3 * 2);
}

// Runs without a GPU: host-side checks on fake, aligned device addresses (nothing is launched).
TEST(CudaGdnDecodeFused, FitsOnlyWhatItComputes) {
  const auto addr = [](uintptr_t mb) { return reinterpret_cast<float*>(mb << 20); };
  const int Hk = 2, Hv = 4, Dk = 64, Dv = 64;
  const int64_t Kd = Hk * Dk, Vd = Hv * Dv, C = 2 * Kd + Vd;
  cuda::GdnDecodeArgs a;
  a.proj = addr(1), a.proj_stride = C + Vd + 2 * Hv;
  a.conv = {C, 4, addr(2), nullptr, StateView{addr(3), DType::F32, 3 * C}, true};
  a.gdn.num_k_heads = Hk, a.gdn.num_v_heads = Hv, a.gdn.head_k_dim = Dk, a.gdn.head_v_dim = Dv;
  a.gdn.states = StateView{addr(4), DType::F32, Hv * Dk * Dv};
  a.A_log = addr(5), a.dt_bias = addr(6), a.state_indices = reinterpret_cast<const int32_t*>(addr(7));
  a.o = addr(8), a.norm_weight = addr(9), a.out = addr(10), a.out_stride = Vd;
  a.counters = reinterpret_cast<int32_t*>(addr(11));
  EXPECT_TRUE(cuda::gated_delta_decode_fused_fits(a, 1));
  EXPECT_TRUE(cuda::gated_delta_decode_fused_fits(a, cuda::kGdnFusedMaxRows));
  EXPECT_FALSE(cuda::gated_delta_decode_fused_fits(a, 0));
  EXPECT_FALSE(cuda::gated_delta_decode_fused_fits(a, cuda::kGdnFusedMaxRows + 1));
  auto refused = [&](auto edit) {
    cuda::GdnDecodeArgs b = a;
    edit(b);
    return !cuda::gated_delta_decode_fused_fits(b, 1) &&
           cuda::gated_delta_decode_fused(b, 1, nullptr, false) == cudaErrorInvalidValue;
  };
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.out_dtype = DType::F32; }));
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.conv.conv_states.dtype = DType::BF16; }));
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.gdn.head_k_dim = 48; }));  // the decode kernel's head dims
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.conv.dim -= 4; }));
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.norm_weight += 1; }));  // the norm's scalar form
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.proj_stride -= 1; }));  // no room for a
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.dt_bias = nullptr; }));
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) { b.counters = nullptr; }));
  // A norm group wider than the block's threads cover (Dv 256: 64 threads; Dk 32 at 16 columns: a 32-thread block).
  EXPECT_TRUE(refused([](cuda::GdnDecodeArgs& b) {
    b.gdn.head_k_dim = 32, b.gdn.head_v_dim = 256;
    const int64_t kd = 2 * 32, vd = 4 * 256;
    b.conv.dim = 2 * kd + vd, b.proj_stride = b.conv.dim + vd + 8, b.out_stride = vd;
    b.conv.conv_states.block_stride = 3 * b.conv.dim, b.gdn.states.block_stride = vd * 32;
  }));
  cuda::GdnDecodeArgs wide = a;  // the same with Dk 64: 64 threads, fits
  wide.gdn.head_v_dim = 256, wide.conv.dim = 2 * 128 + 1024, wide.proj_stride = wide.conv.dim + 1024 + 8;
  wide.out_stride = 1024, wide.conv.conv_states.block_stride = 3 * wide.conv.dim, wide.gdn.states.block_stride = 1024 * 64;
  EXPECT_TRUE(cuda::gated_delta_decode_fused_fits(wide, 1));
}

}  // namespace
}  // namespace ssmserve
