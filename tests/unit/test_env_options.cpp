// The GPU backend's environment switches (core/env_options.h): every switch the backend reads is one read_env
// collects and one docs/environment.md documents. A switch missing from gpu_switch_names() was silently never read
// (SSMSERVE_GDN_WY_GROUPED, session 31); these run without a GPU, so CI catches the next one.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/env_options.h"
#include "test_util.h"

namespace ssmserve {
namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EnvOptions, EverySwitchTheGpuBackendReadsIsCollected) {
  const std::string src = read_file(testing::source_dir() / "src/runtime/cuda_backend.cpp");
  const auto& names = gpu_switch_names();
  const std::regex lit("\"(SSMSERVE_[A-Z0-9_]+)\"");
  std::set<std::string> used;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), lit); it != std::sregex_iterator(); ++it)
    used.insert((*it)[1].str());
  EXPECT_GT(used.size(), 20u) << "cuda_backend.cpp no longer names its switches as literals: update this test";
  for (const auto& n : used)
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end())
        << n << " is read by cuda_backend.cpp but missing from gpu_switch_names() (env_options.cpp)";
}

TEST(EnvOptions, EveryGpuSwitchIsDocumented) {
  const std::string doc = read_file(testing::source_dir() / "docs/environment.md");
  for (const auto& n : gpu_switch_names())
    EXPECT_NE(doc.find("`" + n), std::string::npos) << n << " is not in docs/environment.md";
}

// Every variable env_options.cpp reads (the CPU / engine fields of EnvOptions, SSMSERVE_CPU_ISA included, and the
// GPU list) has its row in docs/environment.md.
TEST(EnvOptions, EverySwitchReadIsDocumented) {
  const std::string src = read_file(testing::source_dir() / "src/core/env_options.cpp");
  const std::string doc = read_file(testing::source_dir() / "docs/environment.md");
  const std::regex lit("\"(SSMSERVE_[A-Z0-9_]+)\"");
  int n = 0;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), lit); it != std::sregex_iterator(); ++it, ++n)
    EXPECT_NE(doc.find("`" + (*it)[1].str()), std::string::npos) << (*it)[1].str() << " is not in docs/environment.md";
  EXPECT_GT(n, 30) << "env_options.cpp no longer names its switches as literals: update this test";
}

TEST(EnvOptions, AnUnlistedGpuSwitchIsALogicError) {
  EnvOptions o;
  EXPECT_FALSE(o.gpu_value("SSMSERVE_CUDA_GRAPHS").has_value());
  o.gpu["SSMSERVE_CUDA_GRAPHS"] = "0";
  EXPECT_EQ(o.gpu_value("SSMSERVE_CUDA_GRAPHS"), "0");
  try {
    o.gpu_value("SSMSERVE_NOT_A_SWITCH");
    ADD_FAILURE() << "an unlisted name was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("SSMSERVE_NOT_A_SWITCH"), std::string::npos);
  }
}

}  // namespace
}  // namespace ssmserve
