// GPU grouped expert GEMMs of the sparse MoE (kernels/cuda/moe_grouped_gemm.h): the Hopper kernel
// (moe_grouped_gemm_wg.cu, MoeGemmPath::kWgmma) against the mma.sync kernel and the CPU: an exact small-integer
// layout check, random shapes with uneven experts, and batch invariance of both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe_grouped_gemm.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

// ---- Grouped expert GEMMs: the Hopper kernel (MoeGemmPath::kWgmma) against the mma.sync kernel and the CPU ---------

using cuda::detail::MoeGemmPath;

/// One grouped-GEMM problem on the host: A [P, K] and weights [E, N, K] (and w3 for the gated up) as bf16 bits,
/// expert e owning rows [offsets[e], offsets[e + 1]).
struct GroupedProblem {
  int E = 0;
  int64_t N = 0, K = 0, P = 0;
  bool gated = false;
  std::vector<int32_t> offsets;
  std::vector<uint16_t> a, w1, w3;
};

GroupedProblem grouped_problem(const std::vector<int32_t>& counts, int64_t N, int64_t K, bool gated, uint64_t seed,
                               bool integers = false) {
  GroupedProblem p;
  p.E = static_cast<int>(counts.size()), p.N = N, p.K = K, p.gated = gated;
  p.offsets.assign(p.E + 1, 0);
  for (int e = 0; e < p.E; ++e) p.offsets[e + 1] = p.offsets[e] + counts[e];
  p.P = p.offsets[p.E];
  if (integers) {  // small integers: every fp32 sum exact, whatever the order
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int> d(-2, 2);
    auto ints = [&](size_t n) {
      std::vector<uint16_t> v(n);
      for (auto& b : v) b = f32_to_bf16(static_cast<float>(d(rng)));
      return v;
    };
    p.a = ints(p.P * K), p.w1 = ints(p.E * N * K);
    if (gated) p.w3 = ints(p.E * N * K);
  } else {
    const float ws = 1.0f / std::sqrt(static_cast<float>(K));
    p.a = fast_bf16(p.P * K, 1.0f, seed), p.w1 = fast_bf16(p.E * N * K, 2 * ws, seed + 1);
    if (gated) p.w3 = fast_bf16(p.E * N * K, 2 * ws, seed + 2);
  }
  return p;
}

/// The CPU reference: down / plain y [P, N] fp32 (double sums), or gated act [P, N] = bf16(silu(g) * u) as floats.
std::vector<float> grouped_reference(const GroupedProblem& p) {
  std::vector<float> a(p.a.size()), w1(p.w1.size()), w3(p.w3.size()), out(p.P * p.N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_f32(p.a[i]);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = bf16_to_f32(p.w1[i]);
  for (size_t i = 0; i < w3.size(); ++i) w3[i] = bf16_to_f32(p.w3[i]);
  for (int e = 0; e < p.E; ++e)
    for (int64_t r = p.offsets[e]; r < p.offsets[e + 1]; ++r)
      for (int64_t n = 0; n < p.N; ++n) {
        const float* x = a.data() + r * p.K;
        const float* wg = w1.data() + (e * p.N + n) * p.K;
        double g = 0, u = 0;
        for (int64_t k = 0; k < p.K; ++k) g += static_cast<double>(x[k]) * wg[k];
        if (p.gated) {
          const float* wu = w3.data() + (e * p.N + n) * p.K;
          for (int64_t k = 0; k < p.K; ++k) u += static_cast<double>(x[k]) * wu[k];
          const float gf = static_cast<float>(g);
          out[r * p.N + n] = bf16_to_f32(f32_to_bf16(gf / (1.0f + std::exp(-gf)) * static_cast<float>(u)));
        } else {
          out[r * p.N + n] = static_cast<float>(g);
        }
      }
  return out;
}

/// Runs one grouped GEMM on `path` (moe_grouped_up for gated problems, moe_grouped_down otherwise) into a poisoned
/// output with 64 guard elements past [P, N]; returns the output as floats (act's bf16 widened) and sets
/// `guard_ok` when the guard still holds the poison. Returns an empty vector when the call fails (`err`).
std::vector<float> run_grouped(const GroupedProblem& p, MoeGemmPath path, bool& guard_ok, cudaError_t& err) {
  const size_t n = p.P * p.N, guard = 64, esz = p.gated ? 2 : 4;
  DeviceBuffer da = to_device(p.a), dw1 = to_device(p.w1), dw3 = p.gated ? to_device(p.w3) : DeviceBuffer(16),
               doff = to_device(p.offsets), dout((n + guard) * esz);
  dout.fill_bytes(0xff);
  using bf = __nv_bfloat16;
  err = p.gated ? cuda::detail::moe_grouped_up(da.as<bf>(), doff.as<int32_t>(), p.P, p.E, dw1.as<bf>(), dw3.as<bf>(),
                                               p.N, p.K, dout.as<bf>(), nullptr, path)
                : cuda::detail::moe_grouped_down(da.as<bf>(), doff.as<int32_t>(), p.P, p.E, dw1.as<bf>(), p.N, p.K,
                                                 dout.as<float>(), nullptr, path);
  if (err != cudaSuccess) return {};
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out(n);
  guard_ok = true;
  if (p.gated) {
    const auto h = to_host<uint16_t>(dout, n + guard);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
    for (size_t i = n; i < n + guard; ++i) guard_ok &= h[i] == 0xffff;
  } else {
    const auto h = to_host<uint32_t>(dout, n + guard);
    std::memcpy(out.data(), h.data(), n * 4);
    for (size_t i = n; i < n + guard; ++i) guard_ok &= h[i] == 0xffffffffu;
  }
  return out;
}

/// First index where a and b differ bitwise (a.size() if none).
size_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  size_t i = 0;
  while (i < a.size() && std::memcmp(&a[i], &b[i], 4) == 0) ++i;
  return i;
}

/// Where a wrong tile layout shows first: small-integer operands (every sum exact in fp32), so the Hopper kernel's
/// plain GEMM must equal the CPU exactly, with 128- and 256-wide weight tiles (KernelTuning::moe_grouped_wg 2, 3).
/// One 128 x 128 x 64 tile, then several row / column / k tiles (K = 448: the 3- or 4-stage ring wraps; a partial
/// column tile; an expert boundary inside a row tile), then N = K = 8 (boxes far past the tensor). On a mismatch it says which
/// reference row / column the wrong values belong to (a transposed or permuted fragment or descriptor shows as a
/// mapping) before failing.
TEST(CudaMoeGrouped, WgmmaTileLayoutExactOnIntegers) {
  REQUIRE_GPU();
  if (!cuda::detail::moe_grouped_wg_supported()) GTEST_SKIP() << "no sm_90 device or tensor-map encoder";
  struct Case {
    std::vector<int32_t> counts;
    int64_t N, K;
  };
  for (int tiles : {2, 3})  // 128- and 256-wide weight tiles
  for (const Case& c : {Case{{128}, 128, 64}, Case{{129, 171}, 264, 448}, Case{{1, 0, 300}, 8, 8}}) {
    SCOPED_TRACE(testing::Message() << "tile width " << (tiles == 2 ? 128 : 256) << " experts " << c.counts.size()
                                    << " N " << c.N << " K " << c.K);
    cuda::KernelTuning tt = cuda::kernel_tuning();
    tt.moe_grouped_wg = tiles;
    TuningScope scope(tt);
    const GroupedProblem p = grouped_problem(c.counts, c.N, c.K, false, 7, true);
    const auto ref = grouped_reference(p);
    bool guard_ok = false;
    cudaError_t err = cudaSuccess;
    const auto got = run_grouped(p, MoeGemmPath::kWgmma, guard_ok, err);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    EXPECT_TRUE(guard_ok) << "wrote past [P, N]";
    int64_t bad = 0;
    for (int64_t i = 0; i < p.P * p.N; ++i) bad += got[i] != ref[i];
    if (bad) {
      const int64_t i = [&] { int64_t j = 0; while (got[j] == ref[j]) ++j; return j; }();
      std::printf("layout check: %lld of %lld wrong; first at row %lld col %lld: got %g want %g\n",
                  static_cast<long long>(bad), static_cast<long long>(p.P * p.N), static_cast<long long>(i / p.N),
                  static_cast<long long>(i % p.N), got[i], ref[i]);
      // Which (row, col) of the reference holds the wrong values of the first 4 rows' first 8 columns.
      for (int64_t r = 0; r < std::min<int64_t>(4, p.P); ++r)
        for (int64_t n = 0; n < std::min<int64_t>(8, p.N); ++n) {
          std::printf("  got(%lld, %lld) = %g matches ref at:", static_cast<long long>(r), static_cast<long long>(n),
                      got[r * p.N + n]);
          int shown = 0;
          for (int64_t j = 0; j < p.P * p.N && shown < 4; ++j)
            if (ref[j] == got[r * p.N + n] && ref[j] != 0)
              std::printf(" (%lld, %lld)", static_cast<long long>(j / p.N), static_cast<long long>(j % p.N)), ++shown;
          std::printf("\n");
        }
    }
    EXPECT_EQ(bad, 0) << "the wgmma tile layout (descriptors, swizzle or accumulator fragment) is wrong";
    // The gated form on the same kind of data (silu rounds: compared within bf16 accuracy).
    GroupedProblem q = grouped_problem(c.counts, c.N, c.K, true, 8, true);
    const auto gref = grouped_reference(q);
    const auto ggot = run_grouped(q, MoeGemmPath::kWgmma, guard_ok, err);
    ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    EXPECT_TRUE(guard_ok) << "gated: wrote past [P, N]";
    EXPECT_LT(rel_err(ggot.data(), q.N, gref.data(), q.N, q.P, q.N), 1e-2) << "gate / up pairing";
  }
}

/// Random bf16 problems: several expert counts and uneven rows per expert (0, 1, 127, 128, 129, 1000), N and K
/// that are no multiple of the tiles (K below one 64-wide stage too), up (gated) and down: the Hopper kernel and the
/// mma.sync kernel (both tile widths of the former) each within tolerance of the CPU (up 1e-2, bf16 output; down
/// 1e-4) and of each other, nothing written past [P, N].
TEST(CudaMoeGrouped, WgmmaMatchesMmaSyncAndCpu) {
  REQUIRE_GPU();
  const bool wg = cuda::detail::moe_grouped_wg_supported();
  if (!wg) std::printf("no sm_90 device: the mma.sync kernel only\n");
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> count_sets = {{129}, {0, 1, 127, 128, 129, 1000}, {1000, 0, 0, 1}};
  {
    std::uniform_int_distribution<int> d(0, 300), small(0, 3);
    std::vector<int32_t> c37(37), c512(512);
    for (auto& c : c37) c = d(rng);
    for (auto& c : c512) c = small(rng);  // the most experts the MoE takes: the tile lookup's 16 steps of 32
    count_sets.push_back(c37), count_sets.push_back(c512);
  }
  struct Dims {
    int64_t N, K;
  };
  for (const auto& counts : count_sets)
    for (const Dims& d : {Dims{200, 328}, Dims{72, 40}, Dims{136, 520}})
      for (bool gated : {true, false}) {
        if (counts.size() > 100 && d.K > 100) continue;  // keep the CPU reference short
        SCOPED_TRACE(testing::Message() << "E " << counts.size() << " N " << d.N << " K " << d.K
                                        << (gated ? " up (gated)" : " down"));
        const GroupedProblem p = grouped_problem(counts, d.N, d.K, gated, rng());
        const auto ref = grouped_reference(p);
        const double tol = gated ? 1e-2 : 1e-4;
        bool guard_ok = false;
        cudaError_t err = cudaSuccess;
        const auto old = run_grouped(p, MoeGemmPath::kMmaSync, guard_ok, err);
        ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
        EXPECT_TRUE(guard_ok) << "mma.sync wrote past [P, N]";
        EXPECT_LT(rel_err(old.data(), p.N, ref.data(), p.N, p.P, p.N), tol) << "mma.sync vs CPU";
        if (!wg) continue;
        for (int tiles : {2, 3}) {
          SCOPED_TRACE(testing::Message() << "tile width " << (tiles == 2 ? 128 : 256));
          cuda::KernelTuning tt = cuda::kernel_tuning();
          tt.moe_grouped_wg = tiles;
          TuningScope scope(tt);
          const auto got = run_grouped(p, MoeGemmPath::kWgmma, guard_ok, err);
          ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
          EXPECT_TRUE(guard_ok) << "wgmma wrote past [P, N]";
          EXPECT_LT(rel_err(got.data(), p.N, ref.data(), p.N, p.P, p.N), tol) << "wgmma vs CPU";
          EXPECT_LT(rel_err(got.data(), p.N, old.data(), p.N, p.P, p.N), tol) << "wgmma vs mma.sync";
          // kAuto takes the Hopper kernel when KernelTuning::moe_grouped_wg is set: the same bits.
          const auto autop = run_grouped(p, MoeGemmPath::kAuto, guard_ok, err);
          ASSERT_EQ(err, cudaSuccess);
          EXPECT_EQ(first_bit_difference(autop, got), got.size()) << "kAuto is not the wgmma kernel";
        }
      }
}

/// Batch invariance at the Qwen3.5-35B-A3B expert shapes (up: N 512, K 2048 gated; down: N 2048, K 512): rows picked
/// from a large uneven batch (first, middle and last of each expert's slice) computed again in a small batch (each
/// alone at the start of its tile), and again behind 77 other rows per expert (another position in another tile),
/// give the same output bits, on each kernel.
TEST(CudaMoeGrouped, BatchInvariantRows) {
  REQUIRE_GPU();
  // (path, KernelTuning::moe_grouped_wg): the mma.sync kernel, the Hopper kernel with 128- and 256-wide tiles.
  std::vector<std::pair<MoeGemmPath, int>> paths = {{MoeGemmPath::kMmaSync, 0}};
  if (cuda::detail::moe_grouped_wg_supported())
    paths.push_back({MoeGemmPath::kWgmma, 2}), paths.push_back({MoeGemmPath::kWgmma, 3});
  const std::vector<int32_t> counts = {300, 0, 129, 1, 1000, 64, 128, 77};
  const int E = static_cast<int>(counts.size());
  for (bool gated : {true, false}) {
    const int64_t N = gated ? 512 : 2048, K = gated ? 2048 : 512;
    const GroupedProblem big = grouped_problem(counts, N, K, gated, gated ? 11 : 12);
    // The picked rows of each expert, and the small problems: picked rows alone, or after 77 filler rows each.
    std::vector<std::vector<int64_t>> picked(E);
    for (int e = 0; e < E; ++e) {
      const int64_t o = big.offsets[e], c = counts[e];
      for (int64_t r : {o, o + c / 2, o + c - 1})
        if (c > 0 && (picked[e].empty() || picked[e].back() != r)) picked[e].push_back(r);
    }
    for (int filler : {0, 77}) {
      GroupedProblem small = big;
      small.a.clear();
      small.offsets.assign(E + 1, 0);
      std::vector<std::pair<int64_t, int64_t>> map;  // (row in small, row in big)
      const auto fill = fast_bf16(static_cast<size_t>(filler) * K, 1.0f, 99);
      for (int e = 0; e < E; ++e) {
        int64_t rows = 0;
        if (!picked[e].empty()) {
          small.a.insert(small.a.end(), fill.begin(), fill.end()), rows += filler;
          for (int64_t r : picked[e]) {
            map.emplace_back(small.offsets[e] + rows, r);
            small.a.insert(small.a.end(), big.a.begin() + r * K, big.a.begin() + (r + 1) * K), ++rows;
          }
        }
        small.offsets[e + 1] = static_cast<int32_t>(small.offsets[e] + rows);
      }
      small.P = small.offsets[E];
      for (const auto& [path, tiles] : paths) {
        SCOPED_TRACE(testing::Message() << (gated ? "up" : "down") << " filler " << filler << " path "
                                        << (path == MoeGemmPath::kWgmma ? "wgmma" : "mma.sync") << " tuning "
                                        << tiles);
        cuda::KernelTuning tt = cuda::kernel_tuning();
        tt.moe_grouped_wg = tiles;
        TuningScope scope(tt);
        bool guard_ok = false;
        cudaError_t err = cudaSuccess;
        const auto full = run_grouped(big, path, guard_ok, err);
        ASSERT_EQ(err, cudaSuccess);
        const auto part = run_grouped(small, path, guard_ok, err);
        ASSERT_EQ(err, cudaSuccess);
        for (const auto& [rs, rb] : map)
          EXPECT_EQ(std::memcmp(part.data() + rs * N, full.data() + rb * N, N * 4), 0)
              << "row " << rb << " of the large batch differs when computed as row " << rs << " of the small one";
      }
    }
  }
}

}  // namespace
}  // namespace ssmserve
