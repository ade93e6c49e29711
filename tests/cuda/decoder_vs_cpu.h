// Owns check_decoder_against_cpu: the GPU decoder against the CPU decoder over HybridSchedule's six steps (ragged
// prefills, a continuing prefill, padded decodes), shared by the hybrid, Qwen-module and head_dim-256 GPU tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "hybrid_schedule.h"
#include "model/decoder/decoder_lm.h"
#include "runtime/cuda_decoder.h"

namespace ssmserve::cudatest {

/// What check_decoder_against_cpu compares: `label` names the printed lines; `vocab` is the config's; `seed` draws
/// the schedule's token ids; `tol` bounds the logits' relative error at every step and `median_tol` (> 0) the median
/// over the six steps.
struct DecoderCheck {
  const char* label = "";
  int vocab = 0;
  unsigned seed = 0;
  double tol = 0.0;
  double median_tol = 0.0;
};

/// The GPU runner against the CPU decoder (dummy weights of cfg / spec, options opt). bf16 weights: the reference is
/// the CPU decoder in its GPU reference mode (ModelConfig::round_gemm_inputs_bf16), and the error against the plain
/// CPU decoder (fp32 activations) is printed beside it, not checked.
inline void check_decoder_against_cpu(const ModelConfig& cfg, const DecoderSpec& spec, cuda::CudaModelOptions opt,
                                      const DecoderCheck& c) {
  const bool bf16 = opt.weight_dtype == DType::BF16;
  ModelConfig ref_cfg = cfg;
  ref_cfg.round_gemm_inputs_bf16 = bf16;
  auto cpu = load_decoder(ref_cfg, spec, LoadFormat::Dummy);
  auto plain = bf16 ? load_decoder(cfg, spec, LoadFormat::Dummy) : nullptr;
  auto gpu = cuda::load_cuda_decoder(cfg, spec, LoadFormat::Dummy, opt);
  ASSERT_EQ(gpu->kv_block_size(), cpu->kv_block_size());
  ASSERT_EQ(gpu->num_state_layers(), cpu->num_state_layers());
  const int blocks = HybridSchedule::pool_blocks(cpu->kv_block_size());
  StateCache cc(1, cpu->state_shape(), blocks), gc(1, gpu->state_shape(), blocks), pc(1, cpu->state_shape(), blocks);
  HybridSchedule sched(cpu->kv_block_size(), c.vocab, c.seed);
  std::vector<double> errs;
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    ForwardBatch b = sched.batch(step, *cpu);
    std::vector<float> lc(b.logits_indices.size() * static_cast<size_t>(c.vocab)), lg(lc.size());
    cpu->forward(b, cc, lc.data());
    gpu->forward(b, gc, lg.data());
    const double e = logits_rel_err(lg, lc);
    double e_plain = -1;  // bf16: against the fp32-activation CPU decoder
    if (bf16) {
      std::vector<float> lp(lc.size());
      plain->forward(b, pc, lp.data());
      e_plain = logits_rel_err(lg, lp);
    }
    std::printf("%s %s step %d: %zu rows, logits rel err %.3g (fp32 activations: %.3g)\n", c.label,
                bf16 ? "bf16" : "f32", step, b.logits_indices.size(), e, e_plain);
    EXPECT_LT(e, c.tol);
    errs.push_back(e);
    sched.advance(step);
  }
  if (c.median_tol > 0) {
    std::sort(errs.begin(), errs.end());
    const double median = (errs[2] + errs[3]) / 2;
    std::printf("%s median logits rel err %.3g\n", c.label, median);
    EXPECT_LT(median, c.median_tol) << "median over the steps";
  }
}

}  // namespace ssmserve::cudatest
