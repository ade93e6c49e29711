// The engine options that the engine hands to its model's config at load (EngineConfig -> load_model ->
// ModelConfig): vLLM's --dtype and --enforce-eager reach the loaded model's config (where a device backend reads them:
// CudaModelOptions::for_model takes the weight dtype and turns CUDA graphs off), on the bundled tiny-mamba (CPU).
#include <gtest/gtest.h>

#include "engine/llm_engine.h"
#include "test_util.h"

namespace ssmserve {
namespace {

EngineConfig tiny_config() {
  EngineConfig cfg;
  cfg.model = testing::model_dir("tiny-mamba");
  cfg.num_threads = 2;
  cfg.device = "cpu";
  return cfg;
}

TEST(EngineModelOptions, EnforceEagerAndDtypeReachTheModelConfig) {
  {
    const LLMEngine e(tiny_config());
    EXPECT_FALSE(e.model_config().enforce_eager) << "CUDA graphs are on by default";
    EXPECT_FALSE(e.model_config().dtype.has_value()) << "--dtype auto";
  }
  EngineConfig cfg = tiny_config();
  cfg.enforce_eager = true;
  cfg.dtype = "float32";
  const LLMEngine e(cfg);
  EXPECT_TRUE(e.model_config().enforce_eager) << "--enforce-eager did not reach the model's config";
  ASSERT_TRUE(e.model_config().dtype.has_value());
  EXPECT_EQ(*e.model_config().dtype, DType::F32);
}

}  // namespace
}  // namespace ssmserve
