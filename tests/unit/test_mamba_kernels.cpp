// CPU kernel tests for the Mamba-1 ops: the varlen prefill forms (causal_conv1d_fwd, selective_scan_fwd) equal
// token-by-token decode updates (outputs and final states) from zero and non-zero initial states; packed
// batches equal single-sequence runs; null-block rows are skipped; all of it for fp32, bf16 and fp16 states (fp32:
// bit-exact; bf16/fp16: the tolerances of DtypeCase); linear's GEMV and GEMM paths equal a
// naive double-precision product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "cache/state_cache.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/selective_scan.h"

namespace ssmserve::cpu {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num = std::max(num, std::abs(double(a[i]) - b[i])), den = std::max(den, std::abs(double(b[i])));
  return num / std::max(den, 1e-30);
}

/// State dtypes of a kernel case and the tolerances that go with them: the math is fp32 either way; a bf16 /
/// fp16 state is rounded (to nearest even) each time it is stored, i.e. once per prefill chunk but once per token
/// on the decode path, so prefill and decode only agree to a few roundings of the state (bf16: 8 significant
/// bits, half-ulp 2^-9 = 2.0e-3 relative; fp16: 11 bits, 2.4e-4). Measured worst case over the lengths below
/// (n <= 300, zero and random initial states), as max relative error of y / ssm state:
///   conv F32  ssm BF16: 9.9e-4 / 5.8e-3     conv BF16 ssm BF16: 2.5e-3 / 5.7e-3
///   conv F32  ssm F16:  1.7e-4 / 4.3e-4     conv F16  ssm F16:  3.1e-4 / 7.2e-4
/// and the tolerances are those times ~3. The final conv window is the last width-1 inputs rounded once on both
/// paths, so it agrees exactly in every dtype. fp32 states: prefill and decode run the same fp32 operations in
/// the same order (std::fma conv taps, ChannelBlock::advance), so they agree bit for bit.
struct DtypeCase {
  DType conv, ssm;
  double tol_y, tol_conv, tol_ssm;  // max relative error (max |a-b| / max |b|) of y, conv states, ssm states
};
const DtypeCase kF32{DType::F32, DType::F32, 0, 0, 0};
const DtypeCase kDtypeCases[] = {
    kF32,
    {DType::F32, DType::BF16, 3e-3, 0, 2e-2},
    {DType::F32, DType::F16, 5e-4, 0, 1.5e-3},
    {DType::BF16, DType::BF16, 8e-3, 0, 2e-2},
    {DType::F16, DType::F16, 1e-3, 0, 2e-3},
};
std::string dtype_case_name(const DtypeCase& d) {
  return fmt::format("conv{}_ssm{}", dtype_name(d.conv), dtype_name(d.ssm));
}

/// One layer's worth of random Mamba-1 mixer inputs for T tokens, with its states in a one-layer StateCache
/// (so the kernels run on the real page layout: conv and ssm of a block interleaved, block stride = page).
struct MixerCase {
  int64_t dim = 48;
  int d_state = 16, width = 4;
  int num_blocks = 4;
  std::vector<float> conv_w, conv_b, A, D, dt_bias;
  std::vector<float> x, delta, B, C, z;  // x: [T, dim] pre-conv input; delta: [T, dim]; B, C: [T, N]; z: [T, dim]
  StateCache cache;

  MixerCase(int64_t T, uint32_t seed, DtypeCase dt = kF32)
      : cache(1, {(width - 1) * dim, dim * d_state}, num_blocks, {dt.conv, dt.ssm}) {
    std::mt19937 rng(seed);
    conv_w = randn(dim * width, rng, 0.5f), conv_b = randn(dim, rng, 0.1f), D = randn(dim, rng), dt_bias = randn(dim, rng, 0.5f);
    A.resize(dim * d_state);
    for (int64_t c = 0; c < dim; ++c)
      for (int n = 0; n < d_state; ++n) A[c * d_state + n] = -std::exp(std::log(n + 1.0f) + 0.1f * (c % 3));
    x = randn(T * dim, rng), delta = randn(T * dim, rng), B = randn(T * d_state, rng), C = randn(T * d_state, rng), z = randn(T * dim, rng);
    const auto cs = randn(num_blocks * (width - 1) * dim, rng), ss = randn(num_blocks * dim * d_state, rng);
    set_states(cs, ss);
  }
  int64_t conv_elems() const { return (width - 1) * dim; }
  int64_t ssm_elems() const { return dim * d_state; }
  /// Overwrites every block's states: conv [num_blocks, width-1, dim], ssm [num_blocks, dim, d_state] (fp32).
  void set_states(const std::vector<float>& conv, const std::vector<float>& ssm) {
    for (int b = 0; b < num_blocks; ++b) {
      state_from_f32(cache.conv_state(0), b, conv.data() + b * conv_elems(), conv_elems());
      state_from_f32(cache.ssm_state(0), b, ssm.data() + b * ssm_elems(), ssm_elems());
    }
  }
  /// Every block's states as fp32: [num_blocks, width-1, dim] and [num_blocks, dim, d_state].
  std::vector<float> conv_states() const { return all_blocks(cache.conv_state(0), conv_elems()); }
  std::vector<float> ssm_states() const { return all_blocks(cache.ssm_state(0), ssm_elems()); }
  ConvParams conv() { return {dim, width, conv_w.data(), conv_b.data(), cache.conv_state(0), true}; }
  ScanParams scan() { return {dim, d_state, A.data(), D.data(), dt_bias.data(), true, cache.ssm_state(0)}; }

 private:
  std::vector<float> all_blocks(const StateView& v, int64_t n) const {
    std::vector<float> out;
    for (int b = 0; b < num_blocks; ++b) {
      const auto blk = state_to_f32(v, b, n);
      out.insert(out.end(), blk.begin(), blk.end());
    }
    return out;
  }
};

// Runs conv + scan over tokens [t0, t1) of `mc` as one prefill (seq in block `block`).
std::vector<float> run_prefill(MixerCase& mc, int64_t t0, int64_t t1, int block, bool init) {
  const int64_t L = t1 - t0, D = mc.dim, N = mc.d_state;
  std::vector<float> xc(L * D), y(L * D);
  std::vector<int32_t> qsl{0, static_cast<int32_t>(L)}, idx{block};
  std::vector<uint8_t> has{static_cast<uint8_t>(init)};
  causal_conv1d_fwd(mc.x.data() + t0 * D, D, xc.data(), D, mc.conv(), qsl, idx, has);
  ScanInputs in{{xc.data(), D}, {mc.delta.data() + t0 * D, D}, {mc.B.data() + t0 * N, N}, {mc.C.data() + t0 * N, N}, {mc.z.data() + t0 * D, D}};
  selective_scan_fwd(in, mc.scan(), y.data(), D, qsl, idx, has);
  return y;
}

// Runs the same tokens one decode update at a time.
std::vector<float> run_decodes(MixerCase& mc, int64_t t0, int64_t t1, int block) {
  const int64_t D = mc.dim, N = mc.d_state;
  std::vector<float> y((t1 - t0) * D), xc(D);
  std::vector<int32_t> idx{block};
  for (int64_t t = t0; t < t1; ++t) {
    causal_conv1d_update(mc.x.data() + t * D, D, xc.data(), D, mc.conv(), idx);
    ScanInputs in{{xc.data(), D}, {mc.delta.data() + t * D, D}, {mc.B.data() + t * N, N}, {mc.C.data() + t * N, N}, {mc.z.data() + t * D, D}};
    selective_state_update(in, mc.scan(), y.data() + (t - t0) * D, D, idx);
  }
  return y;
}

class PrefillVsDecode : public ::testing::TestWithParam<std::tuple<int, bool, DtypeCase>> {};

TEST_P(PrefillVsDecode, OutputsAndStatesAgree) {
  const auto [n, init, dt] = GetParam();
  MixerCase a(n, 7, dt), b(n, 7, dt);
  if (!init) {  // decode always reads the state: start both from zeros
    const std::vector<float> zc(a.conv_states().size(), 0.0f), zs(a.ssm_states().size(), 0.0f);
    a.set_states(zc, zs), b.set_states(zc, zs);
  }
  const auto y_prefill = run_prefill(a, 0, n, 2, init);
  const auto y_decode = run_decodes(b, 0, n, 2);
  const double ey = max_rel_err(y_prefill, y_decode), ec = max_rel_err(a.conv_states(), b.conv_states()),
               es = max_rel_err(a.ssm_states(), b.ssm_states());
  EXPECT_LE(ey, dt.tol_y);
  EXPECT_LE(ec, dt.tol_conv);
  EXPECT_LE(es, dt.tol_ssm);
  if (dt.ssm != DType::F32) RecordProperty("max_rel_err_y_conv_ssm", fmt::format("{:.3g} {:.3g} {:.3g}", ey, ec, es));
}

INSTANTIATE_TEST_SUITE_P(Lengths, PrefillVsDecode,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 64, 300), ::testing::Bool(),
                                            ::testing::ValuesIn(kDtypeCases)),
                         [](const auto& info) {
                           return fmt::format("n{}_{}_{}", std::get<0>(info.param), std::get<1>(info.param) ? "init" : "zero",
                                              dtype_case_name(std::get<2>(info.param)));
                         });

TEST(MambaKernels, ChunkedPrefillEqualsOnePrefill) {
  // Splitting a prompt at every point (including inside the conv window) gives the same outputs and states.
  const int n = 23;
  for (int cut : {1, 2, 3, 4, 11, 22}) {
    MixerCase a(n, 3), b(n, 3);
    const auto y_one = run_prefill(a, 0, n, 1, false);
    auto y_two = run_prefill(b, 0, cut, 1, false);
    const auto rest = run_prefill(b, cut, n, 1, true);
    y_two.insert(y_two.end(), rest.begin(), rest.end());
    EXPECT_EQ(y_one, y_two) << "cut " << cut;
    EXPECT_EQ(a.ssm_states(), b.ssm_states()) << "cut " << cut;
    EXPECT_EQ(a.conv_states(), b.conv_states()) << "cut " << cut;
  }
}

class PackedVarlen : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(PackedVarlen, EqualsSingleSequencesAndSkipsNullBlock) {
  // Lengths 37, 300, 5 (the 300-token one resuming from a state) plus a padding row on the null block. Packed and
  // single runs do the same operations and roundings, so they agree exactly in every state dtype.
  const DtypeCase dt = GetParam();
  const std::vector<int> lens{37, 300, 5, 4};
  const std::vector<int32_t> blocks{1, 2, 3, 0};
  const std::vector<uint8_t> init{0, 1, 0, 1};
  int64_t T = 0;
  for (int l : lens) T += l;
  MixerCase packed(T, 11, dt), single(T, 11, dt);
  const int64_t D = packed.dim, N = packed.d_state;
  std::vector<int32_t> qsl{0};
  for (int l : lens) qsl.push_back(qsl.back() + l);
  std::vector<float> xc(T * D), y(T * D, -7.0f);
  causal_conv1d_fwd(packed.x.data(), D, xc.data(), D, packed.conv(), qsl, blocks, init);
  ScanInputs in{{xc.data(), D}, {packed.delta.data(), D}, {packed.B.data(), N}, {packed.C.data(), N}, {packed.z.data(), D}};
  selective_scan_fwd(in, packed.scan(), y.data(), D, qsl, blocks, init);
  for (size_t s = 0; s + 1 < lens.size(); ++s) {
    const auto ys = run_prefill(single, qsl[s], qsl[s + 1], blocks[s], init[s]);
    std::vector<float> yp(y.begin() + qsl[s] * D, y.begin() + qsl[s + 1] * D);
    EXPECT_LT(max_rel_err(yp, ys), 1e-6) << "sequence " << s;
  }
  EXPECT_EQ(packed.ssm_states(), single.ssm_states());
  EXPECT_EQ(packed.conv_states(), single.conv_states());
  for (int64_t i = qsl[3] * D; i < T * D; ++i) ASSERT_EQ(y[i], -7.0f) << "null-block row written";
  MixerCase fresh(T, 11, dt);  // block 0 untouched
  const auto pc = packed.conv_states(), ps = packed.ssm_states(), fc = fresh.conv_states(), fs = fresh.ssm_states();
  for (int64_t i = 0; i < (fresh.width - 1) * D; ++i) ASSERT_EQ(pc[i], fc[i]);
  for (int64_t i = 0; i < D * N; ++i) ASSERT_EQ(ps[i], fs[i]);
}

INSTANTIATE_TEST_SUITE_P(StateDtypes, PackedVarlen, ::testing::ValuesIn(kDtypeCases),
                         [](const auto& info) { return dtype_case_name(info.param); });

TEST(MambaKernels, DecodeBatchSkipsNullRows) {
  MixerCase mc(3, 5);
  const auto before_conv = mc.conv_states();
  const int64_t D = mc.dim, N = mc.d_state;
  std::vector<int32_t> idx{0, 2, 0};
  std::vector<float> xc(3 * D, -3.0f), y(3 * D, -3.0f);
  causal_conv1d_update(mc.x.data(), D, xc.data(), D, mc.conv(), idx);
  ScanInputs in{{xc.data(), D}, {mc.delta.data(), D}, {mc.B.data(), N}, {mc.C.data(), N}, {mc.z.data(), D}};
  selective_state_update(in, mc.scan(), y.data(), D, idx);
  for (int64_t c = 0; c < D; ++c) {
    EXPECT_EQ(y[c], -3.0f);
    EXPECT_EQ(y[2 * D + c], -3.0f);
    EXPECT_NE(y[D + c], -3.0f);
  }
  const auto after_conv = mc.conv_states();
  for (int64_t i = 0; i < (mc.width - 1) * D; ++i) EXPECT_EQ(after_conv[i], before_conv[i]);
}

class LinearTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(LinearTest, MatchesNaiveProduct) {
  const auto [dtype, M] = GetParam();
  const int64_t N = 77, K = 131;
  std::mt19937 rng(1);
  Weight w = Weight::allocate(dtype, N, K);
  auto vals = randn(N * K, rng);
  for (int64_t i = 0; i < N * K; ++i) {
    if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(w.owned->data())[i] = f32_to_bf16(vals[i]);
    else reinterpret_cast<float*>(w.owned->data())[i] = vals[i];
  }
  const auto x = randn(M * K, rng), bias = randn(N, rng);
  std::vector<float> y(M * N);
  linear(x.data(), M, w, bias.data(), y.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = bias[n];
      for (int64_t k = 0; k < K; ++k) ref += double(w.at(n, k)) * x[m * K + k];
      ASSERT_NEAR(y[m * N + n], ref, 1e-4 * (1 + std::abs(ref))) << "m " << m << " n " << n;
    }
}

INSTANTIATE_TEST_SUITE_P(Paths, LinearTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::Values(1, 3, 4, 8, 9, 32, 33, 64)));

// The panel kernel (packed weights): equal to a naive product, and every row bit-identical to computing that row
// alone (M = 1) and to the portable chain fma(w[n][k], x[k], acc) over k in order, for every tile shape and tail.
class PackedLinearTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t>> {};

TEST_P(PackedLinearTest, MatchesNaiveAndIsBatchInvariant) {
  const auto [dtype, N, M] = GetParam();
  const int64_t K = 131;
  std::mt19937 rng(7);
  Weight w = Weight::allocate(dtype, N, K);
  auto vals = randn(N * K, rng);
  for (int64_t i = 0; i < N * K; ++i) {
    if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(w.owned->data())[i] = f32_to_bf16(vals[i]);
    else reinterpret_cast<float*>(w.owned->data())[i] = vals[i];
  }
  pack_for_linear(w);
  pack_for_linear(w);  // idempotent
  const int64_t x_stride = K + 5, y_stride = N + 3;
  const auto x = randn(M * x_stride, rng), bias = randn(N, rng);
  std::vector<float> y(M * y_stride, -1.0f);
  linear(x.data(), M, x_stride, w, bias.data(), y.data(), y_stride);
  std::vector<float> alone(N);
  for (int64_t m = 0; m < M; ++m) {
    linear(x.data() + m * x_stride, 1, x_stride, w, bias.data(), alone.data(), N);
    for (int64_t n = 0; n < N; ++n) {
      float chain = 0.0f;
      double ref = bias[n];
      for (int64_t k = 0; k < K; ++k) {
        chain = std::fma(w.at(n, k), x[m * x_stride + k], chain);
        ref += double(w.at(n, k)) * x[m * x_stride + k];
      }
      ASSERT_EQ(y[m * y_stride + n], chain + bias[n]) << "m " << m << " n " << n;
      ASSERT_EQ(y[m * y_stride + n], alone[n]) << "m " << m << " n " << n;
      ASSERT_NEAR(y[m * y_stride + n], ref, 1e-4 * (1 + std::abs(ref)));
    }
    for (int64_t n = N; n < y_stride; ++n) ASSERT_EQ(y[m * y_stride + n], -1.0f) << "wrote past N";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiles, PackedLinearTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::Values(1, 31, 32, 77, 200),
                                            ::testing::Values(1, 2, 5, 11, 12, 13, 25, 100)));

// pack_for_linear_only: the panels become the only copy (row-major data dropped, owned storage released), every
// row reads back from the panels bit for bit (weight_row_to_f32: the tied embedding's lookup, including the rows
// of a partial last panel), `linear` gives pack_for_linear's bits, and a view of memory the weight does not own
// (a mapped checkpoint, advised out) keeps its bytes.
class PackedOnlyTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t>> {};

TEST_P(PackedOnlyTest, RowsAndProductsBitIdenticalToPacked) {
  const auto [dtype, N, K] = GetParam();
  std::mt19937 rng(11);
  const size_t es = dtype_size(dtype);
  std::vector<std::byte> bytes(static_cast<size_t>(N * K) * es);
  const auto vals = randn(N * K, rng);
  for (int64_t i = 0; i < N * K; ++i) {
    if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_bf16(vals[i]);
    else reinterpret_cast<float*>(bytes.data())[i] = vals[i];
  }
  const std::vector<std::byte> original = bytes;
  Weight view;  // not owned, like a tensor of a mapped checkpoint
  view.dtype = dtype, view.rows = N, view.cols = K, view.data = bytes.data();
  Weight packed = Weight::allocate(dtype, N, K);
  std::memcpy(packed.owned->data(), bytes.data(), bytes.size());
  Weight owned_only = packed;  // shares `owned` until packed
  pack_for_linear(packed);
  const std::weak_ptr<HugeByteBuffer> storage = owned_only.owned;
  pack_for_linear_only(owned_only);
  pack_for_linear_only(view);
  pack_for_linear_only(view);  // idempotent
  for (const Weight* w : {&view, &owned_only}) {
    EXPECT_EQ(w->data, nullptr);
    EXPECT_EQ(w->owned, nullptr);
    ASSERT_NE(w->cpu_panels, nullptr);
  }
  packed.owned.reset(), packed.data = nullptr;  // drop the last other reference: the rows' storage is freed
  EXPECT_TRUE(storage.expired());
  EXPECT_EQ(std::memcmp(bytes.data(), original.data(), bytes.size()), 0) << "the viewed bytes changed";
  std::vector<float> want(K), got(K);
  for (int64_t r = 0; r < N; ++r) {
    to_f32(dtype, original.data() + static_cast<size_t>(r * K) * es, want.data(), K);
    weight_row_to_f32(view, r, got.data());
    ASSERT_EQ(std::memcmp(want.data(), got.data(), K * sizeof(float)), 0) << "row " << r;
    weight_row_to_f32(owned_only, r, got.data());
    ASSERT_EQ(std::memcmp(want.data(), got.data(), K * sizeof(float)), 0) << "row " << r;
  }
  for (const int64_t M : {1, 7}) {
    const auto x = randn(M * K, rng), bias = randn(N, rng);
    std::vector<float> y_packed(M * N), y_only(M * N);
    linear(x.data(), M, packed, bias.data(), y_packed.data());
    linear(x.data(), M, view, bias.data(), y_only.data());
    ASSERT_EQ(std::memcmp(y_packed.data(), y_only.data(), y_only.size() * sizeof(float)), 0) << "M " << M;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PackedOnlyTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::Values(1, 31, 33, 101),
                                            ::testing::Values(1, 40, 131)));

// Weight::round_input_bf16 (the GPU reference mode, ModelConfig::round_gemm_inputs_bf16): `linear` and every
// `linear_part` give, bit for bit, the product of x rounded to bf16 first (row-major and packed weights, strided x,
// x itself unchanged), which differs from the product of x when x has bits below bf16 precision.
class RoundInputTest : public ::testing::TestWithParam<std::tuple<DType, bool, int64_t>> {};

TEST_P(RoundInputTest, EqualsPreRoundedInput) {
  const auto [dtype, packed, M] = GetParam();
  const int64_t N = 45, K = 131, x_stride = K + 3, y_stride = N + 2;
  std::mt19937 rng(13);
  Weight w = Weight::allocate(dtype, N, K);
  const auto vals = randn(N * K, rng);
  for (int64_t i = 0; i < N * K; ++i) {
    if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(w.owned->data())[i] = f32_to_bf16(vals[i]);
    else reinterpret_cast<float*>(w.owned->data())[i] = vals[i];
  }
  if (packed) pack_for_linear(w);
  auto x = randn(M * x_stride, rng);
  for (float& v : x) v *= 1.0f + 1.0f / 1024;  // nudge the mantissas off any bf16 grid
  const std::vector<float> x_before = x;
  std::vector<float> x_rounded(x.size());
  int64_t off_grid = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    x_rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
    off_grid += x_rounded[i] != x[i];
  }
  ASSERT_GT(off_grid, M * K / 2) << "the input must have bits below bf16 precision";
  const auto bias = randn(N, rng);
  Weight wr = w;
  wr.round_input_bf16 = true;
  std::vector<float> y_plain(M * y_stride), y_pre(M * y_stride), y_round(M * y_stride), y_parts(M * y_stride);
  linear(x.data(), M, x_stride, w, bias.data(), y_plain.data(), y_stride);
  linear(x_rounded.data(), M, x_stride, w, bias.data(), y_pre.data(), y_stride);
  linear(x.data(), M, x_stride, wr, bias.data(), y_round.data(), y_stride);
  check_linear_part(wr, x_stride, y_stride);
  for (int part = 0; part < 3; ++part)
    linear_part(x.data(), M, x_stride, wr, bias.data(), y_parts.data(), y_stride, part, 3);
  EXPECT_EQ(x, x_before) << "linear must not change its input";
  int64_t differ = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = m * y_stride + n;
      ASSERT_EQ(y_round[i], y_pre[i]) << "m " << m << " n " << n;
      ASSERT_EQ(y_parts[i], y_pre[i]) << "linear_part, m " << m << " n " << n;
      differ += y_round[i] != y_plain[i];
    }
  EXPECT_GT(differ, M * N / 2) << "rounding the input must change the product";
}

INSTANTIATE_TEST_SUITE_P(Paths, RoundInputTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16), ::testing::Bool(),
                                            ::testing::Values(1, 5, 13)));

}  // namespace
}  // namespace ssmserve::cpu
