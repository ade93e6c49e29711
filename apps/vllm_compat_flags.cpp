// Owns the vLLM flags and argument spellings ssmserve accepts for vLLM command lines (see vllm_compat_flags.h).
#include "apps/vllm_compat_flags.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cctype>

#include "core/error.h"

namespace ssmserve::cli {

void add_vllm_compat_flags(CLI::App& cmd, VllmCompatFlags& f) {
  const std::string none = " (accepted for vLLM command lines; no effect in ssmserve)";
  cmd.add_flag("--trust-remote-code", f.trust_remote_code, "vLLM's: run a checkpoint's own Python code" + none);
  cmd.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.enable_chunked_prefill,
               "vLLM's chunked prefill switch" + none + ": prefill is always chunked, with the same results");
  cmd.add_flag("--enable-prompt-tokens-details", f.enable_prompt_tokens_details,
               "vLLM's: usage.prompt_tokens_details (cached tokens)" + none + ": always sent");
  cmd.add_flag("--disable-fastapi-docs", f.disable_fastapi_docs, "vLLM's: no /docs pages" + none + ": there are none");
  cmd.add_flag("--enable-log-requests", f.enable_log_requests, "vLLM's request logging" + none);
  cmd.add_flag("--disable-custom-all-reduce", f.disable_custom_all_reduce, "vLLM's all-reduce switch" + none);
  cmd.add_flag("--async-scheduling", f.async_scheduling, "vLLM's scheduler switch" + none);
  cmd.add_flag("--disable-async-output-proc", f.disable_async_output_proc, "vLLM's output switch" + none);
  cmd.add_option("--uvicorn-log-level", f.uvicorn_log_level, "vLLM's HTTP log level" + none + " (see --log-level)")
      ->check(CLI::IsMember({"critical", "error", "warning", "info", "debug", "trace"}));
  cmd.add_option("--max-log-len", f.max_log_len, "vLLM's logged prompt length" + none + ": prompts are never logged");
  cmd.add_option("--max-seq-len-to-capture", f.max_seq_len_to_capture, "vLLM's CUDA graph limit" + none);
  cmd.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "vLLM's attention KV cache dtype: auto only (the attention layers' KV is kept as the engine runs them)");
  cmd.add_option("--tokenizer-mode", f.tokenizer_mode, "vLLM's tokenizer mode: auto, hf or slow (the same tokenizer)");
  cmd.add_option("--revision", f.revision,
                 "The snapshot (branch, tag or commit) of a model given as a Hugging Face id, in the local hub cache "
                 "(default main; vLLM's)");
  cmd.add_option("--tokenizer-revision", f.tokenizer_revision, "vLLM's tokenizer revision" + none);
  cmd.add_option("--code-revision", f.code_revision, "vLLM's remote-code revision" + none);
  cmd.add_option("--download-dir", f.download_dir,
                 "vLLM's download folder" + none + ": models are local folders or already in the hub cache");
  cmd.add_option("--compilation-config", f.compilation_config,
                 "vLLM's torch.compile settings (also -O0 ... -O3)" + none);
  cmd.add_option("--distributed-executor-backend", f.distributed_executor_backend,
                 "vLLM's worker processes: mp or uni (ssmserve runs its ranks in one process)");
  cmd.add_option("--scheduling-policy", f.scheduling_policy, "vLLM's scheduling policy: fcfs only");
  cmd.add_option("--response-role", f.response_role, "vLLM's role of chat replies: assistant only");
  cmd.add_option("--pipeline-parallel-size", f.pipeline_parallel_size, "vLLM's pipeline parallelism: 1 only (-pp)");
  cmd.add_option("--data-parallel-size", f.data_parallel_size, "vLLM's data parallelism: 1 only (-dp)");
  cmd.add_option("--max-num-partial-prefills", f.max_num_partial_prefills,
                 "vLLM's concurrent partial prefills" + none + ": the scheduler packs them by its token budget");
}

void check_vllm_compat_flags(const VllmCompatFlags& f) {
  SSM_CHECK(f.kv_cache_dtype == "auto",
            "--kv-cache-dtype {}: ssmserve keeps the attention KV cache in the dtype it computes in; only auto is "
            "accepted (the recurrent states: --mamba-cache-dtype / --mamba-ssm-cache-dtype)", f.kv_cache_dtype);
  SSM_CHECK(f.tokenizer_mode == "auto" || f.tokenizer_mode == "hf" || f.tokenizer_mode == "slow",
            "--tokenizer-mode {}: ssmserve reads tokenizer.json (or tokenizer.model): auto, hf or slow", f.tokenizer_mode);
  SSM_CHECK(f.distributed_executor_backend.empty() || f.distributed_executor_backend == "mp" ||
                f.distributed_executor_backend == "uni",
            "--distributed-executor-backend {}: ssmserve runs its tensor-parallel ranks in one process (mp or uni)",
            f.distributed_executor_backend);
  SSM_CHECK(f.scheduling_policy == "fcfs",
            "--scheduling-policy {}: ssmserve schedules first come, first served (fcfs) only", f.scheduling_policy);
  SSM_CHECK(f.response_role == "assistant", "--response-role {}: chat replies are the assistant's (assistant only)",
            f.response_role);
  SSM_CHECK(f.pipeline_parallel_size == 1,
            "--pipeline-parallel-size {}: ssmserve has no pipeline parallelism (1 only; --tensor-parallel-size splits "
            "a model)", f.pipeline_parallel_size);
  SSM_CHECK(f.data_parallel_size == 1,
            "--data-parallel-size {}: ssmserve has no data parallelism (1 only; run one server per GPU)",
            f.data_parallel_size);
  // vLLM's -O / --compilation-config value: a level, a JSON object, or -O.key=value (".key=value" after rewriting);
  // anything else (a model folder after -O) is an error, as vLLM's parser gives.
  const std::string& cc = f.compilation_config;
  const bool level = !cc.empty() && cc.find_first_not_of("0123456789") == std::string::npos;
  const bool object = !cc.empty() && cc[0] == '{' && nlohmann::json::accept(cc);
  const bool dotted = cc.size() > 1 && cc[0] == '.' && cc.find('=') != std::string::npos;
  SSM_CHECK(cc.empty() || level || object || dotted,
            "--compilation-config (-O) \"{}\": expected an optimization level (-O3), a JSON object or -O.key=value",
            cc);
  SSM_CHECK(f.max_num_partial_prefills >= 1, "--max-num-partial-prefills must be >= 1 (got {})",
            f.max_num_partial_prefills);
}

void rewrite_vllm_argument_spellings(std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool options_ended = false;
  for (std::string& a : args) {
    if (options_ended) {
      out.push_back(std::move(a));
      continue;
    }
    if (a == "--") {
      options_ended = true;
    } else if (a == "-tp" || a == "-pp" || a == "-dp") {
      a = a == "-tp" ? "--tensor-parallel-size" : a == "-pp" ? "--pipeline-parallel-size" : "--data-parallel-size";
    } else if (a.rfind("-tp=", 0) == 0 || a.rfind("-pp=", 0) == 0 || a.rfind("-dp=", 0) == 0) {
      const std::string v = a.substr(4);
      a = (a[1] == 't' ? "--tensor-parallel-size=" : a[1] == 'p' ? "--pipeline-parallel-size=" : "--data-parallel-size=") + v;
    } else if (a == "-O") {
      a = "--compilation-config";
    } else if (a.size() > 2 && a[0] == '-' && a[1] == 'O') {  // -O3, -O.mode=3, -O=3
      a = "--compilation-config=" + a.substr(a[2] == '=' ? 3 : 2);
    } else if (a.size() > 2 && a[0] == '-' && a[1] == '-') {  // --max_model_len[=...]: the name's underscores
      const size_t end = std::min(a.find('='), a.size());
      for (size_t i = 2; i < end; ++i)
        if (a[i] == '_') a[i] = '-';
    }
    out.push_back(std::move(a));
  }
  args = std::move(out);
}

std::string resolve_vllm_dataset(const std::string& name_given, const std::string& path, bool dataset_given) {
  SSM_CHECK(!dataset_given, "give the dataset once: --dataset, or vLLM's --dataset-name / --dataset-path");
  const std::string name = name_given.empty() ? (path.empty() ? "random" : "custom") : name_given;
  SSM_CHECK(name == "random" || name == "custom", "--dataset-name {} is not supported: random, or custom with "
            "--dataset-path FILE.jsonl ({{\"prompt\"}} per line)", name);
  SSM_CHECK(name == "random" || !path.empty(), "--dataset-name custom needs --dataset-path FILE.jsonl");
  SSM_CHECK(name == "custom" || path.empty(), "--dataset-path needs --dataset-name custom (random prompts read no file)");
  return name == "random" ? "random" : path;
}

}  // namespace ssmserve::cli
