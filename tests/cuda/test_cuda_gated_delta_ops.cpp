// GPU op harness of the gated delta rule (Gated DeltaNet, kernels/cuda/gated_delta.h) against the CPU kernels
// (kernels/cpu/gated_delta.h: the fp32 chunked prefill and decode, and the double-precision recurrence), plus the
// fused preparation against its own CPU reference (below). Shapes: the tiny test model (Hk 4, Hv 8, D 32),
// Qwen3.5-9B / 35B-A3B (Hk 16, Hv 32, D 128) and GQA ratios 1, 2, 4 with Dv not a multiple of 64; packed prompts of
// lengths 1..700 with num_computed > 0 (non-zero initial states, chunk boundaries inside the step and on its start),
// null rows, decode batches with padding rows, bf16 states. Fresh random inputs per run (seed printed on failure),
// poisoned outputs. Skips without a GPU (the argument checks run everywhere); SSMSERVE_CUDA_TEST_QUICK=1 keeps the
// small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "cuda_test_util.h"
#include "gated_delta_test_util.h"
#include "sequential_rows.h"
#include "device/cuda_check.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/kernel_tuning.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

using namespace gdntest;

// ---- decode -------------------------------------------------------------------------------------------------------

void check_decode(DType state_dtype, double tol) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<int> batches = quick() ? std::vector<int>{1, 7} : std::vector<int>{1, 7, 64, 256};
  for (const auto& sh : gdn_shapes()) {
    for (int B : batches) {
      SCOPED_TRACE(testing::Message() << sh.name << " batch " << B << " state " << dtype_name(state_dtype));
      GdnLayer L(sh, state_dtype, B + 1, rng);
      // Blocks in shuffled order; rows 2 and 5 are padding (the null block).
      std::vector<int32_t> idx(B);
      std::iota(idx.begin(), idx.end(), 1);
      std::shuffle(idx.begin(), idx.end(), rng);
      for (int r : {2, 5})
        if (r < B) idx[r] = 0;
      std::vector<uint8_t> mask(B);
      for (int r = 0; r < B; ++r) mask[r] = idx[r] != 0;
      DeviceBuffer didx = to_device(idx);
      const int64_t os = int64_t{sh.Hv} * sh.Dv + 4;
      double worst = 0;
      for (int step = 0; step < 3; ++step) {  // three tokens, so errors in the written state show up
        Tokens tk(sh, B, rng);
        std::vector<float> ref(B * os, 0.0f);
        cpu::gated_delta_decode(tk.host(), L.host(), ref.data(), os, idx);
        DeviceBuffer dout = poisoned(B * os);
        SSM_CUDA_CHECK(
            cuda::gated_delta_decode(tk.dev(), L.dev(), dout.as<float>(), os, didx.as<int32_t>(), B, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        auto got = to_host<float>(dout, B * os);
        const double e = rel_err(got.data(), os, ref.data(), os, B, int64_t{sh.Hv} * sh.Dv, &mask);
        worst = std::max(worst, e);
        EXPECT_LT(e, tol) << "outputs, step " << step;
        for (int r = 0; r < B; ++r) {
          if (mask[r]) continue;
          for (int64_t c = 0; c < int64_t{sh.Hv} * sh.Dv; ++c) ASSERT_EQ(got[r * os + c], 0.0f) << "padding row " << r;
        }
      }
      const double se = L.pool.rel_err_blocks(idx);
      EXPECT_LT(se, tol) << "final states";
      EXPECT_TRUE(L.pool.null_block_intact());
      std::printf("[gdn decode] %-16s B=%-4d %s: out rel err %.2e, state rel err %.2e\n", sh.name, B,
                  std::string(dtype_name(state_dtype)).c_str(), worst, se);
    }
  }
}

TEST(CudaGatedDelta, DecodeMatchesCpuWithPaddingRows) {
  REQUIRE_GPU();
  check_decode(DType::F32, 1e-5);
}

TEST(CudaGatedDelta, DecodeBf16StateMatchesCpu) {
  REQUIRE_GPU();
  check_decode(DType::BF16, 1e-3);
}

// ---- prefill ------------------------------------------------------------------------------------------------------


/// Runs the GPU prefill of `st` on L's pool; returns the outputs [T, os].
std::vector<float> gpu_prefill(GdnLayer& L, const Tokens& tk, const Step& st, int64_t os,
                               cuda::GatedDeltaPrecision prec = cuda::GatedDeltaPrecision::kFp32,
                               Algo algo = Algo::kFused) {
  DeviceBuffer dq = to_device(st.qsl), dn = to_device(st.nc), di = to_device(st.idx);
  DeviceBuffer dout = poisoned(std::max<int64_t>(1, st.T() * os));
  if (algo == Algo::kFused) {
    SSM_CUDA_CHECK(cuda::gated_delta_prefill(tk.dev(), L.dev(), dout.as<float>(), os, dq.as<int32_t>(),
                                             dn.as<int32_t>(), di.as<int32_t>(), st.n(), nullptr, prec));
  } else {
    const ScopedGdnWalk walk(algo == Algo::kTwoPass ? 2 : algo == Algo::kTwoPassW64 ? 1 : 0);
    const size_t wsf = cuda::gated_delta_prefill_workspace_floats(st.T(), st.n(), L.dev());
    DeviceBuffer ws = poisoned(std::max<size_t>(4, wsf));
    SSM_CUDA_CHECK(cuda::gated_delta_prefill_two_pass(tk.dev(), L.dev(), dout.as<float>(), os, dq.as<int32_t>(),
                                                      dn.as<int32_t>(), di.as<int32_t>(), st.n(), st.T(),
                                                      ws.as<float>(), nullptr, prec));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());  // before ws goes
  }
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<float>(dout, st.T() * os);
}

void check_prefill(DType state_dtype, cuda::GatedDeltaPrecision prec, double tol, bool with_reference) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Chunk boundaries inside the step and on its start (computed 64, 128), continued prompts off the grid (5, 37, 3),
  // lengths around the chunk (63, 64, 65) and a long one; one null row.
  const Step st = quick() ? Step({1, 65, 130, 3}, {5, 0, 70, 0}, 3)
                          : Step({1, 63, 64, 65, 700, 130, 9, 200}, {0, 5, 64, 0, 37, 128, 0, 3}, 6);
  for (const auto& sh : gdn_shapes()) {
    for (const Algo algo : kAlgos) {
      SCOPED_TRACE(testing::Message() << sh.name << " state " << dtype_name(state_dtype) << " " << algo_name(algo));
      GdnLayer L(sh, state_dtype, st.n() + 1, rng);
      Tokens tk(sh, st.T(), rng);
      const int64_t os = int64_t{sh.Hv} * sh.Dv + 8, W = int64_t{sh.Hv} * sh.Dv;
      // The double reference from the initial states (before the CPU kernel updates the host pool).
      std::vector<std::vector<double>> ref_out(st.n());
      if (with_reference) {
        for (int s = 0; s < st.n(); ++s) {
          if (st.idx[s] == 0) continue;
          const int64_t len = st.qsl[s + 1] - st.qsl[s], n = int64_t{sh.Hv} * sh.Dk * sh.Dv;
          std::vector<double> state(n, 0.0);
          if (st.nc[s] > 0) {
            auto f = state_to_f32(L.pool.host_view(), st.idx[s], n);
            std::copy(f.begin(), f.end(), state.begin());
          }
          ref_out[s].resize(len * W);
          cpu::gated_delta_reference(tk.host(st.qsl[s]), L.host(), len, state.data(), ref_out[s].data());
        }
      }
      std::vector<float> ref(st.T() * os, 0.0f);
      cpu::gated_delta_prefill(tk.host(), L.host(), ref.data(), os, st.qsl, st.nc, st.idx);
      auto got = gpu_prefill(L, tk, st, os, prec, algo);
      double worst = 0, worst_ref = 0;
      for (int s = 0; s < st.n(); ++s) {  // per sequence, so a wrong short row is not hidden by a long one
        const int64_t t0 = st.qsl[s], len = st.qsl[s + 1] - t0;
        const double e = rel_err(got.data() + t0 * os, os, ref.data() + t0 * os, os, len, W);
        EXPECT_LT(e, st.idx[s] ? tol : 1e-30)
            << "out of sequence " << s << " (len " << len << ", computed " << st.nc[s] << ")";
        worst = std::max(worst, e);
        if (with_reference && st.idx[s]) {
          double num = 0, den = 0;
          for (int64_t t = 0; t < len; ++t)
            for (int64_t c = 0; c < W; ++c) {
              const double d = got[(t0 + t) * os + c] - ref_out[s][t * W + c];
              num += d * d;
              den += ref_out[s][t * W + c] * ref_out[s][t * W + c];
            }
          const double er = den == 0 ? std::sqrt(num) : std::sqrt(num / den);
          EXPECT_LT(er, 10 * tol) << "against the double recurrence, sequence " << s;
          worst_ref = std::max(worst_ref, er);
        }
      }
      const double se = L.pool.rel_err_blocks(st.idx);
      EXPECT_LT(se, tol) << "final states";
      EXPECT_TRUE(L.pool.null_block_intact());
      std::printf("[gdn prefill] %-16s %-8s %s %s: out rel err %.2e (vs double %.2e), state rel err %.2e\n", sh.name,
                  algo_name(algo), std::string(dtype_name(state_dtype)).c_str(),
                  prec == cuda::GatedDeltaPrecision::kFp32 ? "3xTF32" : "TF32", worst, worst_ref, se);
    }
  }
}

TEST(CudaGatedDelta, PrefillMatchesCpuPackedWithInitialStates) {
  REQUIRE_GPU();
  check_prefill(DType::F32, cuda::GatedDeltaPrecision::kFp32, 2e-5, true);
}

TEST(CudaGatedDelta, PrefillTf32MatchesCpuLoosely) {
  REQUIRE_GPU();
  check_prefill(DType::F32, cuda::GatedDeltaPrecision::kTf32, 5e-3, false);
}

TEST(CudaGatedDelta, PrefillBf16StateMatchesCpu) {
  REQUIRE_GPU();
  check_prefill(DType::BF16, cuda::GatedDeltaPrecision::kFp32, 1e-3, false);
}

// A prompt cut into steps (cuts on and off the chunk grid) on the GPU equals the uncut prompt on the CPU.
TEST(CudaGatedDelta, ChunkedContinuationMatchesOneShotCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& sh : gdn_shapes()) {
    for (const Algo algo : kAlgos) {
      SCOPED_TRACE(testing::Message() << sh.name << " " << algo_name(algo));
      const int n = quick() ? 200 : 700;
      GdnLayer L(sh, DType::F32, 2, rng);
      Tokens tk(sh, n, rng);
      const int64_t os = int64_t{sh.Hv} * sh.Dv, W = os;
      std::vector<float> ref(n * os);
      cpu::gated_delta_prefill(tk.host(), L.host(), ref.data(), os, std::vector<int32_t>{0, n}, std::vector<int32_t>{0},
                               std::vector<int32_t>{1});
      const std::vector<int32_t> cuts{0, 1, 64, quick() ? 120 : 164, quick() ? 192 : 421, n};
      std::vector<float> got(n * os);
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const int32_t a = cuts[c], len = cuts[c + 1] - a;
        Tokens part(tk, a, len);
        Step st({len}, {a}, -1);
        auto o = gpu_prefill(L, part, st, os, cuda::GatedDeltaPrecision::kFp32, algo);
        std::copy(o.begin(), o.end(), got.begin() + a * os);
      }
      const double e = rel_err(got.data(), os, ref.data(), os, n, W);
      EXPECT_LT(e, 2e-5);
      const double se = L.pool.rel_err_blocks({1});
      EXPECT_LT(se, 2e-5) << "final state";
      std::printf("[gdn continuation] %-16s %-8s: out rel err %.2e, state rel err %.2e\n", sh.name, algo_name(algo), e,
                  se);
    }
  }
}

// ---- batch-invariant sequential prefill ----------------------------------------------------------------------------

/// Bytes of block b of a state pool on the device.
std::vector<uint8_t> block_bytes(const DeviceBuffer& pool, int64_t block_bytes_n, int32_t b) {
  std::vector<uint8_t> h(block_bytes_n);
  pool.download(h.data(), h.size(), static_cast<size_t>(b) * block_bytes_n);
  return h;
}

/// gated_delta_prefill_sequential on random rows (lengths 1..300, initial states, a null row, stores at random
/// offsets) equals, bit for bit, the same tokens fed one at a time through gated_delta_decode in batch-invariant mode
/// (outputs, final states, stored states), and the CPU decode fed the same way within `tol`.
void check_sequential(DType state_dtype, double tol) {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& sh : gdn_shapes()) {
    SCOPED_TRACE(testing::Message() << sh.name << " state " << dtype_name(state_dtype));
    const SeqRows r = SeqRows::random(rng, quick() ? 5 : 8, quick() ? 100 : 300, 2, true);
    GdnLayer L(sh, state_dtype, r.num_blocks(), rng);
    const int64_t bb = int64_t{sh.Hv} * sh.Dk * sh.Dv * dtype_size(state_dtype);
    // Rows without an initial state start from zeros: their blocks are zeroed, so the decode walk starts there too.
    for (int s = 0; s < r.n(); ++s)
      if (r.nc[s] == 0 && r.idx[s] != 0) std::fill_n(L.pool.host.begin() + r.idx[s] * bb, bb, uint8_t{0});
    L.pool.dev.upload(L.pool.host.data(), L.pool.host.size());
    DeviceBuffer dec_pool(L.pool.host.size());
    dec_pool.upload(L.pool.host.data(), L.pool.host.size());
    cuda::GatedDeltaParams dp = L.dev();
    dp.states.data = dec_pool.data();
    Tokens tk(sh, r.T(), rng);
    const int64_t os = int64_t{sh.Hv} * sh.Dv + 8, W = int64_t{sh.Hv} * sh.Dv;
    // 1. The sequential prefill on the pool.
    DevSeqRows dr(r);
    DeviceBuffer dout = poisoned(r.T() * os);
    SSM_CUDA_CHECK(cuda::gated_delta_prefill_sequential(tk.dev(), L.dev(), dout.as<float>(), os, dr.qsl.as<int32_t>(),
                                                        dr.nc.as<int32_t>(), dr.idx.as<int32_t>(), r.n(), nullptr,
                                                        dr.stores(r)));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(dout, r.T() * os);
    // 2. The same tokens one at a time: the GPU decode on the copy, the CPU decode on the host pool.
    std::vector<float> want(r.T() * os, 0.0f), ref(r.T() * os, 0.0f);
    std::vector<std::vector<uint8_t>> want_store(r.store_block.size());
    for (int t = 0; t < r.max_len(); ++t) {
      const DecodeStep st(r, t);
      const int B = st.size();
      const auto q = st.gather(tk.q, tk.qs), k = st.gather(tk.k, tk.ks), v = st.gather(tk.v, tk.vs);
      const auto g = st.gather(tk.g, tk.gs), beta = st.gather(tk.beta, tk.bs);
      DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dg = to_device(g), db = to_device(beta);
      const cuda::GatedDeltaInputs din{dq.as<float>(), tk.qs, dk.as<float>(), tk.ks, dv.as<float>(), tk.vs,
                                       dg.as<float>(), tk.gs, db.as<float>(), tk.bs};
      const cpu::GatedDeltaInputs hin{q.data(), tk.qs, k.data(), tk.ks, v.data(), tk.vs, g.data(), tk.gs, beta.data(), tk.bs};
      DeviceBuffer didx = to_device(st.blocks), o = poisoned(B * os);
      SSM_CUDA_CHECK(cuda::gated_delta_decode(din, dp, o.as<float>(), os, didx.as<int32_t>(), B, nullptr, true));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto og = to_host<float>(o, B * os);
      std::vector<float> oh(B * os, 0.0f);
      cpu::gated_delta_decode(hin, L.host(), oh.data(), os, st.blocks);
      for (int i = 0; i < B; ++i) {
        std::copy_n(og.begin() + i * os, W, want.begin() + st.tokens[i] * os);
        std::copy_n(oh.begin() + i * os, W, ref.begin() + st.tokens[i] * os);
      }
      for (size_t i = 0; i < r.store_offset.size(); ++i)
        if (r.store_offset[i] == t + 1) want_store[i] = block_bytes(dec_pool, bb, r.idx[r.store_row[i]]);
    }
    // Bit identity: outputs, final states, stored states.
    int64_t mismatched = 0;
    for (int64_t t = 0; t < r.T(); ++t)
      mismatched += std::memcmp(got.data() + t * os, want.data() + t * os, W * sizeof(float)) != 0;
    EXPECT_EQ(mismatched, 0) << "tokens whose outputs differ from the decode walk's bits";
    for (int s = 0; s < r.n(); ++s) {
      if (r.idx[s] == 0) continue;
      EXPECT_TRUE(block_bytes(L.pool.dev, bb, r.idx[s]) == block_bytes(dec_pool, bb, r.idx[s])) << "final state of row " << s;
    }
    for (size_t i = 0; i < r.store_block.size(); ++i)
      EXPECT_TRUE(block_bytes(L.pool.dev, bb, r.store_block[i]) == want_store[i])
          << "store " << i << " (row " << r.store_row[i] << ", offset " << r.store_offset[i] << ")";
    // Against the CPU decode walk.
    double worst = 0;
    for (int s = 0; s < r.n(); ++s) {
      const int64_t t0 = r.qsl[s];
      const double e = rel_err(got.data() + t0 * os, os, ref.data() + t0 * os, os, r.len(s), W);
      EXPECT_LT(e, r.idx[s] ? tol : 1e-30) << "out of row " << s << " (len " << r.len(s) << ")";
      worst = std::max(worst, e);
    }
    const double se = L.pool.rel_err_blocks(r.idx);
    EXPECT_LT(se, tol) << "final states vs the CPU";
    EXPECT_TRUE(L.pool.null_block_intact());
    std::printf("[gdn sequential] %-16s %s: %zu stores, bit-identical to decode: %s; vs CPU out %.2e, state %.2e\n",
                sh.name, std::string(dtype_name(state_dtype)).c_str(), r.store_block.size(),
                mismatched == 0 ? "yes" : "NO", worst, se);
  }
}

TEST(CudaGatedDelta, SequentialPrefillEqualsDecodeBitForBit) {
  REQUIRE_GPU();
  check_sequential(DType::F32, 2e-5);
}

TEST(CudaGatedDelta, SequentialPrefillBf16StateEqualsDecodeBitForBit) {
  REQUIRE_GPU();
  check_sequential(DType::BF16, 1e-3);
}

// ---- prepare ------------------------------------------------------------------------------------------------------

/// The preparation on the CPU (double sums, fp32 results): as cuda::gated_delta_prepare's doc comment.
void prepare_reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& a,
                       const std::vector<float>& b, const std::vector<float>& A_log, const std::vector<float>& dt_bias,
                       int64_t T, int Hk, int Hv, int Dk, int64_t qk_stride, int64_t ab_stride, std::vector<float>& qo,
                       std::vector<float>& ko, std::vector<float>& g, std::vector<float>& beta) {
  qo = q, ko = k;
  g.assign(T * Hv, 0.0f), beta.assign(T * Hv, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < Hk; ++h) {
      for (auto* x : {&qo, &ko}) {
        float* r = x->data() + t * qk_stride + int64_t{h} * Dk;
        double s = 0;
        for (int i = 0; i < Dk; ++i) s += double(r[i]) * r[i];
        const double scale = (x == &qo ? 1.0 / std::sqrt(double(Dk)) : 1.0) / std::sqrt(s + 1e-6);
        for (int i = 0; i < Dk; ++i) r[i] = static_cast<float>(r[i] * scale);
      }
    }
    for (int h = 0; h < Hv; ++h) {
      const double x = double(a[t * ab_stride + h]) + dt_bias[h];
      const double sp = x > 20 ? x : std::log1p(std::exp(x));
      g[t * Hv + h] = static_cast<float>(-std::exp(double(A_log[h])) * sp);
      beta[t * Hv + h] = static_cast<float>(1.0 / (1.0 + std::exp(-double(b[t * ab_stride + h]))));
    }
  }
}

TEST(CudaGatedDelta, PrepareMatchesCpuReference) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& sh : gdn_shapes()) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(testing::Message() << sh.name << (in_place ? " in place" : ""));
      const int64_t T = 37, qk_stride = int64_t{sh.Hk} * sh.Dk + 4, ab_stride = sh.Hv + 2;
      auto q = rand_vec(rng, T * qk_stride, -2.0f, 2.0f), k = rand_vec(rng, T * qk_stride, -2.0f, 2.0f);
      auto a = rand_vec(rng, T * ab_stride, -10.0f, 25.0f), b = rand_vec(rng, T * ab_stride, -6.0f, 6.0f);
      auto A_log = rand_vec(rng, sh.Hv, -3.0f, 2.0f), dt_bias = rand_vec(rng, sh.Hv, -1.0f, 1.0f);
      std::vector<float> rq, rk, rg, rb;
      prepare_reference(q, k, a, b, A_log, dt_bias, T, sh.Hk, sh.Hv, sh.Dk, qk_stride, ab_stride, rq, rk, rg, rb);
      DeviceBuffer dq = to_device(q), dk = to_device(k), da = to_device(a), dbb = to_device(b), dA = to_device(A_log),
                   ddt = to_device(dt_bias);
      DeviceBuffer dqo = poisoned(T * qk_stride), dko = poisoned(T * qk_stride), dg = poisoned(T * sh.Hv),
                   dbeta = poisoned(T * sh.Hv);
      cuda::GatedDeltaPrepareArgs args{dq.as<float>(), qk_stride, dk.as<float>(), qk_stride, da.as<float>(), ab_stride,
                                       dbb.as<float>(), ab_stride, dA.as<float>(), ddt.as<float>(),
                                       in_place ? dq.as<float>() : dqo.as<float>(), qk_stride,
                                       in_place ? dk.as<float>() : dko.as<float>(), qk_stride, dg.as<float>(), sh.Hv,
                                       dbeta.as<float>(), sh.Hv};
      SSM_CUDA_CHECK(cuda::gated_delta_prepare(args, T, sh.Hk, sh.Hv, sh.Dk, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      auto gq = to_host<float>(in_place ? dq : dqo, T * qk_stride);
      auto gk = to_host<float>(in_place ? dk : dko, T * qk_stride);
      auto gg = to_host<float>(dg, T * sh.Hv), gb = to_host<float>(dbeta, T * sh.Hv);
      const int64_t W = int64_t{sh.Hk} * sh.Dk;
      EXPECT_LT(rel_err(gq.data(), qk_stride, rq.data(), qk_stride, T, W), 1e-6) << "q";
      EXPECT_LT(rel_err(gk.data(), qk_stride, rk.data(), qk_stride, T, W), 1e-6) << "k";
      EXPECT_LT(rel_err(gg.data(), sh.Hv, rg.data(), sh.Hv, T, sh.Hv), 1e-6) << "g";
      EXPECT_LT(rel_err(gb.data(), sh.Hv, rb.data(), sh.Hv, T, sh.Hv), 1e-6) << "beta";
      for (int64_t t = 0; t < T; ++t)  // elementwise too: each gate within a few ulps
        for (int h = 0; h < sh.Hv; ++h) {
          ASSERT_NEAR(gg[t * sh.Hv + h], rg[t * sh.Hv + h], 1e-5 * (1 + std::abs(rg[t * sh.Hv + h]))) << t << " " << h;
          ASSERT_NEAR(gb[t * sh.Hv + h], rb[t * sh.Hv + h], 1e-6) << t << " " << h;
        }
    }
  }
}

// ---- arguments (no GPU needed: rejected before any launch) -------------------------------------------------------

TEST(CudaGatedDelta, RejectsUnsupportedShapes) {
  alignas(16) static float fake[16];
  const auto params = [&](int hk, int hv, int dk, int dv, int chunk) {
    return cuda::GatedDeltaParams{hk, hv, dk, dv, chunk, StateView{fake, DType::F32, int64_t{hv} * dk * dv}};
  };
  EXPECT_TRUE(cuda::gated_delta_decode_supported(params(16, 32, 128, 128, 64)));
  EXPECT_TRUE(cuda::gated_delta_prefill_supported(params(16, 32, 128, 128, 64)));
  EXPECT_FALSE(cuda::gated_delta_decode_supported(params(16, 32, 48, 128, 64)));   // Dk not 32/64/128/256
  EXPECT_FALSE(cuda::gated_delta_decode_supported(params(16, 32, 128, 40, 64)));   // Dv % 16
  EXPECT_FALSE(cuda::gated_delta_decode_supported(params(3, 32, 128, 128, 64)));   // Hv % Hk
  EXPECT_FALSE(cuda::gated_delta_prefill_supported(params(16, 32, 256, 128, 64))); // Dk > 128
  EXPECT_FALSE(cuda::gated_delta_prefill_supported(params(16, 32, 128, 128, 65))); // chunk > 64
  auto small = params(16, 32, 128, 128, 64);
  small.states.block_stride = 10;  // smaller than one block's state
  EXPECT_FALSE(cuda::gated_delta_prefill_supported(small));
  const cuda::GatedDeltaInputs in{fake, 16 * 128, fake, 16 * 128, fake, 32 * 128, fake, 32, fake, 32};
  const int32_t* none = nullptr;
  // A short output stride or input stride is refused before any launch.
  EXPECT_EQ(cuda::gated_delta_decode(in, params(16, 32, 128, 128, 64), fake, 32 * 128 - 1, none, 1, nullptr),
            cudaErrorInvalidValue);
  auto short_v = in;
  short_v.v_stride = 100;
  EXPECT_EQ(cuda::gated_delta_prefill(short_v, params(16, 32, 128, 128, 64), fake, 32 * 128, none, none, none, 1,
                                      nullptr),
            cudaErrorInvalidValue);
  // The sequential prefill: decode's sizes (Dk 48 refused), strides and metadata arrays.
  EXPECT_EQ(cuda::gated_delta_prefill_sequential(in, params(16, 32, 48, 128, 64), fake, 32 * 128, none, none, none, 1,
                                                 nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gated_delta_prefill_sequential(short_v, params(16, 32, 128, 128, 64), fake, 32 * 128, none, none,
                                                 none, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::gated_delta_prefill_sequential(in, params(16, 32, 128, 128, 64), fake, 32 * 128, none, none, none, 1,
                                                 nullptr),
            cudaErrorInvalidValue);  // missing query_start_loc / num_computed / state_indices
  cuda::DevStateStores no_arrays;
  no_arrays.num = 1;
  const int32_t* some = reinterpret_cast<const int32_t*>(fake);
  EXPECT_EQ(cuda::gated_delta_prefill_sequential(in, params(16, 32, 128, 128, 64), fake, 32 * 128, some, some, some, 1,
                                                 nullptr, no_arrays),
            cudaErrorInvalidValue);  // stores without their arrays
  cuda::GatedDeltaPrepareArgs pa;
  EXPECT_EQ(cuda::gated_delta_prepare(pa, 4, 16, 32, 128, nullptr), cudaErrorInvalidValue);  // zero strides
}

}  // namespace
}  // namespace ssmserve
