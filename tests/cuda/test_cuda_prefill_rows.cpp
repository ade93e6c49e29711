// The large-T (prefill) forms of the memory-bound row kernels (KernelTuning::prefill_row_kernels) against their old
// forms, bit for bit, on random inputs at T = 1, 3, 17 (decode sizes: the old forms run there), 64, 100 and 4096+:
// the MoE pair sort (multi-block; offsets equal, each expert's set of pairs equal), combine (per token, with and
// without the shared add), gather (by token) and the whole sparse_moe; the gated RMSNorm (several groups per block),
// the causal conv1d prefill (four channels per thread), cast_rows and sigmoid_gate (8 columns per thread). The
// benchmark of the same pairs at a 32k-token Qwen3.5-35B-A3B prefill is bench/cuda_prefill_rows.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_parts.h"
#include "kernels/cuda/rms_norm.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// Runs f with KernelTuning::prefill_row_kernels = on (restores the switches after).
template <class F>
auto with_rows(bool on, F&& f) {
  cuda::KernelTuning t = cuda::kernel_tuning();
  t.prefill_row_kernels = on;
  const TuningScope scope(t);
  return f();
}

/// n uniform floats in [lo, hi) (xorshift: the large cases hold 10^8 values).
std::vector<float> fast_vec(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    f = lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

/// The stream every launch below uses (a created one: the PDL launches need no legacy default stream).
cudaStream_t stream() {
  static cuda::Stream s;
  return s.get();
}

/// The bytes of n elements of type T at d (after a device synchronize).
template <class T = uint8_t>
std::vector<T> bytes(const DeviceBuffer& d, size_t n) {
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  return to_host<T>(d, n);
}

std::vector<int64_t> token_counts() {
  std::vector<int64_t> v = {1, 3, 17, 64, 100, 4096};
  if (!quick()) v.push_back(32768);
  return v;
}

// ---- MoE -----------------------------------------------------------------------------------------------------------

/// ids [T, k] in [0, E) (repeats allowed: the combine's tie order is the slot order), a random permutation as
/// pair_row and its inverse as sorted.
struct Pairs {
  std::vector<int32_t> ids, pair_row, sorted;
  std::vector<float> wts;
  Pairs(int64_t T, int k, int E, std::mt19937& rng) {
    const int64_t P = T * k;
    ids.resize(P), pair_row.resize(P), sorted.resize(P), wts.resize(P);
    std::uniform_int_distribution<int> de(0, E - 1);
    std::uniform_real_distribution<float> dw(0.0f, 1.0f);
    for (int64_t p = 0; p < P; ++p) ids[p] = de(rng), wts[p] = dw(rng);
    std::iota(sorted.begin(), sorted.end(), 0);
    std::shuffle(sorted.begin(), sorted.end(), rng);
    for (int64_t r = 0; r < P; ++r) pair_row[sorted[r]] = static_cast<int32_t>(r);
  }
};

TEST(CudaPrefillRows, MoeSortMultiBlockMatchesOneBlock) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    int E, k;
  };
  for (const Case c : {Case{256, 8}, Case{60, 4}, Case{1024, 10}}) {
    for (int64_t T : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{1024}, int64_t{1100}, int64_t{4096}, int64_t{32768}}) {
      const int64_t P = T * c.k;
      SCOPED_TRACE(testing::Message() << "E " << c.E << " top_k " << c.k << " T " << T);
      const Pairs pr(T, c.k, c.E, rng);
      DeviceBuffer ids = to_device(pr.ids);
      auto run = [&](bool on) {
        return with_rows(on, [&] {
          DeviceBuffer off((c.E + 1) * 4), sorted(P * 4), prow(P * 4);
          const size_t cb = cuda::detail::moe_sort_counts_bytes(P, c.E);
          DeviceBuffer counts(std::max<size_t>(cb, 4));
          SSM_CUDA_CHECK(cuda::detail::moe_sort_pairs(ids.as<int32_t>(), P, c.E, off.as<int32_t>(), sorted.as<int32_t>(),
                                                      prow.as<int32_t>(), counts.as<int32_t>(), stream(), true));
          return std::make_tuple(bytes<int32_t>(off, c.E + 1), bytes<int32_t>(sorted, P), bytes<int32_t>(prow, P));
        });
      };
      auto [o0, s0, r0] = run(false);
      auto [o1, s1, r1] = run(true);
      ASSERT_EQ(o0, o1) << "offsets";
      for (int64_t r = 0; r < P; ++r) ASSERT_EQ(r1[s1[r]], r) << "pair_row is not sorted's inverse at row " << r;
      for (int e = 0; e < c.E; ++e) {  // each expert's pairs: the same set (their order is unspecified)
        std::sort(s0.begin() + o0[e], s0.begin() + o0[e + 1]);
        std::sort(s1.begin() + o1[e], s1.begin() + o1[e + 1]);
        for (int64_t r = o1[e]; r < o1[e + 1]; ++r) ASSERT_EQ(pr.ids[s1[r]], e);
      }
      ASSERT_EQ(s0, s1) << "expert segments hold different pairs";
    }
  }
}

TEST(CudaPrefillRows, MoeCombinePerTokenMatchesSlices) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const int64_t H : {int64_t{2048}, int64_t{2056}, int64_t{264}}) {
    for (const int64_t T : token_counts()) {
      if (H != 2048 && T > 4096) continue;
      const int k = H == 264 ? 16 : 8, E = 256;
      const int64_t P = T * k, os = H + 8, ys = H + 4, xs = H + 12;
      SCOPED_TRACE(testing::Message() << "hidden " << H << " T " << T);
      const Pairs pr(T, k, E, rng);
      DeviceBuffer ids = to_device(pr.ids), wts = to_device(pr.wts), prow = to_device(pr.pair_row);
      DeviceBuffer y = to_device(fast_vec(P * H, -2.0f, 2.0f, rng()));
      DeviceBuffer sy = to_device(fast_vec(T * ys, -1.0f, 1.0f, rng())), sx = to_device(fast_vec(T * xs, -1.0f, 1.0f, rng()));
      DeviceBuffer gate = to_device(fast_vec(H, -0.1f, 0.1f, rng()));
      for (int mode = 0; mode < 3; ++mode) {  // no add, plain add, gated add
        SCOPED_TRACE(testing::Message() << "add mode " << mode);
        cuda::MoeSharedAdd add;
        add.y = sy.as<float>(), add.y_stride = ys;
        if (mode == 2) add.gate = gate.as<float>(), add.x = sx.as<float>(), add.x_stride = xs;
        auto run = [&](bool on) {
          return with_rows(on, [&] {
            DeviceBuffer out = poisoned(T * os);
            SSM_CUDA_CHECK(cuda::detail::moe_combine(y.as<float>(), H, ids.as<int32_t>(), wts.as<float>(),
                                                     prow.as<int32_t>(), T, k, out.as<float>(), os,
                                                     mode ? &add : nullptr, stream(), true));
            return bytes(out, T * os * 4);
          });
        };
        EXPECT_TRUE(run(false) == run(true)) << "combine output differs";
      }
    }
  }
}

TEST(CudaPrefillRows, MoeGatherByTokenMatchesByRow) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const int64_t H : {int64_t{2048}, int64_t{2056}}) {
    for (const int64_t T : token_counts()) {
      const int k = 8;
      const int64_t P = T * k, xs = H + 4;
      SCOPED_TRACE(testing::Message() << "hidden " << H << " T " << T);
      const Pairs pr(T, k, 256, rng);
      DeviceBuffer sorted = to_device(pr.sorted), prow = to_device(pr.pair_row);
      DeviceBuffer x = to_device(fast_vec(T * xs, -3.0f, 3.0f, rng()));
      auto run = [&](bool on) {
        return with_rows(on, [&] {
          DeviceBuffer xg(P * H * 2);
          xg.fill_bytes(0x5a);
          SSM_CUDA_CHECK(cuda::detail::moe_gather_rows(x.as<float>(), xs, sorted.as<int32_t>(), prow.as<int32_t>(), T, k,
                                                       H, xg.as<__nv_bfloat16>(), stream()));
          return bytes(xg, P * H * 2);
        });
      };
      EXPECT_TRUE(run(false) == run(true)) << "gathered rows differ";
    }
  }
}

// The whole layer (route, sort, gather, grouped or per-pair GEMMs, combine with Qwen's gated shared add and the
// plain one): old forms vs new, the output bit for bit (the sort may order an expert's rows differently; each row is
// computed alone).
TEST(CudaPrefillRows, SparseMoeMatchesOldForms) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int E = 32, k = 8;
  const int64_t H = 256, I = 64, xs = H + 4, os = H + 8;
  DeviceBuffer w1 = to_device(to_bf16_bits(fast_vec(E * I * H, -0.06f, 0.06f, rng()))),
               w3 = to_device(to_bf16_bits(fast_vec(E * I * H, -0.06f, 0.06f, rng()))),
               w2 = to_device(to_bf16_bits(fast_vec(E * H * I, -0.12f, 0.12f, rng())));
  DeviceBuffer gate = to_device(fast_vec(H, -0.1f, 0.1f, rng()));
  cuda::MoeDevWeights w{E, k, H, I, w1.data(), w3.data(), w2.data(), cuda::MoeRouteParams{}};
  for (const int64_t T : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{64}, int64_t{100}, int64_t{1100}, int64_t{4096}}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    DeviceBuffer x = to_device(fast_vec(T * xs, -2.0f, 2.0f, rng())), logits = to_device(fast_vec(T * E, -3.0f, 3.0f, rng()));
    DeviceBuffer sy = to_device(fast_vec(T * H, -1.0f, 1.0f, rng()));
    for (int mode = 0; mode < 3; ++mode) {
      SCOPED_TRACE(testing::Message() << "add mode " << mode);
      cuda::MoeSharedAdd add;
      add.y = sy.as<float>(), add.y_stride = H;
      if (mode == 2) add.gate = gate.as<float>();
      auto run = [&](bool on) {
        return with_rows(on, [&] {
          DeviceBuffer ws(cuda::moe_workspace_bytes(T, w)), out = poisoned(T * os);
          SSM_CUDA_CHECK(cuda::sparse_moe(x.as<float>(), xs, T, logits.as<float>(), w, out.as<float>(), os, ws.data(),
                                          stream(), true, mode ? &add : nullptr));
          return bytes(out, T * os * 4);
        });
      };
      EXPECT_TRUE(run(false) == run(true)) << "sparse_moe output differs";
    }
  }
}

// ---- Gated DeltaNet row kernels --------------------------------------------------------------------------------------

// Gated RMSNorm over 128-wide groups (Gated DeltaNet's value heads; z a slice of the in-projection rows as the mixer
// passes it), 8 / 2 / 1 groups per block, both entry points, fp32 (also in place) and bf16 outputs.
TEST(CudaPrefillRows, GatedNormGroupsPerBlockMatchOld) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const int64_t D : {int64_t{4096}, int64_t{768}, int64_t{640}, int64_t{4096 + 64}}) {
    const int64_t gs = D == 4096 + 64 ? 64 : 128, PW = 12352;
    for (const int64_t T : token_counts()) {
      SCOPED_TRACE(testing::Message() << "D " << D << " group " << gs << " T " << T);
      DeviceBuffer y = to_device(fast_vec(T * D, -2.0f, 2.0f, rng())), proj = to_device(fast_vec(T * PW, -3.0f, 3.0f, rng()));
      DeviceBuffer wt = to_device(fast_vec(D, 0.5f, 1.5f, rng()));
      const float* z = proj.as<float>() + 8192;
      for (const bool nbg : {true, false})
        for (const DType od : {DType::BF16, DType::F32})
          for (int entry = 0; entry < 3; ++entry) {  // pdl form without / with PDL, rms_norm.cu's form
            SCOPED_TRACE(testing::Message() << "norm_before_gate " << nbg << " out " << dtype_name(od) << " entry " << entry);
            auto run = [&](bool on, bool in_place) {
              return with_rows(on, [&] {
                DeviceBuffer out = poisoned(T * D);
                const float* src = y.as<float>();
                if (in_place) {
                  SSM_CUDA_CHECK(cudaMemcpy(out.data(), y.data(), T * D * 4, cudaMemcpyDeviceToDevice));
                  src = out.as<float>();
                }
                if (entry < 2)
                  SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(src, D, z, PW, wt.as<float>(), 1e-6f, T, D, gs, nbg, out.data(), od,
                                                          D, entry == 1, stream()));
                else
                  SSM_CUDA_CHECK(cuda::gated_rms_norm(src, D, z, PW, wt.as<float>(), 1e-6f, T, D, gs, nbg, out.data(), od, D,
                                                      stream()));
                return bytes(out, T * D * 4);
              });
            };
            EXPECT_TRUE(run(false, false) == run(true, false)) << "gated norm output differs";
            if (od == DType::F32) {
              EXPECT_TRUE(run(false, true) == run(true, true)) << "in-place gated norm differs";
            }
          }
    }
  }
}

// The causal conv1d prefill at Gated DeltaNet's shape (8192 channels of the in-projection rows, width 4) and odd
// ones (width 2 and 8, 100 channels), several sequences (with and without initial states, one skipped by state index
// 0), fp32 and bf16 windows, outputs fp32 + bf16, fp32 only and bf16 only; the outputs and the written-back windows.
TEST(CudaPrefillRows, ConvFwdVecMatchesOld) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    int64_t dim, x_stride;
    int width;
  };
  for (const Case c : {Case{8192, 12352, 4}, Case{100, 104, 2}, Case{1000, 1000, 8}}) {
    for (const int64_t T : token_counts()) {
      for (const DType sd : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << "dim " << c.dim << " width " << c.width << " T " << T << " state "
                                        << dtype_name(sd));
        // Up to 4 sequences: lengths cut at random, the second without initial state, the third skipped.
        std::vector<int32_t> qsl = {0};
        const int ns = static_cast<int>(std::min<int64_t>(T, 4));
        for (int s = 1; s < ns; ++s) qsl.push_back(static_cast<int32_t>(T * s / ns + (s == 1 && T > 8 ? 3 : 0)));
        qsl.push_back(static_cast<int32_t>(T));
        std::vector<int32_t> sidx;
        std::vector<uint8_t> init;
        for (int s = 0; s < ns; ++s) sidx.push_back(s == 2 ? 0 : s + 1), init.push_back(s == 1 ? 0 : 1);
        const int64_t S = c.width - 1, blocks = ns + 1, bstride = S * c.dim + 4;
        const size_t esz = sd == DType::F32 ? 4 : 2;
        std::vector<float> st = fast_vec(blocks * bstride, -1.0f, 1.0f, rng());
        std::vector<uint8_t> st_bytes(blocks * bstride * esz);
        if (sd == DType::F32) std::memcpy(st_bytes.data(), st.data(), st_bytes.size());
        else {
          const std::vector<uint16_t> b = to_bf16_bits(st);
          std::memcpy(st_bytes.data(), b.data(), st_bytes.size());
        }
        DeviceBuffer x = to_device(fast_vec(T * c.x_stride, -2.0f, 2.0f, rng()));
        DeviceBuffer wt = to_device(fast_vec(c.dim * c.width, -0.5f, 0.5f, rng())), bias = to_device(fast_vec(c.dim, -0.2f, 0.2f, rng()));
        DeviceBuffer dq = to_device(qsl), ds = to_device(sidx), di = to_device(init);
        for (int outs = 0; outs < 3; ++outs) {  // fp32 + bf16, fp32, bf16
          SCOPED_TRACE(testing::Message() << "outputs " << outs);
          auto run = [&](bool on) {
            return with_rows(on, [&] {
              DeviceBuffer states = to_device(st_bytes), out = poisoned(T * c.dim), out16 = poisoned(T * c.dim);
              cuda::ConvParams p;
              p.dim = c.dim, p.width = c.width, p.weight = wt.as<float>(), p.bias = bias.as<float>();
              p.conv_states = StateView{states.data(), sd, bstride};
              SSM_CUDA_CHECK(cuda::causal_conv1d_fwd_dual(x.as<float>(), c.x_stride, outs == 2 ? nullptr : out.as<float>(),
                                                          c.dim, outs == 1 ? nullptr : out16.data(), c.dim, p,
                                                          dq.as<int32_t>(), ds.as<int32_t>(), di.as<uint8_t>(), ns, T,
                                                          stream()));
              std::vector<uint8_t> all = bytes(out, T * c.dim * 4), b16 = bytes(out16, T * c.dim * 2),
                                   sb = bytes(states, st_bytes.size());
              all.insert(all.end(), b16.begin(), b16.end());
              all.insert(all.end(), sb.begin(), sb.end());
              return all;
            });
          };
          EXPECT_TRUE(run(false) == run(true)) << "conv outputs or windows differ";
        }
      }
    }
  }
}

// ---- Elementwise row kernels ------------------------------------------------------------------------------------------

TEST(CudaPrefillRows, CastRowsAndSigmoidGateVecMatchOld) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const int64_t cols : {int64_t{2048}, int64_t{4096}, int64_t{2056}}) {
    for (const int64_t T : token_counts()) {
      if (T > 4096 && cols != 4096) continue;
      const int64_t is = cols + 8, os = cols + 16;
      SCOPED_TRACE(testing::Message() << "cols " << cols << " T " << T);
      DeviceBuffer a = to_device(fast_vec(T * is, -3.0f, 3.0f, rng())), g = to_device(fast_vec(T * is, -6.0f, 6.0f, rng()));
      for (const DType od : {DType::BF16, DType::F32})
        for (int op = 0; op < 2; ++op) {
          SCOPED_TRACE(testing::Message() << (op ? "sigmoid_gate" : "cast_rows") << " out " << dtype_name(od));
          auto run = [&](bool on) {
            return with_rows(on, [&] {
              DeviceBuffer out = poisoned(T * os);
              if (op == 0)
                SSM_CUDA_CHECK(cuda::cast_rows(a.as<float>(), is, T, cols, out.data(), od, os, stream(), true));
              else
                SSM_CUDA_CHECK(cuda::sigmoid_gate(a.as<float>(), is, g.as<float>(), is, T, cols, out.data(), od, os,
                                                  stream(), true));
              return bytes(out, T * os * 4);
            });
          };
          EXPECT_TRUE(run(false) == run(true)) << "output differs";
        }
    }
  }
}

}  // namespace
}  // namespace ssmserve
