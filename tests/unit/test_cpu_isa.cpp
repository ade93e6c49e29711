// The CPU kernels' instruction-set variants (kernels/cpu/isa/cpu_isa.h): the run-time choice (the widest variant the
// CPU and its OS run, or SSMSERVE_CPU_ISA), and every runnable variant of this build against the scalar one, the
// reference: the GEMMs bit for bit (each output element is the same FMA chain, or the same 16-lane sum, in every
// variant), whole models within rounding (the other kernels are one source compiled per variant; FMA contraction and
// the vector width's split of reductions differ). A portable build (SSMSERVE_NATIVE=OFF) compares avx512 and avx2 with
// scalar on a machine that runs them; a native build compares native with scalar.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/env_options.h"
#include "core/error.h"
#include "engine/llm_engine.h"
#include "kernels/cpu/isa/cpu_isa.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/small_gemm.h"
#include "test_util.h"

namespace ssmserve::cpu {
namespace {

/// Runs the enclosing scope's kernel calls on `isa`, then restores the variant active before.
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa isa) : saved_(cpu_isa()) { set_cpu_isa(isa); }
  ~ScopedCpuIsa() { set_cpu_isa(saved_); }
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  CpuIsa saved_;
};

/// The variants of this build other than scalar that this machine runs (compared against scalar below).
std::vector<CpuIsa> vector_variants() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : compiled_cpu_isas())
    if (isa != CpuIsa::Scalar && cpu_isa_runnable(isa)) v.push_back(isa);
  return v;
}

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(CpuIsa, ActiveVariantIsTheWidestRunnableOrTheForcedOne) {
  const CpuIsa active = cpu_isa();
  EXPECT_TRUE(cpu_isa_runnable(active));
  EXPECT_NE(cpu_isa_summary().find(cpu_isa_name(active)), std::string::npos) << cpu_isa_summary();
  const std::string& forced = env_options().cpu_isa;
  if (!forced.empty() && forced != "auto") {
    EXPECT_EQ(cpu_isa_name(active), forced);
    return;
  }
  const CpuFeatures& f = cpu_features();
  const CpuIsa widest = cpu_isa_runnable(CpuIsa::Native) ? CpuIsa::Native
                        : f.x86_64_v4                    ? CpuIsa::Avx512
                        : f.x86_64_v3                    ? CpuIsa::Avx2
                                                         : CpuIsa::Scalar;
  EXPECT_EQ(active, widest) << cpu_isa_summary();
}

TEST(CpuIsa, ScalarIsAlwaysThereAndLevelsNest) {
  const auto compiled = compiled_cpu_isas();
  EXPECT_NE(std::find(compiled.begin(), compiled.end(), CpuIsa::Scalar), compiled.end());
  EXPECT_TRUE(cpu_isa_runnable(CpuIsa::Scalar));
  EXPECT_TRUE(!cpu_features().x86_64_v4 || cpu_features().x86_64_v3) << "x86-64-v4 without x86-64-v3";
  // A variant the build lacks is refused, naming what the build has.
  const CpuIsa absent = cpu_isa_runnable(CpuIsa::Native) ? CpuIsa::Avx512 : CpuIsa::Native;
  try {
    set_cpu_isa(absent);
    ADD_FAILURE() << "set_cpu_isa accepted " << cpu_isa_name(absent);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scalar"), std::string::npos) << e.what();
  }
}

/// Whether the disassembled instruction `line` ("  401a2c:\tvfmadd231ps %ymm1,%ymm2,%ymm0") needs more than
/// baseline x86-64: a VEX / EVEX instruction (the v prefix), a ymm / zmm / mask register, or BMI / LZCNT / MOVBE.
bool beyond_baseline(const std::string& line) {
  const size_t tab = line.find('\t');
  if (tab == std::string::npos) return false;
  const std::string insn = line.substr(tab + 1);
  static const char* kBmi[] = {"andn ", "bextr ", "blsi ", "blsmsk ", "blsr ", "bzhi ", "pdep ", "pext ", "rorx ",
                               "sarx ", "shlx ", "shrx ", "mulx ", "lzcnt ", "movbe "};
  if (insn.starts_with('v')) return true;
  for (const char* b : kBmi)
    if (insn.starts_with(b)) return true;
  return insn.find("%ymm") != std::string::npos || insn.find("%zmm") != std::string::npos ||
         insn.find("%k") != std::string::npos;
}

// The portable build's guarantee that it runs on any x86-64 CPU (kernels/cpu/isa/variant.h): in the linked program
// (this test binary links the whole engine) every function using more than baseline x86-64 belongs to the avx2 or
// avx512 variant (or is an OpenMP SIMD clone, whose name carries its ISA), and the avx2 variant's use no AVX-512.
TEST(CpuIsa, VectorInstructionsStayInTheirVariants) {
  if (cpu_isa_runnable(CpuIsa::Native)) GTEST_SKIP() << "a native build is compiled for this machine throughout";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();  // not the shell's own
  FILE* p = popen(("objdump -d --no-show-raw-insn '" + self + "' 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string fn, line;
  int functions = 0, leaks = 0;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    line.assign(buf);
    if (line.size() > 20 && line[16] == ' ' && line[17] == '<' && line.ends_with(">:\n")) {
      fn = line.substr(18, line.size() - 21), ++functions;
      continue;
    }
    if (fn.empty() || !beyond_baseline(line)) continue;
    const bool avx2 = fn.find("8isa_avx2") != std::string::npos, avx512 = fn.find("10isa_avx512") != std::string::npos;
    const bool evex = line.find("%zmm") != std::string::npos || line.find("%k") != std::string::npos;
    if ((avx512 || fn.starts_with("_ZGV")) || (avx2 && !evex)) continue;
    if (++leaks <= 10) ADD_FAILURE() << fn << ": " << line;
    fn.clear();  // one report per function
  }
  pclose(p);
  if (functions == 0) GTEST_SKIP() << "objdump is not available";
  std::printf("%d functions disassembled\n", functions);
  EXPECT_EQ(leaks, 0) << "functions outside the avx2 / avx512 variants use instructions beyond baseline x86-64";
}

/// A [N, K] weight of random values in `dtype`, packed for the panel kernel when `packed`.
Weight random_weight(DType dtype, int64_t N, int64_t K, bool packed, std::mt19937& rng) {
  Weight w = Weight::allocate(dtype, N, K);
  const auto vals = randn(static_cast<size_t>(N * K), rng);
  for (int64_t i = 0; i < N * K; ++i) {
    if (dtype == DType::BF16) reinterpret_cast<uint16_t*>(w.owned->data())[i] = f32_to_bf16(vals[i]);
    else reinterpret_cast<float*>(w.owned->data())[i] = vals[i];
  }
  if (packed) pack_for_linear(w);
  return w;
}

// linear's row-major kernel (the 16-lane sums; bf16 weights widened from 12 rows on) and its panel kernel (one
// chain per element), every tile shape and k tail, with and without bias: the same bits in every variant.
TEST(CpuIsa, LinearIsBitIdenticalInEveryVariant) {
  const auto variants = vector_variants();
  if (variants.empty()) GTEST_SKIP() << "this machine runs the scalar variant only";
  std::mt19937 rng(11);
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool packed : {false, true})
      for (int64_t K : {64, 131})
        for (int64_t M : {1, 2, 3, 5, 7, 12, 13, 40}) {
          const int64_t N = 77, x_stride = K + 3, y_stride = N + 2;
          SCOPED_TRACE(fmt::format("{} {} K {} M {}", dtype_name(dtype), packed ? "packed" : "row-major", K, M));
          const Weight w = random_weight(dtype, N, K, packed, rng);
          const auto x = randn(static_cast<size_t>(M * x_stride), rng), bias = randn(N, rng);
          const float* b = M % 2 ? bias.data() : nullptr;
          std::vector<float> want(M * y_stride, -1.0f);
          {
            ScopedCpuIsa s(CpuIsa::Scalar);
            linear(x.data(), M, x_stride, w, b, want.data(), y_stride);
          }
          for (CpuIsa isa : variants) {
            ScopedCpuIsa s(isa);
            std::vector<float> got(M * y_stride, -1.0f);
            linear(x.data(), M, x_stride, w, b, got.data(), y_stride);
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
                  << cpu_isa_name(isa) << " element " << i << ": " << got[i] << " vs scalar " << want[i];
          }
        }
}

// small_gemm (the SSD's chunk products): A through a transposed view, every row tile and column tail.
TEST(CpuIsa, SmallGemmIsBitIdenticalInEveryVariant) {
  const auto variants = vector_variants();
  if (variants.empty()) GTEST_SKIP() << "this machine runs the scalar variant only";
  std::mt19937 rng(12);
  for (int64_t K : {0, 1, 37})
    for (int64_t M : {1, 5, 6, 7, 12, 13, 30})
      for (int64_t N : {1, 8, 15, 16, 17, 31, 32, 33, 70}) {
        SCOPED_TRACE(fmt::format("M {} N {} K {}", M, N, K));
        const int64_t ldb = N + 1, ldc = N + 2;
        const auto A = randn(static_cast<size_t>(std::max<int64_t>(K, 1) * M), rng);  // A[m, k] at A[k * M + m]
        const auto B = randn(static_cast<size_t>(std::max<int64_t>(K, 1) * ldb), rng);
        std::vector<float> want(M * ldc, -1.0f);
        {
          ScopedCpuIsa s(CpuIsa::Scalar);
          small_gemm(M, N, K, A.data(), 1, M, B.data(), ldb, want.data(), ldc);
        }
        for (CpuIsa isa : variants) {
          ScopedCpuIsa s(isa);
          std::vector<float> got(M * ldc, -1.0f);
          small_gemm(M, N, K, A.data(), 1, M, B.data(), ldb, got.data(), ldc);
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
                << cpu_isa_name(isa) << " element " << i << ": " << got[i] << " vs scalar " << want[i];
        }
      }
}

// Whole models (every kernel their layers use: conv, scans, SSD, lightning, gated delta, attention, norms, MoE):
// greedy outputs and logprobs of each variant against scalar. Measured worst logprob gap over these models: see
// kTol's comment.
struct ModelCase {
  std::string name;
  bool dummy = false;  // tests/data/tiny-hybrids/<name> with dummy weights
};
std::ostream& operator<<(std::ostream& os, const ModelCase& m) { return os << m.name; }

class CpuIsaModels : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CpuIsaModels, VariantsMatchScalarWithinRounding) {
  // Logprob gaps to scalar, measured on a portable build (avx512 / avx2 vs scalar, all models below): up to 2e-5.
  constexpr double kTol = 2e-4;
  const auto variants = vector_variants();
  if (variants.empty()) GTEST_SKIP() << "this machine runs the scalar variant only";
  const ModelCase& mc = GetParam();
  EngineConfig cfg;
  cfg.model = mc.dummy ? testing::source_dir() / "tests/data/tiny-hybrids" / mc.name : testing::model_dir(mc.name);
  SSM_SKIP_IF_NO_MODEL(cfg.model);
  if (mc.dummy) cfg.load_format = LoadFormat::Dummy;
  SamplingParams sp;
  sp.temperature = 0.0;
  sp.ignore_eos = true;
  sp.max_tokens = 8;
  sp.logprobs = 1;
  sp.prompt_logprobs = 1;
  std::mt19937 rng(3);
  std::vector<std::vector<int>> prompts;
  for (int len : {1, 9, 70}) {
    std::vector<int> p(len);
    for (int& t : p) t = 1 + static_cast<int>(rng() % 200);
    prompts.push_back(p);
  }
  auto run = [&](CpuIsa isa) {
    ScopedCpuIsa s(isa);
    LLM llm(cfg);
    return llm.generate_ids(prompts, sp);
  };
  const auto want = run(CpuIsa::Scalar);
  for (CpuIsa isa : variants) {
    SCOPED_TRACE(cpu_isa_name(isa));
    const auto got = run(isa);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t r = 0; r < got.size(); ++r) {
      for (size_t i = 1; i < want[r].prompt_logprobs.size(); ++i) {
        const double a = got[r].prompt_logprobs.at(i)->token_logprob, b = want[r].prompt_logprobs[i]->token_logprob;
        worst = std::max(worst, std::abs(a - b));
        EXPECT_NEAR(a, b, kTol) << "prompt " << r << " position " << i;
      }
      const auto &g = got[r].outputs.at(0), &w = want[r].outputs.at(0);
      ASSERT_EQ(g.token_ids.size(), w.token_ids.size());
      for (size_t s = 0; s < w.token_ids.size(); ++s) {
        const double a = g.logprobs.at(s).at(0).logprob, b = w.logprobs.at(s).at(0).logprob;
        worst = std::max(worst, std::abs(a - b));
        EXPECT_NEAR(a, b, kTol) << "prompt " << r << " step " << s;
        if (g.token_ids[s] != w.token_ids[s]) break;  // a near-tie may flip the greedy pick; the rest then differs
      }
    }
    std::printf("%s vs scalar: worst logprob gap %.3g\n", cpu_isa_name(isa), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CpuIsaModels,
                         ::testing::Values(ModelCase{"tiny-mamba"}, ModelCase{"tiny-mamba2"}, ModelCase{"tiny-minimax"},
                                           ModelCase{"tiny-granitemoehybrid"}, ModelCase{"tiny-nemotron_h"},
                                           ModelCase{"tiny-qwen3_5_moe"}, ModelCase{"tiny-jamba", true},
                                           ModelCase{"tiny-falcon_h1", true}, ModelCase{"tiny-qwen3_5", true}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace ssmserve::cpu
