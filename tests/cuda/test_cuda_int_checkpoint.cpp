// GPTQ / AWQ checkpoints on the GPU: the CUDA decoder reads a GPTQ or AWQ checkpoint (the tiny Qwen3-Next model of
// int_quant_fixtures.h: DeltaNet, gated attention, routed and shared experts) through the same WeightSource
// dequantization as the CPU, so its logits equal those of the same runner on a checkpoint of the dequantized weights
// bit for bit, with bf16 and with fp32 weights.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "int_quant_fixtures.h"
#include "same_gpu_logits.h"

namespace ssmserve {
namespace {

using cudatest::expect_same_gpu_logits;

TEST(CudaIntCheckpoint, EqualsItsDequantizedCheckpoint) {
  REQUIRE_GPU();
  for (const testing::Scheme& s : {testing::gptq(4, 32, false, true, true), testing::awq(32)}) {
    SCOPED_TRACE("quantization_config " + s.config.dump());
    testing::TempDir q("cint"), ref32("cintref32"), ref16("cintref16");
    testing::write_quantized_pair(s, q.path(), ref32.path());
    testing::write_bf16_copy(ref32.path(), ref16.path());
    expect_same_gpu_logits(q.path(), ref16.path(), DType::BF16);
    expect_same_gpu_logits(q.path(), ref32.path(), DType::F32);
  }
}

}  // namespace
}  // namespace ssmserve
