// FP8 checkpoints on the GPU: the CUDA decoder reads an FP8 checkpoint (tiny-qwen3_next-fp8: DeltaNet, gated
// attention, routed and shared experts) through the same WeightSource dequantization as the CPU, so its logits equal
// those of the same runner on a checkpoint of the dequantized weights bit for bit, with bf16 and with fp32 weights.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"
#include "fp8_fixtures.h"
#include "hybrid_schedule.h"
#include "model/causal_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve {
namespace {

using cudatest::HybridSchedule;

void expect_same_gpu_logits(const std::filesystem::path& a_dir, const std::filesystem::path& b_dir, DType wd) {
  ModelConfig ca = ModelConfig::load(a_dir), cb = ModelConfig::load(b_dir);
  ca.dtype = cb.dtype = wd;  // --dtype: the FP8 checkpoint dequantizes to it
  cuda::CudaModelOptions opt;
  opt.weight_dtype = wd;
  auto ra = cuda::load_cuda_decoder(ca, architecture_spec(ca), LoadFormat::Auto, opt);
  auto rb = cuda::load_cuda_decoder(cb, architecture_spec(cb), LoadFormat::Auto, opt);
  StateCache a(ra->num_state_layers(), ra->state_shape(), 32), b(rb->num_state_layers(), rb->state_shape(), 32);
  HybridSchedule sched(ra->kv_block_size(), 50000, 5);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step << ", weights " << dtype_name(wd));
    ForwardBatch fb = sched.batch(step, *ra);
    std::vector<float> la(fb.logits_indices.size() * ca.vocab_size), lb(la.size());
    ra->forward(fb, a, la.data());
    rb->forward(fb, b, lb.data());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0);
    sched.advance(step);
  }
}

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
