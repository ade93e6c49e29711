// Owns the "every registered architecture has a case" check that the per-architecture suites (prefix caching,
// speculative decoding) run: a new architecture without a small checkpoint or dummy config in their case lists fails.
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "test_util.h"

namespace ssmserve::testing {

/// The registered architectures that none of the case folders' config.json files names. Architectures whose spec
/// another registered one shares (the same layers in another checkpoint wrapper) count as covered by it. Folders
/// without a config.json (a checkpoint not present here) are skipped.
inline std::vector<std::string> uncovered_architectures(const std::vector<std::filesystem::path>& case_dirs) {
  const std::map<std::string, std::string> same_spec = {{"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"},
                                                        {"Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"}};
  std::set<std::string> covered;
  for (const auto& dir : case_dirs) {
    if (!std::filesystem::exists(dir / "config.json")) continue;
    const nlohmann::json cfg = read_json(dir / "config.json");  // (kept alive: the loop walks into it)
    for (const auto& a : cfg.at("architectures")) covered.insert(a.get<std::string>());
  }
  std::vector<std::string> missing;
  for (const std::string& a : supported_architectures()) {
    const auto alias = same_spec.find(a);
    if (!covered.count(a) && (alias == same_spec.end() || !covered.count(alias->second))) missing.push_back(a);
  }
  return missing;
}

}  // namespace ssmserve::testing
