// GPTQ / AWQ checkpoints on the GPU: the CUDA decoder reads a GPTQ or AWQ checkpoint (the tiny Qwen3-Next model of
// int_quant_fixtures.h: DeltaNet, gated attention, routed and shared experts) through the same WeightSource
// dequantization as the CPU, so its logits equal those of the same runner on a checkpoint of the dequantized weights
// bit for bit, with bf16 and with fp32 weights.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"
#include "hybrid_schedule.h"
#include "int_quant_fixtures.h"
#include "model/causal_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve {
namespace {

using cudatest::HybridSchedule;

void expect_same_gpu_logits(const std::filesystem::path& a_dir, const std::filesystem::path& b_dir, DType wd) {
  ModelConfig ca = ModelConfig::load(a_dir), cb = ModelConfig::load(b_dir);
  ca.dtype = cb.dtype = wd;  // --dtype: the quantized checkpoint dequantizes to it
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
