// Hostile Mamba-2 config.json sizes: a clear ssmserve::Error from load_model, never an int overflow (num_heads *
// head_dim, expand * hidden_size) or an absurd dummy-weight allocation.
#include <gtest/gtest.h>

#include "config/model_config.h"
#include "core/error.h"
#include "model/causal_lm.h"

namespace ssmserve {
namespace {

nlohmann::json small_mamba2() {
  return {{"architectures", {"Mamba2ForCausalLM"}}, {"model_type", "mamba2"}, {"hidden_size", 16}, {"num_heads", 4},
          {"head_dim", 8}, {"state_size", 8}, {"n_groups", 2}, {"num_hidden_layers", 1}, {"conv_kernel", 4},
          {"chunk_size", 8}, {"vocab_size", 64}, {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true},
          {"eos_token_id", 0}};
}

void expect_error(const nlohmann::json& j, const std::string& what) {
  try {
    load_model(ModelConfig::from_json(j), LoadFormat::Dummy);
    ADD_FAILURE() << "no error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << what << ": " << e.what();
  }
}

TEST(Mamba2Config, HostileSizesGiveClearErrors) {
  EXPECT_NO_THROW(load_model(ModelConfig::from_json(small_mamba2()), LoadFormat::Dummy));
  auto j = small_mamba2();
  j["num_heads"] = 65536, j["head_dim"] = 65536, j["n_groups"] = 1;  // 2^32 wraps an int to 0
  expect_error(j, "num_heads * head_dim = 2^32");
  j = small_mamba2();
  j["hidden_size"] = 1 << 23, j["expand"] = 1 << 10;  // 2^33 wraps to 0
  expect_error(j, "expand * hidden_size = 2^33");
  j = small_mamba2();
  j["state_size"] = (1 << 24) - 1;  // in_proj of 2^25 rows
  expect_error(j, "state_size 2^24 - 1");
  j = small_mamba2();
  j["n_groups"] = 0;
  expect_error(j, "n_groups 0");
  j = small_mamba2();
  j["n_groups"] = 3;
  expect_error(j, "n_groups 3 of 4 heads");
}

}  // namespace
}  // namespace ssmserve
