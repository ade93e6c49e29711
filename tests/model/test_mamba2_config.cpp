// Hostile Mamba-2 config.json sizes: a clear ssmserve::Error from load_model, never an int overflow (num_heads *
// head_dim, expand * hidden_size) or an absurd dummy-weight allocation. Defective checkpoints (layers read in
// parallel): the error of the lowest defective layer, as a sequential load would report it.
#include <gtest/gtest.h>
#include <omp.h>

#include <functional>
#include <fstream>

#include "checkpoint_fixtures.h"
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

// small_mamba2() with 4 layers as a BF16 checkpoint (zeros; tied embedding) in `dir`, every tensor passed
// through `edit` (return false to leave it out).
void write_mamba2_checkpoint(const std::filesystem::path& dir, const std::function<bool(testing::FixtureTensor&)>& edit) {
  auto j = small_mamba2();
  j["num_hidden_layers"] = 4;
  std::ofstream(dir / "config.json") << j.dump(2);
  const int64_t H = 16, I = 32, C = 64, NH = 4, V = 64;  // conv_dim = d_inner + 2 * n_groups * state_size
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {{"backbone.embeddings.weight", {V, H}},
                                                                       {"backbone.norm_f.weight", {H}}};
  for (int l = 0; l < 4; ++l) {
    const std::string p = "backbone.layers." + std::to_string(l) + ".";
    for (const auto& [n, s] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"norm.weight", {H}}, {"mixer.in_proj.weight", {I + C + NH, H}}, {"mixer.conv1d.weight", {C, 1, 4}},
             {"mixer.conv1d.bias", {C}}, {"mixer.dt_bias", {NH}}, {"mixer.A_log", {NH}}, {"mixer.D", {NH}},
             {"mixer.norm.weight", {I}}, {"mixer.out_proj.weight", {H, I}}})
      shapes.push_back({p + n, s});
  }
  std::vector<testing::FixtureTensor> tensors;
  for (const auto& [name, shape] : shapes) {
    testing::FixtureTensor t = testing::zeros_tensor(name, "BF16", shape, 2);
    if (edit(t)) tensors.push_back(std::move(t));
  }
  testing::write_file(dir / "model.safetensors", testing::SafetensorsImage::build(tensors).serialize());
}

TEST(Mamba2Checkpoint, LowestDefectiveLayerIsReportedOnAnyThreadCountAndTpSize) {
  testing::TempDir tmp("m2-defects");
  write_mamba2_checkpoint(tmp.path(), [](testing::FixtureTensor&) { return true; });
  EXPECT_NO_THROW(load_model(tmp.path(), LoadFormat::Auto, 2));
  // Layer 3 misses in_proj, layer 2 has an I16 D, layer 1's out_proj has the wrong shape: layer 1's error wins.
  write_mamba2_checkpoint(tmp.path(), [](testing::FixtureTensor& t) {
    if (t.name == "backbone.layers.2.mixer.D") t.dtype = "I16";
    if (t.name == "backbone.layers.1.mixer.out_proj.weight") t.shape = {32, 16};
    return t.name != "backbone.layers.3.mixer.in_proj.weight";
  });
  const int saved = omp_get_max_threads();
  for (const int threads : {1, 2, 4})
    for (const int tp : {1, 2}) {
      omp_set_num_threads(threads);
      try {
        load_model(tmp.path(), LoadFormat::Auto, tp);
        ADD_FAILURE() << "defective checkpoint loaded (" << threads << " threads, TP " << tp << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("backbone.layers.1.mixer.out_proj.weight"), std::string::npos)
            << threads << " threads, TP " << tp << ": " << e.what();
      }
    }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace ssmserve
