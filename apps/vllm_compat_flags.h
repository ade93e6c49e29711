// Owns the vLLM `serve` flags ssmserve accepts so that vLLM command lines run unchanged although they change nothing
// here (CUDA graphs, schedulers, distributed back ends and downloads that ssmserve does not have or does not need),
// and the rewriting of vLLM's argument spellings (-tp, -O3, --max_model_len) into ssmserve's.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ssmserve::cli {

/// The values of vLLM flags that have no effect in ssmserve (each named as in vLLM's EngineArgs / FrontendArgs).
struct VllmCompatFlags {
  bool trust_remote_code = false, disable_fastapi_docs = false, enable_log_requests = false,
       disable_custom_all_reduce = false, enable_prompt_tokens_details = false, async_scheduling = false,
       disable_async_output_proc = false, enable_chunked_prefill = true;
  std::string uvicorn_log_level = "info", kv_cache_dtype = "auto", tokenizer_mode = "auto",
              distributed_executor_backend, scheduling_policy = "fcfs", response_role = "assistant", revision,
              tokenizer_revision, code_revision, download_dir, compilation_config;
  int pipeline_parallel_size = 1, data_parallel_size = 1, max_num_partial_prefills = 1, max_log_len = 0,
      max_seq_len_to_capture = 8192;
};

/// Adds the flags of VllmCompatFlags to `cmd`, bound to `f`.
void add_vllm_compat_flags(CLI::App& cmd, VllmCompatFlags& f);

/// Errors (ssmserve::Error naming the flag) for values that would change what vLLM does in a way ssmserve cannot
/// follow (e.g. --kv-cache-dtype fp8, --pipeline-parallel-size 2, --scheduling-policy priority).
void check_vllm_compat_flags(const VllmCompatFlags& f);

/// vLLM's argument spellings rewritten in place into ssmserve's, before CLI11 parses them (vLLM's
/// FlexibleArgumentParser): `-tp N` / `-pp N` / `-dp N` (--tensor- / --pipeline- / --data-parallel-size), `-O3` /
/// `-O 3` / `-O.x=y` (--compilation-config), and underscores in a long flag's name (`--max_model_len=8`). Arguments
/// after a bare `--` and every other word are left alone.
void rewrite_vllm_argument_spellings(std::vector<std::string>& args);

/// vLLM's bench `--dataset-name` (random | custom) and `--dataset-path` as ssmserve's dataset: "random", or the
/// custom JSONL file's path. `dataset_given`: ssmserve's --dataset was given too. Throws Error naming the flags for
/// another name, custom without a path, a path with random, or both spellings at once.
std::string resolve_vllm_dataset(const std::string& name, const std::string& path, bool dataset_given);

}  // namespace ssmserve::cli
