// Owns the helpers of the GPU tensor-parallel tests (test_cuda_tp, test_cuda_tp_collectives, test_cuda_tp_spec):
// the skip without 2 GPUs or NCCL, the relative error of TP 2 logits against TP 1's, TP 1 and TP 2 runners of one
// config, and the Mamba-2 dummy shape whose groups split across the two ranks.
#pragma once
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "device/device.h"
#include "model/causal_lm.h"
#include "runtime/cuda_mamba.h"
#include "runtime/nccl_communicator.h"

#define REQUIRE_TWO_GPUS()                                                                   \
  do {                                                                                       \
    if (cuda::device_count() < 2) GTEST_SKIP() << "fewer than 2 CUDA devices";               \
    if (!cuda::nccl_compiled()) GTEST_SKIP() << "built without NCCL";                        \
  } while (0)

namespace ssmserve::cudatest {

/// Relative L2 error of `a` against `b` (infinite when `a` has a NaN).
inline double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

/// TP 1 and TP 2 runners of `cfg` with `wd` weights.
inline std::pair<std::unique_ptr<CausalLM>, std::unique_ptr<CausalLM>> load_one_and_two(const ModelConfig& cfg,
                                                                                        LoadFormat format, DType wd) {
  cuda::CudaModelOptions opt;
  opt.weight_dtype = wd;
  std::unique_ptr<CausalLM> one = cfg.architecture == "MambaForCausalLM" ? cuda::load_mamba_cuda(cfg, format, opt)
                                                                         : cuda::load_mamba2_cuda(cfg, format, opt);
  return {std::move(one), cuda::load_cuda_tensor_parallel(cfg, format, 2, opt)};
}

/// tiny-mamba2's shape with n_groups 8 (split 4 + 4 at TP 2: the GPU's gated norm needs whole groups per rank) and
/// an odd vocabulary (the last vocab shard is short), as config.json in `dir` (dummy weights).
inline void write_mamba2_groups_split(const std::filesystem::path& dir) {
  nlohmann::json j = {{"architectures", {"Mamba2ForCausalLM"}}, {"model_type", "mamba2"}, {"hidden_size", 256},
                      {"num_heads", 8}, {"head_dim", 64}, {"expand", 2}, {"state_size", 64}, {"n_groups", 8},
                      {"num_hidden_layers", 4}, {"conv_kernel", 4}, {"chunk_size", 64}, {"vocab_size", 5001},
                      {"layer_norm_epsilon", 1e-5}, {"tie_word_embeddings", true}, {"eos_token_id", 0}};
  std::ofstream(dir / "config.json") << j.dump(2);
}

}  // namespace ssmserve::cudatest
