// Config fields read loosely before (from a break test): a config with model_type but no architectures maps to the
// class transformers would pick; a mistyped hidden_act or rope_parameters is an error naming the field, not silently
// the default.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "config/model_config.h"
#include "core/error.h"
#include "model/decoder/decoder_spec.h"
#include "test_util.h"

namespace ssmserve {
namespace {

using ::testing::HasSubstr;

nlohmann::json tiny_minimax() {
  std::ifstream in(testing::source_dir() / "tests/cuda/configs/tiny-minimax/config.json");
  return nlohmann::json::parse(in);
}

std::string spec_error(const nlohmann::json& j) {
  try {
    (void)architecture_spec(ModelConfig::from_json(j));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigSpellings, ModelTypeStandsInForArchitectures) {
  nlohmann::json j = tiny_minimax();
  j.erase("architectures");
  EXPECT_EQ(ModelConfig::from_json(j).architecture, "MiniMaxForCausalLM");
  // The Mamba hybrids' model_type names (transformers' CONFIG_MAPPING keys).
  for (const auto& [type, arch] : std::vector<std::pair<std::string, std::string>>{
           {"granitemoehybrid", "GraniteMoeHybridForCausalLM"}, {"bamba", "BambaForCausalLM"},
           {"nemotron_h", "NemotronHForCausalLM"}, {"jamba", "JambaForCausalLM"}, {"falcon_h1", "FalconH1ForCausalLM"}}) {
    j["model_type"] = type;
    EXPECT_EQ(ModelConfig::from_json(j).architecture, arch) << type;
  }
  j["model_type"] = "llama";
  try {
    (void)ModelConfig::from_json(j);
    ADD_FAILURE() << "unknown model_type accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model_type \"llama\" names no supported architecture"));
  }
}

TEST(ConfigSpellings, MistypedFieldsAreErrors) {
  nlohmann::json j = tiny_minimax();
  EXPECT_EQ(spec_error(j), "");
  j["hidden_act"] = 3;
  EXPECT_THAT(spec_error(j), HasSubstr("field \"hidden_act\" must be a string"));
  j = tiny_minimax();
  j["rope_parameters"] = "default";
  EXPECT_THAT(spec_error(j), HasSubstr("field \"rope_parameters\" must be an object"));
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  EXPECT_EQ(spec_error(j), "");
}

}  // namespace
}  // namespace ssmserve
