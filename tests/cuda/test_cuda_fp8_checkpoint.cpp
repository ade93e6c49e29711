// FP8 checkpoints on the GPU: the CUDA decoder reads an FP8 checkpoint (tiny-qwen3_next-fp8: DeltaNet, gated
// attention, routed and shared experts) through the same WeightSource dequantization as the CPU, so its logits equal
// those of the same runner on a checkpoint of the dequantized weights bit for bit, with bf16 and with fp32 weights.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"
#include "fp8_fixtures.h"
#include "same_gpu_logits.h"
#include "model/causal_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve {
namespace {

using cudatest::expect_same_gpu_logits;

TEST(CudaFp8Checkpoint, EqualsItsDequantizedCheckpoint) {
  REQUIRE_GPU();
  testing::TempDir fp8("cfp8"), ref16("cfp8ref16"), ref32("cfp8ref32");
  testing::write_fp8_model(fp8.path(), testing::fp8_config(nlohmann::json::array({48, 40})));
  testing::write_dequantized_copy(fp8.path(), ref16.path(), "BF16");
  testing::write_dequantized_copy(fp8.path(), ref32.path(), "F32");
  expect_same_gpu_logits(fp8.path(), ref16.path(), DType::BF16);
  expect_same_gpu_logits(fp8.path(), ref32.path(), DType::F32);
}

}  // namespace
}  // namespace ssmserve
