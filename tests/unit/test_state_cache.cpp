// Unit tests of the state cache layout and dtypes: pages of one layer's buffer do not overlap and hold the conv
// state then the SSM state, each view addresses block b at b x page; zero_block clears exactly one block in every
// layer; bytes_per_block; the dtype options resolve like vLLM's and bad values are rejected naming the flag; the
// fp16 store conversion rounds to nearest even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "cache/state_cache.h"
#include "core/error.h"

namespace ssmserve {
namespace {

struct LayoutCase {
  StateShape shape;
  StateDtypes dtypes;
};

class StateCacheLayout : public ::testing::TestWithParam<LayoutCase> {};

std::byte* bytes(const StateView& v, int64_t block) {
  return static_cast<std::byte*>(v.data) + block * v.block_stride * static_cast<int64_t>(dtype_size(v.dtype));
}

TEST_P(StateCacheLayout, ViewsAddressPagesWithoutOverlap) {
  const auto [shape, dt] = GetParam();
  const int layers = 3, blocks = 5;
  StateCache cache(layers, shape, blocks, dt);
  const int64_t conv_bytes = shape.conv_elems * static_cast<int64_t>(dtype_size(dt.conv));
  const int64_t ssm_bytes = shape.ssm_elems * static_cast<int64_t>(dtype_size(dt.ssm));
  EXPECT_GE(cache.page_bytes(), conv_bytes + ssm_bytes);
  EXPECT_LT(cache.page_bytes(), conv_bytes + ssm_bytes + 128);  // at most two 64-byte paddings
  EXPECT_EQ(cache.page_bytes() % 64, 0);
  EXPECT_EQ(cache.bytes_per_block(), layers * cache.page_bytes());
  for (int l = 0; l < layers; ++l) {
    const StateView conv = cache.conv_state(l), ssm = cache.ssm_state(l);
    EXPECT_EQ(conv.dtype, dt.conv);
    EXPECT_EQ(ssm.dtype, dt.ssm);
    EXPECT_EQ(conv.block_stride * static_cast<int64_t>(dtype_size(dt.conv)), cache.page_bytes());
    EXPECT_EQ(ssm.block_stride * static_cast<int64_t>(dtype_size(dt.ssm)), cache.page_bytes());
    std::byte* page0 = bytes(conv, 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(page0) % 64, 0u);
    for (int b = 0; b < blocks; ++b) {
      // Block b of both views lies in page b: conv first, then ssm, no overlap, nothing past the page.
      const int64_t c = bytes(conv, b) - page0, s = bytes(ssm, b) - page0;
      EXPECT_EQ(c, b * cache.page_bytes());
      EXPECT_GE(s, c + conv_bytes);
      EXPECT_LE(s + ssm_bytes, (b + 1) * cache.page_bytes());
      EXPECT_EQ(s % static_cast<int64_t>(dtype_size(dt.ssm)), 0);
    }
  }
}

TEST_P(StateCacheLayout, ZeroBlockZeroesExactlyOneBlockInEveryLayer) {
  const auto [shape, dt] = GetParam();
  const int layers = 2, blocks = 4;
  StateCache cache(layers, shape, blocks, dt);
  // Starts all zero.
  for (int l = 0; l < layers; ++l)
    for (int b = 0; b < blocks; ++b) {
      for (float v : state_to_f32(cache.conv_state(l), b, shape.conv_elems)) ASSERT_EQ(v, 0.0f);
      for (float v : state_to_f32(cache.ssm_state(l), b, shape.ssm_elems)) ASSERT_EQ(v, 0.0f);
    }
  // Fill every element of every block with a value naming (layer, block, state); round trips exactly in bf16/fp16.
  auto value = [](int l, int b, int which) { return static_cast<float>(1 + l * 16 + b * 2 + which); };
  for (int l = 0; l < layers; ++l)
    for (int b = 0; b < blocks; ++b) {
      const std::vector<float> c(shape.conv_elems, value(l, b, 0)), s(shape.ssm_elems, value(l, b, 1));
      state_from_f32(cache.conv_state(l), b, c.data(), shape.conv_elems);
      state_from_f32(cache.ssm_state(l), b, s.data(), shape.ssm_elems);
    }
  cache.zero_block(2);
  for (int l = 0; l < layers; ++l)
    for (int b = 0; b < blocks; ++b) {
      const float ec = b == 2 ? 0.0f : value(l, b, 0), es = b == 2 ? 0.0f : value(l, b, 1);
      for (float v : state_to_f32(cache.conv_state(l), b, shape.conv_elems)) ASSERT_EQ(v, ec) << "layer " << l << " block " << b;
      for (float v : state_to_f32(cache.ssm_state(l), b, shape.ssm_elems)) ASSERT_EQ(v, es) << "layer " << l << " block " << b;
    }
  EXPECT_THROW(cache.zero_block(blocks), Error);
  EXPECT_THROW(cache.zero_block(-1), Error);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, StateCacheLayout,
    ::testing::Values(LayoutCase{{3 * 1536, 1536 * 16}, {}},                         // mamba-130m, fp32 / fp32
                      LayoutCase{{3 * 1536, 1536 * 16}, {DType::F32, DType::BF16}},  // bf16 ssm state
                      LayoutCase{{3 * 1536, 1536 * 16}, {DType::F32, DType::F16}},
                      LayoutCase{{3 * 7, 7 * 5}, {DType::BF16, DType::F32}},  // odd sizes: bf16 conv before fp32 ssm
                      LayoutCase{{3 * 7, 7 * 5}, {DType::F16, DType::BF16}},
                      LayoutCase{{0, 13}, {}}));  // no conv (d_conv = 1)

TEST(StateCache, BytesPerBlockOfMamba130m) {
  // 24 layers x (conv 3 x 1536 + ssm 1536 x 16): fp32 = 24 x 116736 bytes; bf16 ssm halves the ssm part.
  EXPECT_EQ(StateCache(24, {3 * 1536, 1536 * 16}, 2).bytes_per_block(), 24 * (3 * 1536 + 1536 * 16) * 4);
  EXPECT_EQ(StateCache(24, {3 * 1536, 1536 * 16}, 2, {DType::F32, DType::BF16}).bytes_per_block(),
            24 * (3 * 1536 * 4 + 1536 * 16 * 2));
}

TEST(StateCache, RejectsBadSizes) {
  EXPECT_THROW(StateCache(1, {4, 4}, 1), Error);  // only the null block
  EXPECT_THROW(StateCache(1, {-1, 4}, 2), Error);
  StateCache c(2, {4, 4}, 2);
  EXPECT_THROW(c.conv_state(2), Error);
  EXPECT_THROW(c.ssm_state(-1), Error);
}

TEST(StateDtypes, DefaultsAndAuto) {
  const StateDtypes def;
  EXPECT_EQ(def.conv, DType::F32);
  EXPECT_EQ(def.ssm, DType::F32);
  const StateDtypes engine_default = StateDtypes::from_options("auto", "float32");
  EXPECT_EQ(engine_default.conv, kCpuActivationDType);
  EXPECT_EQ(engine_default.ssm, DType::F32);
  EXPECT_EQ(StateDtypes::from_options("auto", "bfloat16").ssm, DType::BF16);
  EXPECT_EQ(StateDtypes::from_options("float32", "float16").ssm, DType::F16);
  const StateDtypes all_bf16 = StateDtypes::from_options("bfloat16", "auto");  // ssm auto = conv dtype (vLLM)
  EXPECT_EQ(all_bf16.conv, DType::BF16);
  EXPECT_EQ(all_bf16.ssm, DType::BF16);
}

TEST(StateDtypes, RejectsBadStringsNamingTheFlag) {
  auto message = [](const char* conv, const char* ssm) {
    try {
      StateDtypes::from_options(conv, ssm);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("fp8", "float32").find("--mamba-cache-dtype"), std::string::npos);
  EXPECT_NE(message("auto", "bf16").find("--mamba-ssm-cache-dtype"), std::string::npos);
  EXPECT_NE(message("auto", "bf16").find("\"bf16\""), std::string::npos);
  EXPECT_NE(message("auto", "").find("--mamba-ssm-cache-dtype"), std::string::npos);
  EXPECT_NE(message("Float32", "float32").find("--mamba-cache-dtype"), std::string::npos);
}

TEST(StateDtypes, F16StoreRoundsToNearestEven) {
  // Every finite half value round-trips exactly; NaN stays NaN.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) ASSERT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f)))) << h;
    else ASSERT_EQ(f32_to_f16(f), h) << h;
  }
  // Halfway cases go to the even neighbour: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  // Subnormals (unit 2^-24): 2.5 units -> 2, 3.5 units -> 4, half a unit -> 0.
  EXPECT_EQ(f32_to_f16(2.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_EQ(f32_to_f16(3.5f * std::ldexp(1.0f, -24)), 0x0004);
  EXPECT_EQ(f32_to_f16(0.5f * std::ldexp(1.0f, -24)), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  // Overflow: 65504 is the largest half; 65519 rounds down to it, 65520 (halfway) rounds to inf.
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
}

}  // namespace
}  // namespace ssmserve
