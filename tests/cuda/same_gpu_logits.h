// Owns the GPU check of the quantized-checkpoint tests (tests/cuda/test_cuda_fp8_checkpoint.cpp,
// tests/cuda/test_cuda_int_checkpoint.cpp): two checkpoints' CUDA decoders give bit-identical logits over a hybrid
// schedule (prefill chunks and decode steps).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "hybrid_schedule.h"
#include "model/causal_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve::cudatest {

/// Loads `a_dir` and `b_dir` as CUDA decoders with `wd` weights (--dtype: a quantized checkpoint dequantizes to it)
/// and asserts their logits are bit-identical over six steps of a HybridSchedule.
inline void expect_same_gpu_logits(const std::filesystem::path& a_dir, const std::filesystem::path& b_dir, DType wd) {
  ModelConfig ca = ModelConfig::load(a_dir), cb = ModelConfig::load(b_dir);
  ca.dtype = cb.dtype = wd;  // --dtype: a quantized checkpoint dequantizes to it
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

}  // namespace ssmserve::cudatest
