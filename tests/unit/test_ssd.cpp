// Tests of the Mamba-2 SSD kernels (kernels/cpu/ssd.h) against a plain per-token recurrence oracle in double
// precision (kept here, not in src): chunked prefill == recurrence (outputs, final states, every chunk-boundary
// state) over lengths around chunk_size, with and without initial states, n_groups 1 and > 1; packed batches that
// start mid-chunk == single-sequence runs; decode update == recurrence with null rows and unreferenced blocks
// untouched; prefill of n tokens == n decode updates; time_step_limit clamping; bf16 / fp16 state pools; bad
// metadata rejected. Error metric: max |a - b| / max |b| over a tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cpu/ssd.h"
#include "model/batch_metadata.h"

namespace ssmserve::cpu {
namespace {

// fp32 kernels vs the double oracle / each other. Measured worst case ~5e-7; 2e-6 still catches computing the
// decay as exp(cum_t - cum_s) (cancellation in fp32 cumsums gave 6.6e-6 at chunk_size 256 with |A| up to 16).
constexpr double kTol = 2e-6;

double max_rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num = std::max(num, std::abs(a[i] - b[i])), den = std::max(den, std::abs(b[i]));
  return num / std::max(den, 1e-30);
}
double max_rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  return max_rel_err(a, std::vector<double>(b.begin(), b.end()));
}

/// Worst errors seen, printed at the end of the suite for the report.
struct Worst {
  double y = 0, state = 0, chunk_state = 0, decode_y = 0, decode_state = 0, prefill_vs_decode = 0, packed = 0;
  ~Worst() {
    fmt::print("max rel err: chunked y {:.2e}, final state {:.2e}, chunk-boundary states {:.2e}; decode y {:.2e}, "
               "state {:.2e}; prefill vs decodes {:.2e}; packed vs single {:.2e}\n",
               y, state, chunk_state, decode_y, decode_state, prefill_vs_decode, packed);
  }
} g_worst;
void note(double& slot, double e) { slot = std::max(slot, e); }

/// Layer sizes and random parameters with realistic magnitudes (A_log ~ log U(1, 16), dt_bias small).
struct Layer {
  int H, P, G, N;
  std::vector<float> A, D, dt_bias;
  float tmin = 0.0f, tmax = std::numeric_limits<float>::infinity();
  Layer(int H_, int P_, int G_, int N_, std::mt19937& rng) : H(H_), P(P_), G(G_), N(N_) {
    std::uniform_real_distribution<float> u(1.0f, 16.0f);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (int h = 0; h < H; ++h) {
      A.push_back(-std::exp(std::log(u(rng))));
      D.push_back(n01(rng));
      dt_bias.push_back(0.5f * n01(rng));
    }
  }
  int64_t state_size() const { return int64_t{H} * P * N; }
};

/// Packed per-token inputs: x, B, C as slices of one xBC row (stride H*P + 2GN + 3), dt rows with stride H + 1.
struct Tokens {
  int64_t T = 0, xbc_stride = 0, dt_stride = 0, xw = 0, gw = 0;
  std::vector<float> xbc, dt;
  Tokens(const Layer& l, int64_t T_, std::mt19937& rng) : T(T_) {
    xw = int64_t{l.H} * l.P, gw = int64_t{l.G} * l.N;
    xbc_stride = xw + 2 * gw + 3, dt_stride = l.H + 1;
    std::normal_distribution<float> n01(0.0f, 1.0f), ndt(-2.0f, 1.0f);
    xbc.resize(T * xbc_stride), dt.resize(T * dt_stride);
    for (auto& v : xbc) v = n01(rng);
    for (auto& v : dt) v = ndt(rng);
  }
  SsdInputs view(int64_t row0 = 0) const {
    const float* base = xbc.data() + row0 * xbc_stride;
    return {{base, xbc_stride}, {dt.data() + row0 * dt_stride, dt_stride}, {base + xw, xbc_stride}, {base + xw + gw, xbc_stride}};
  }
  float x(int64_t t, int h, int p, int P) const { return xbc[t * xbc_stride + int64_t{h} * P + p]; }
  float B(int64_t t, int g, int n, int N) const { return xbc[t * xbc_stride + xw + int64_t{g} * N + n]; }
  float C(int64_t t, int g, int n, int N) const { return xbc[t * xbc_stride + xw + gw + int64_t{g} * N + n]; }
};

/// The oracle: the per-token recurrence in double over tokens [t0, t1) of `tok`, updating S [H, P, N] and writing
/// y rows [t0, t1) of y [T, H*P].
void recurrence(const Layer& l, const Tokens& tok, int64_t t0, int64_t t1, std::vector<double>& S, std::vector<double>& y) {
  y.resize(tok.T * tok.xw);
  const int hpg = l.H / l.G;
  for (int64_t t = t0; t < t1; ++t)
    for (int h = 0; h < l.H; ++h) {
      const int g = h / hpg;
      double dt = double(tok.dt[t * tok.dt_stride + h]) + l.dt_bias[h];
      dt = dt <= 20.0 ? std::log1p(std::exp(dt)) : dt;
      dt = std::clamp(dt, double(l.tmin), double(l.tmax));
      const double dA = std::exp(dt * l.A[h]);
      for (int p = 0; p < l.P; ++p) {
        double* s = S.data() + (int64_t{h} * l.P + p) * l.N;
        const double xp = tok.x(t, h, p, l.P);
        double acc = 0;
        for (int n = 0; n < l.N; ++n) {
          s[n] = dA * s[n] + dt * xp * tok.B(t, g, n, l.N);
          acc += s[n] * tok.C(t, g, n, l.N);
        }
        y[t * tok.xw + int64_t{h} * l.P + p] = acc + double(l.D[h]) * xp;
      }
    }
}

/// A state pool [num_blocks, H, P, N] in `dtype` with a padded block stride, filled with random values.
struct Pool {
  DType dtype;
  int64_t stride, num_blocks;
  std::vector<uint8_t> bytes;
  Pool(const Layer& l, int64_t nb, DType dt, std::mt19937& rng) : dtype(dt), stride(l.state_size() + 5), num_blocks(nb) {
    bytes.resize(size_t(nb * stride) * dtype_size(dt));
    std::vector<float> r(size_t(nb * stride));
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (auto& v : r) v = n01(rng);
    for (int64_t b = 0; b < nb; ++b) state_from_f32(view(), b, r.data() + b * stride, stride);
  }
  StateView view() const { return {const_cast<uint8_t*>(bytes.data()), dtype, stride}; }
  std::vector<float> get(int64_t b, int64_t n) const { return state_to_f32(view(), b, n); }
  std::vector<double> get_d(int64_t b, int64_t n) const {
    auto f = get(b, n);
    return {f.begin(), f.end()};
  }
  void set(int64_t b, const std::vector<float>& v) { state_from_f32(view(), b, v.data(), int64_t(v.size())); }
  std::vector<uint8_t> block_bytes(int64_t b) const {
    const size_t es = dtype_size(dtype);
    return {bytes.begin() + b * stride * es, bytes.begin() + (b + 1) * stride * es};
  }
};

SsdParams params(const Layer& l, const Pool& pool) {
  SsdParams p;
  p.num_heads = l.H, p.head_dim = l.P, p.n_groups = l.G, p.d_state = l.N;
  p.A = l.A.data(), p.D = l.D.data(), p.dt_bias = l.dt_bias.data();
  p.time_step_min = l.tmin, p.time_step_max = l.tmax;
  p.ssm_states = pool.view();
  return p;
}

SsdChunkMetadata chunk_meta(const MambaBatchMetadata& m) {
  return {m.chunk_size, m.query_start_loc_p, m.cu_chunk_seqlen_p, m.seq_idx_p, m.last_chunk_indices_p,
          m.state_indices_tensor_p, m.has_initial_states_p};
}

struct PrefillOut {
  std::vector<float> y, chunk_states;
  MambaBatchMetadata meta;
};
/// Runs ssd_chunk_scan_fwd over the prefill rows `seqs` (all prefilling) on tokens starting at row0 of `tok`.
PrefillOut run_prefill(const Layer& l, const Tokens& tok, int64_t row0, std::vector<ScheduledSeq> seqs, Pool& pool,
                       int chunk_size) {
  PrefillOut o;
  o.meta = build_mamba_metadata(seqs, MetadataOptions{.chunk_size = chunk_size});
  const int64_t T = o.meta.num_prefill_tokens;
  o.y.assign(size_t(T * tok.xw), std::nanf(""));
  o.chunk_states.assign(size_t(o.meta.num_chunks() * l.state_size()), std::nanf(""));
  ssd_chunk_scan_fwd(tok.view(row0), params(l, pool), chunk_meta(o.meta), o.y.data(), tok.xw, o.chunk_states.data());
  return o;
}

/// Checks a single-sequence prefill of `len` tokens (after `computed` tokens: initial state iff computed > 0)
/// against the oracle: y, the final state and the state at every chunk end.
void check_single(const Layer& l, int len, int computed, int chunk_size, std::mt19937& rng) {
  SCOPED_TRACE(fmt::format("H {} G {} len {} computed {}", l.H, l.G, len, computed));
  Tokens tok(l, len, rng);
  Pool pool(l, 3, DType::F32, rng);
  std::vector<double> S = computed > 0 ? pool.get_d(2, l.state_size()) : std::vector<double>(l.state_size(), 0.0);
  auto o = run_prefill(l, tok, 0, {{2, computed, len, true}}, pool, chunk_size);
  std::vector<double> y_ref;
  double chunk_err = 0;
  for (int c = 0; c < o.meta.num_chunks(); ++c) {
    recurrence(l, tok, o.meta.cu_chunk_seqlen_p[c], o.meta.cu_chunk_seqlen_p[c + 1], S, y_ref);
    std::vector<float> got(o.chunk_states.begin() + c * l.state_size(), o.chunk_states.begin() + (c + 1) * l.state_size());
    chunk_err = std::max(chunk_err, max_rel_err(got, S));
  }
  const double ey = max_rel_err(o.y, y_ref), es = max_rel_err(pool.get(2, l.state_size()), S);
  note(g_worst.y, ey), note(g_worst.state, es), note(g_worst.chunk_state, chunk_err);
  EXPECT_LT(ey, kTol);
  EXPECT_LT(es, kTol);
  EXPECT_LT(chunk_err, kTol);
}

TEST(Ssd, ChunkedScanEqualsRecurrence) {
  std::mt19937 rng(1);
  for (auto [H, G] : {std::pair{4, 1}, std::pair{8, 2}}) {
    Layer l(H, 16, G, 32, rng);
    for (int len : {1, 2, 3, 63, 64, 65, 127, 128, 129, 700})
      for (int computed : {0, 128}) check_single(l, len, computed, 64, rng);
  }
}

TEST(Ssd, ChunkedScanModelShapes) {  // Mamba-2 130M-like head: P 64, N 128; chunk_size 256; mid-chunk start
  std::mt19937 rng(2);
  Layer l(4, 64, 1, 128, rng);
  check_single(l, 600, 0, 256, rng);
  check_single(l, 300, 77, 256, rng);
  Layer l8(8, 64, 8, 64, rng);  // one head per group
  check_single(l8, 200, 0, 64, rng);
  Layer slow(4, 16, 2, 32, rng);  // long memory: |A| << 1, so whole chunks and states carry across (no flushing)
  for (int h = 0; h < slow.H; ++h) slow.A[h] = -0.002f * float(h + 1);
  check_single(slow, 700, 0, 256, rng);
  check_single(slow, 700, 300, 64, rng);
}

TEST(Ssd, PackedMidChunkEqualsSingleRuns) {
  std::mt19937 rng(3);
  Layer l(8, 16, 2, 32, rng);
  const int cs = 64;
  const std::vector<ScheduledSeq> seqs = {{1, 0, 37, true}, {2, 100, 300, true}, {3, 0, 5, true}};
  Tokens tok(l, 342, rng);
  Pool packed(l, 4, DType::F32, rng), single = packed;
  auto o = run_prefill(l, tok, 0, seqs, packed, cs);
  ASSERT_EQ(o.meta.cu_chunk_seqlen_p[2] - o.meta.cu_chunk_seqlen_p[1], 28);  // 100 -> 128 finishes the chunk
  ASSERT_EQ(o.meta.has_initial_states_p, (std::vector<uint8_t>{0, 1, 0}));
  int64_t row0 = 0;
  for (const auto& s : seqs) {
    SCOPED_TRACE(fmt::format("seq block {}", s.state_block));
    std::vector<double> S = s.num_computed_tokens ? single.get_d(s.state_block, l.state_size())
                                                  : std::vector<double>(l.state_size(), 0.0);
    auto one = run_prefill(l, tok, row0, {s}, single, cs);
    std::vector<float> y_packed(o.y.begin() + row0 * tok.xw, o.y.begin() + (row0 + s.num_scheduled_tokens) * tok.xw);
    const double e = std::max(max_rel_err(y_packed, one.y),
                              max_rel_err(packed.get(s.state_block, l.state_size()), single.get(s.state_block, l.state_size())));
    note(g_worst.packed, e);
    EXPECT_LT(e, 1e-6);
    // And both equal the oracle, including the state at each of this sequence's chunk ends.
    std::vector<double> y_ref;
    int first = s.state_block == 1 ? 0 : o.meta.last_chunk_indices_p[s.state_block - 2] + 1;
    for (int c = first; c <= o.meta.last_chunk_indices_p[s.state_block - 1]; ++c) {
      recurrence(l, tok, o.meta.cu_chunk_seqlen_p[c], o.meta.cu_chunk_seqlen_p[c + 1], S, y_ref);
      std::vector<float> got(o.chunk_states.begin() + c * l.state_size(), o.chunk_states.begin() + (c + 1) * l.state_size());
      EXPECT_LT(max_rel_err(got, S), kTol) << "chunk " << c;
    }
    std::vector<double> y_ref_seq(y_ref.begin() + row0 * tok.xw, y_ref.begin() + (row0 + s.num_scheduled_tokens) * tok.xw);
    EXPECT_LT(max_rel_err(y_packed, y_ref_seq), kTol);
    EXPECT_LT(max_rel_err(packed.get(s.state_block, l.state_size()), S), kTol);
    row0 += s.num_scheduled_tokens;
  }
}

TEST(Ssd, NullBlockPrefillRowSkipped) {
  std::mt19937 rng(4);
  Layer l(4, 8, 2, 16, rng);
  Tokens tok(l, 90, rng);
  Pool pool(l, 3, DType::F32, rng), ref = pool;
  auto meta = build_mamba_metadata(std::vector<ScheduledSeq>{{1, 0, 40, true}, {2, 3, 50, true}}, {.chunk_size = 16});
  meta.state_indices_tensor_p[1] = 0;  // second sequence -> null block: nothing read or written
  std::vector<float> y(90 * tok.xw, -7.0f);
  ssd_chunk_scan_fwd(tok.view(), params(l, pool), chunk_meta(meta), y.data(), tok.xw);
  for (int64_t i = 40 * tok.xw; i < 90 * tok.xw; ++i) ASSERT_EQ(y[i], -7.0f);
  EXPECT_EQ(pool.block_bytes(0), ref.block_bytes(0));
  EXPECT_EQ(pool.block_bytes(2), ref.block_bytes(2));
  std::vector<double> S(l.state_size(), 0.0), y_ref;
  recurrence(l, tok, 0, 40, S, y_ref);
  EXPECT_LT(max_rel_err(pool.get(1, l.state_size()), S), kTol);
}

/// Decode batches of rows -> blocks {3, 0, 1, 5, 0, 2} for several steps; blocks 0, 4, 6 never touched.
TEST(Ssd, DecodeUpdateEqualsRecurrence) {
  std::mt19937 rng(5);
  Layer l(8, 16, 2, 32, rng);
  const std::vector<int32_t> rows = {3, 0, 1, 5, 0, 2};
  Pool pool(l, 7, DType::F32, rng), before = pool;
  std::vector<std::vector<double>> S(7);
  for (int b = 1; b < 7; ++b) S[b] = pool.get_d(b, l.state_size());
  for (int step = 0; step < 20; ++step) {
    Tokens tok(l, int64_t(rows.size()), rng);
    std::vector<float> y(rows.size() * tok.xw, -7.0f);
    ssd_state_update(tok.view(), params(l, pool), y.data(), tok.xw, rows);
    for (size_t r = 0; r < rows.size(); ++r) {
      std::vector<float> yr(y.begin() + r * tok.xw, y.begin() + (r + 1) * tok.xw);
      if (rows[r] == 0) {
        for (float v : yr) ASSERT_EQ(v, -7.0f);
        continue;
      }
      std::vector<double> y_ref;
      recurrence(l, tok, int64_t(r), int64_t(r) + 1, S[rows[r]], y_ref);
      std::vector<double> yr_ref(y_ref.begin() + r * tok.xw, y_ref.begin() + (r + 1) * tok.xw);
      const double ey = max_rel_err(yr, yr_ref), es = max_rel_err(pool.get(rows[r], l.state_size()), S[rows[r]]);
      note(g_worst.decode_y, ey), note(g_worst.decode_state, es);
      EXPECT_LT(ey, kTol);
      EXPECT_LT(es, kTol);
    }
  }
  for (int b : {0, 4, 6}) EXPECT_EQ(pool.block_bytes(b), before.block_bytes(b)) << "block " << b;
}

/// Prefill of n tokens == n decode updates (outputs and final state), from a non-zero initial state.
TEST(Ssd, PrefillEqualsDecodeUpdates) {
  std::mt19937 rng(6);
  Layer l(8, 16, 2, 32, rng);
  for (int n : {1, 65, 200}) {
    SCOPED_TRACE(n);
    Tokens tok(l, n, rng);
    Pool pre(l, 2, DType::F32, rng), dec = pre;
    auto o = run_prefill(l, tok, 0, {{1, 10, n, true}}, pre, 64);
    std::vector<float> y(n * tok.xw);
    const std::vector<int32_t> row = {1};
    for (int t = 0; t < n; ++t) ssd_state_update(tok.view(t), params(l, dec), y.data() + t * tok.xw, tok.xw, row);
    const double e = std::max(max_rel_err(o.y, y), max_rel_err(pre.get(1, l.state_size()), dec.get(1, l.state_size())));
    note(g_worst.prefill_vs_decode, e);
    EXPECT_LT(e, kTol);
  }
}

TEST(Ssd, TimeStepLimitClamps) {
  std::mt19937 rng(7);
  Layer l(4, 8, 1, 16, rng);
  l.tmin = 0.05f, l.tmax = 0.2f;  // dt ~ softplus(N(-2, 1)) spans both bounds
  check_single(l, 150, 0, 64, rng);
  check_single(l, 150, 64, 64, rng);
  Tokens tok(l, 3, rng);
  Pool pool(l, 4, DType::F32, rng);
  std::vector<std::vector<double>> S(4);
  for (int b = 1; b < 4; ++b) S[b] = pool.get_d(b, l.state_size());
  std::vector<float> y(3 * tok.xw);
  const std::vector<int32_t> rows = {3, 1, 2};
  ssd_state_update(tok.view(), params(l, pool), y.data(), tok.xw, rows);
  std::vector<double> y_ref;
  for (int r = 0; r < 3; ++r) recurrence(l, tok, r, r + 1, S[rows[r]], y_ref);
  EXPECT_LT(max_rel_err(y, y_ref), kTol);
}

/// bf16 / fp16 pools: the initial state is widened exactly and the final state rounded once per prefill, so y
/// keeps fp32 accuracy and the state is within one rounding (bf16 2^-9, fp16 2^-12 relative, taken per element
/// relative to the largest); decode rounds once per token.
TEST(Ssd, HalfPrecisionStatePools) {
  std::mt19937 rng(8);
  Layer l(8, 16, 2, 32, rng);
  for (auto [dt, tol_state, tol_dec] : {std::tuple{DType::BF16, 4e-3, 3e-2}, std::tuple{DType::F16, 5e-4, 4e-3}}) {
    SCOPED_TRACE(dtype_name(dt));
    Tokens tok(l, 150, rng);
    Pool pool(l, 2, dt, rng);
    std::vector<double> S = pool.get_d(1, l.state_size()), y_ref;
    auto o = run_prefill(l, tok, 0, {{1, 30, 150, true}}, pool, 64);
    recurrence(l, tok, 0, 150, S, y_ref);
    EXPECT_LT(max_rel_err(o.y, y_ref), kTol);
    EXPECT_LT(max_rel_err(pool.get(1, l.state_size()), S), tol_state);
    // 50 decode steps continuing the same state.
    Tokens dtok(l, 50, rng);
    std::vector<float> y(50 * dtok.xw);
    const std::vector<int32_t> row = {1};
    for (int t = 0; t < 50; ++t) ssd_state_update(dtok.view(t), params(l, pool), y.data() + t * dtok.xw, dtok.xw, row);
    recurrence(l, dtok, 0, 50, S, y_ref);
    y_ref.resize(50 * dtok.xw);
    EXPECT_LT(max_rel_err(y, y_ref), tol_dec);
    EXPECT_LT(max_rel_err(pool.get(1, l.state_size()), S), tol_dec);
  }
}

TEST(Ssd, RejectsBadInput) {
  std::mt19937 rng(9);
  Layer l(4, 8, 2, 16, rng);
  Tokens tok(l, 40, rng);
  Pool pool(l, 2, DType::F32, rng);
  auto meta = build_mamba_metadata(std::vector<ScheduledSeq>{{1, 0, 40, true}}, {.chunk_size = 32});
  std::vector<float> y(40 * tok.xw);
  auto m = chunk_meta(meta);
  m.chunk_size = 16;  // chunks of 32 exceed it
  EXPECT_THROW(ssd_chunk_scan_fwd(tok.view(), params(l, pool), m, y.data(), tok.xw), Error);
  m = chunk_meta(meta);
  m.last_chunk_indices = {};
  EXPECT_THROW(ssd_chunk_scan_fwd(tok.view(), params(l, pool), m, y.data(), tok.xw), Error);
  auto p = params(l, pool);
  p.n_groups = 3;  // 4 heads don't split into 3 groups
  EXPECT_THROW(ssd_chunk_scan_fwd(tok.view(), p, chunk_meta(meta), y.data(), tok.xw), Error);
  const std::vector<int32_t> row = {1};
  EXPECT_THROW(ssd_state_update(tok.view(), p, y.data(), tok.xw, row), Error);
  l.A[1] = 0.5f;  // a growing state: A must be -exp(A_log) <= 0
  EXPECT_THROW(ssd_chunk_scan_fwd(tok.view(), params(l, pool), chunk_meta(meta), y.data(), tok.xw), Error);
}

}  // namespace
}  // namespace ssmserve::cpu

