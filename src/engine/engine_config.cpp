// Owns EngineConfig's checks (see engine_config.h): every flag's range, named as the CLI spells it (other front ends
// respell the flags: engine/engine_options.h).
#include "engine/engine_config.h"
#include "engine/reasoning.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/error.h"
#include "engine/spec_decode.h"
#include "model/tensor_parallel.h"

namespace ssmserve {

namespace {

/// One --dtype name (vLLM's choices): the weight dtype it selects (nullopt: auto), or why it is refused.
struct DtypeChoice {
  std::string_view name;
  std::optional<DType> dtype;
  std::string_view refused;  ///< non-empty: the name is vLLM's but not supported here
};

constexpr DtypeChoice kDtypeChoices[] = {
    {"auto", std::nullopt, ""},
    {"bfloat16", DType::BF16, ""},
    {"float32", DType::F32, ""},
    {"float", DType::F32, ""},
    {"half", std::nullopt, "fp16 weights are not supported (the kernels run bf16 or fp32 weights)"},
    {"float16", std::nullopt, "fp16 weights are not supported (the kernels run bf16 or fp32 weights)"},
};

}  // namespace

void check_quantization(const std::string& quantization, const ModelConfig& model) {
  if (quantization.empty()) return;
  // vLLM's names, its Marlin kernels' included (the same checkpoints: gptq_marlin reads a gptq checkpoint).
  static const std::pair<const char*, const char*> known[] = {
      {"fp8", "fp8"}, {"compressed-tensors", "compressed-tensors"}, {"modelopt", "modelopt"}, {"gptq", "gptq"},
      {"gptq_marlin", "gptq"}, {"awq", "awq"}, {"awq_marlin", "awq"}};
  const auto it = std::find_if(std::begin(known), std::end(known), [&](const auto& k) { return quantization == k.first; });
  SSM_CHECK(it != std::end(known),
            "--quantization must be fp8, compressed-tensors, modelopt, gptq (gptq_marlin) or awq (awq_marlin): the "
            "quantized checkpoint formats ssmserve loads, got \"{}\"", quantization);
  const std::string method = model.fp8 ? model.fp8->method : model.int_quant ? model.int_quant->method : "";
  SSM_CHECK(!method.empty(), "--quantization {}: {} is not quantized, and ssmserve does not quantize weights at "
            "load (vLLM's online FP8 quantization); give a quantized checkpoint or leave --quantization out", quantization,
            model.dir.string());
  SSM_CHECK(method == it->second, "--quantization {} does not match the checkpoint's quantization_config "
            "(quant_method \"{}\")", quantization, method);
}

std::optional<DType> parse_model_dtype(std::string_view dtype) {
  std::string accepted;
  for (const DtypeChoice& c : kDtypeChoices) {
    if (c.refused.empty()) accepted += (accepted.empty() ? "" : ", ") + std::string(c.name);
  }
  for (const DtypeChoice& c : kDtypeChoices) {
    if (c.name != dtype) continue;
    SSM_CHECK(c.refused.empty(), "--dtype {}: {}; use one of: {}", dtype, c.refused, accepted);
    return c.dtype;
  }
  fail("--dtype must be one of: {} (got \"{}\")", accepted, dtype);
}

int max_num_threads() {
  return std::max(64, 4 * static_cast<int>(std::thread::hardware_concurrency()));
}

void EngineConfig::validate() const {
  SSM_CHECK(scheduler.max_num_batched_tokens >= 1 && scheduler.max_num_batched_tokens <= kMaxNumBatchedTokens,
            "--max-num-batched-tokens must be in [1, {}] (got {})", kMaxNumBatchedTokens, scheduler.max_num_batched_tokens);
  SSM_CHECK(scheduler.max_num_seqs >= 1 && scheduler.max_num_seqs <= kMaxNumSeqs, "--max-num-seqs must be in [1, {}] (got {})",
            kMaxNumSeqs, scheduler.max_num_seqs);
  SSM_CHECK(num_state_blocks == 0 || (num_state_blocks >= 2 && num_state_blocks <= kMaxNumStateBlocks),
            "--num-state-blocks must be 0 (= --max-num-seqs + 1) or in [2, {}] (block 0 is the null block), got {}",
            kMaxNumStateBlocks, num_state_blocks);
  SSM_CHECK(num_threads >= 0 && num_threads <= max_num_threads(),
            "--threads must be in [0, {}] (0 = all cores; this machine has {} hardware threads), got {}", max_num_threads(),
            std::thread::hardware_concurrency(), num_threads);
  SSM_CHECK(tensor_parallel_size >= 1 && tensor_parallel_size <= kMaxTensorParallelSize,
            "--tensor-parallel-size must be in [1, {}] (got {})", kMaxTensorParallelSize, tensor_parallel_size);
  SSM_CHECK(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0,
            "--gpu-memory-utilization must be in (0, 1] (got {})", gpu_memory_utilization);
  SSM_CHECK(max_model_len >= 0, "--max-model-len must be >= 1 tokens, or 0 for the model's context (got {})", max_model_len);
  SSM_CHECK(pad_decode_batches_to >= 0, "pad_decode_batches_to must be >= 0 (got {})", pad_decode_batches_to);
  SSM_CHECK(num_scheduler_steps >= 1 && num_scheduler_steps <= kMaxSchedulerSteps,
            "--num-scheduler-steps must be in [1, {}] (got {})", kMaxSchedulerSteps, num_scheduler_steps);
  (void)parse_model_dtype(dtype);                                              // throws naming --dtype
  (void)StateDtypes::from_options(mamba_cache_dtype, mamba_ssm_cache_dtype);  // throws naming the flag
  SSM_CHECK(mamba_cache_mode == "none" || mamba_cache_mode == "align" || mamba_cache_mode == "all",
            "--mamba-cache-mode must be none, align or all (got \"{}\")", mamba_cache_mode);
  const SpeculativeConfig spec = SpeculativeConfig::parse(speculative_config);  // throws naming the field
  if (!reasoning_parser.empty()) (void)reasoning_format(reasoning_parser);      // throws listing the known names
  SSM_CHECK(!spec.benchmark_only() || allow_benchmark_proposers,
            "--speculative-config: method \"{}\" is a benchmark-only drafter (it replays a recorded continuation at a "
            "chosen acceptance rate); only `ssmserve bench latency --speculative-config ... --replay-acceptance-rates` "
            "runs it. Use method ngram or draft_model", spec.method);
  SSM_CHECK(std::isfinite(swap_space) && swap_space >= 0.0, "--swap-space must be >= 0 GiB (got {})", swap_space);
  SSM_CHECK(mamba_block_size >= 0 && mamba_block_size <= kMaxNumBatchedTokens,
            "--mamba-block-size must be in [1, {}] tokens, or 0 for the model's default (got {})", kMaxNumBatchedTokens,
            mamba_block_size);
}

}  // namespace ssmserve
