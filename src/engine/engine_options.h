// Owns the engine options' names per front end: the CLI's flags and the Python LLM(...) keywords (vLLM's EngineArgs
// names), and the rewrite of engine error messages from the one spelling to the other.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace ssmserve {

/// One engine option as the front ends spell it. `name`: vLLM's EngineArgs name, the Python LLM(...) keyword
/// (snake_case); `flag`: the CLI flag. `negated`: the flag sets the option to false ("--no-enable-prefix-caching").
struct EngineOptionName {
  std::string_view name;
  std::string_view flag;
  bool negated = false;
};

/// Every engine option a front end sets (EngineConfig's knobs). Engine error messages name an option by its CLI flag
/// ("--mamba-block-size must be ..."), so the CLI shows them as they are; another front end rewrites them with
/// respell_engine_options (the Python package: "mamba_block_size must be ...").
inline constexpr EngineOptionName kEngineOptionNames[] = {
    {"model", "--model"},
    {"tokenizer", "--tokenizer"},
    {"load_format", "--load-format"},
    {"dtype", "--dtype"},
    {"enforce_eager", "--enforce-eager"},
    {"quantization", "--quantization"},
    {"max_num_batched_tokens", "--max-num-batched-tokens"},
    {"max_num_seqs", "--max-num-seqs"},
    {"num_state_blocks", "--num-state-blocks"},
    {"threads", "--threads"},
    {"tensor_parallel_size", "--tensor-parallel-size"},
    {"max_model_len", "--max-model-len"},
    {"mamba_cache_dtype", "--mamba-cache-dtype"},
    {"mamba_ssm_cache_dtype", "--mamba-ssm-cache-dtype"},
    {"gpu_memory_utilization", "--gpu-memory-utilization"},
    {"device", "--device"},
    {"num_scheduler_steps", "--num-scheduler-steps"},
    {"enable_prefix_caching", "--enable-prefix-caching"},
    {"enable_prefix_caching", "--no-enable-prefix-caching", true},
    {"mamba_cache_mode", "--mamba-cache-mode"},
    {"swap_space", "--swap-space"},
    {"speculative_config", "--speculative-config"},
    {"mamba_block_size", "--mamba-block-size"},
    {"reasoning_parser", "--reasoning-parser"},
    {"generation_config", "--generation-config"},
    {"override_generation_config", "--override-generation-config"},
};

/// `message` with each engine option's CLI flag (kEngineOptionNames) replaced by spell(option). A flag is replaced
/// only as a whole word ("--max-num-seqs" not inside "--max-num-seqs-per-request") and only outside `...` and "..."
/// spans (a quoted command line or value keeps its text). Other text is unchanged. Example, with spell returning the
/// name: "--mamba-block-size 3 must be a multiple of 8" -> "mamba_block_size 3 must be a multiple of 8".
std::string respell_engine_options(std::string_view message,
                                   const std::function<std::string(const EngineOptionName&)>& spell);

}  // namespace ssmserve
