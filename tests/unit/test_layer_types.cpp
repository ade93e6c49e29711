// Per-layer block types in every spelling transformers uses (model/decoder/layer_types.h), and clear errors for
// malformed ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/decoder/layer_types.h"

namespace ssmserve {
namespace {

using Types = std::vector<std::string>;
using nlohmann::json;

TEST(LayerTypes, EverySpelling) {
  EXPECT_EQ(read_layer_types(json{{"layer_types", {"linear_attention", "full_attention", "linear_attention"}}}, 3, "mamba"),
            (Types{"linear_attention", "attention", "linear_attention"}));
  EXPECT_EQ(read_layer_types(json{{"layer_types", {"mamba", "attention"}}}, 2, "x"), (Types{"mamba", "attention"}));
  EXPECT_EQ(read_layer_types(json{{"layers_block_type", {"mamba", "attention", "mlp", "moe"}}}, 4, "x"),
            (Types{"mamba", "attention", "mlp", "moe"}));
  EXPECT_EQ(read_layer_types(json{{"hybrid_override_pattern", "M-M*-E"}}, 6, "x"),
            (Types{"mamba", "mlp", "mamba", "attention", "mlp", "moe"}));
  EXPECT_EQ(read_layer_types(json{{"attn_type_list", {0, 1, 0}}}, 3, "x"), (Types{"linear_attention", "attention", "linear_attention"}));
  EXPECT_EQ(read_layer_types(json{{"attn_layer_indices", {1, 3}}}, 4, "mamba"), (Types{"mamba", "attention", "mamba", "attention"}));
  EXPECT_EQ(read_layer_types(json{{"attn_layer_period", 4}, {"attn_layer_offset", 2}}, 8, "mamba"),
            (Types{"mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention", "mamba"}));
  EXPECT_EQ(read_layer_types(json::object(), 2, "mamba"), (Types{"mamba", "mamba"}));
  // layer_types wins over the older spellings when both are present (transformers 5 writes both).
  EXPECT_EQ(read_layer_types(json{{"layer_types", {"mamba", "mamba"}}, {"attn_layer_indices", {1}}}, 2, "x"), (Types{"mamba", "mamba"}));
}

TEST(LayerTypes, JambaExpertPlacement) {
  EXPECT_EQ(read_moe_layers(json{{"num_experts", 16}, {"expert_layer_period", 2}, {"expert_layer_offset", 1}}, 4),
            (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(read_moe_layers(json{{"num_experts", 1}}, 2), (std::vector<bool>{false, false}));
  EXPECT_EQ(read_moe_layers(json::object(), 2), (std::vector<bool>{false, false}));
}

void expect_error(const json& j, int L, const std::string& what) {
  try {
    read_layer_types(j, L, "mamba");
    ADD_FAILURE() << "accepted " << j.dump();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(what)) << j.dump();
  }
}

TEST(LayerTypes, MalformedSpellingsNameTheField) {
  expect_error(json{{"layer_types", {"mamba"}}}, 2, "\"layer_types\" must list 2 layer types");
  expect_error(json{{"layer_types", {"mamba", "conv"}}}, 2, "\"layer_types\" entry \"conv\" is not a known layer type");
  expect_error(json{{"layer_types", {"mamba", 3}}}, 2, "entries must be strings");
  expect_error(json{{"layers_block_type", "mamba"}}, 1, "\"layers_block_type\" must list 1 layer types");
  expect_error(json{{"hybrid_override_pattern", "M*"}}, 3, "has 2 characters, expected 3");
  expect_error(json{{"hybrid_override_pattern", "MX"}}, 2, "character 'X' is not one of");
  expect_error(json{{"attn_type_list", {0, 2}}}, 2, "attn_type_list entries must be 0");
  expect_error(json{{"attn_layer_indices", {0, 5}}}, 4, "entry 5 is not a layer index in [0, 4)");
  expect_error(json{{"attn_layer_period", 2}, {"attn_layer_offset", 2}}, 4, "attn_layer_offset 2 must be below attn_layer_period 2");
  expect_error(json{{"attn_layer_period", 0}}, 4, "\"attn_layer_period\" must be an integer >= 1");
}

}  // namespace
}  // namespace ssmserve
