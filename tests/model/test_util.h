// Owns helpers shared by the model-level tests: where the bundled and shared models live, JSON loading.
#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ssmserve::testing {

/// The repository root: $SSMSERVE_SOURCE_DIR when set (prebuilt test binaries run from another checkout, e.g. on
/// the GPU machine), else the source tree the test was built from (compile-time).
inline std::filesystem::path source_dir() {
  if (const char* e = std::getenv("SSMSERVE_SOURCE_DIR"); e && *e) return e;
  return SSMSERVE_SOURCE_DIR;
}

/// Folder holding the small checkpoints: $SSMSERVE_MODELS_DIR, default <repo>/../shared/models.
inline std::filesystem::path shared_models_dir() {
  if (const char* d = std::getenv("SSMSERVE_MODELS_DIR")) return d;
  return source_dir().parent_path() / "shared" / "models";
}

/// Path of model `name`: the bundled copy under models/ if present, else the shared folder.
inline std::filesystem::path model_dir(const std::string& name) {
  const auto bundled = source_dir() / "models" / name;
  if (std::filesystem::exists(bundled / "config.json")) return bundled;
  return shared_models_dir() / name;
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return nlohmann::json::parse(in);
}

}  // namespace ssmserve::testing

/// Skips the test (with a message naming what is missing) when `dir` has no config.json.
#define SSM_SKIP_IF_NO_MODEL(dir)                                                                       \
  if (!std::filesystem::exists((dir) / "config.json"))                                                  \
  GTEST_SKIP() << "model not found: " << (dir).string()                                                 \
               << " (set SSMSERVE_MODELS_DIR to the folder holding the small checkpoints)"
