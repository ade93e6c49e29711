// The `ssmserve` binary: parses the command line and dispatches to the subcommands (generate, bench).
// Every ssmserve::Error becomes "error: <message>" on stderr and exit code 1.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>

#include "apps/commands.h"
#include "apps/vllm_compat_flags.h"
#include "apps/yaml_config.h"
#include "config/hf_hub_cache.h"
#include "core/error.h"
#include "core/openmp_env.h"
#include "core/version.h"
#include "model/causal_lm.h"
#ifdef SSMSERVE_HAVE_CUDA
#include "runtime/cuda_mamba.h"
#endif

namespace ssmserve::cli {

void add_engine_options(CLI::App& cmd, EngineConfig& cfg, std::string& load_format) {
#ifdef SSMSERVE_DEFAULT_MODEL  // a source build: the repository's bundled checkpoint (none in the pip package)
  cfg.model = SSMSERVE_DEFAULT_MODEL;
  cmd.add_option("--model", cfg.model,
                 "Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json), or a Hugging Face id "
                 "(org/name) already in the local hub cache (HF_HUB_CACHE / HF_HOME; never downloaded)")
      ->capture_default_str();
#else
  cmd.add_option("--model", cfg.model,
                 "Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json), or a Hugging Face id "
                 "(org/name) already in the local hub cache (HF_HUB_CACHE / HF_HOME; never downloaded); required");
#endif
  cmd.add_option("--tokenizer", cfg.tokenizer, "Folder with tokenizer.json or a SentencePiece tokenizer.model (default: the model folder)");
  cmd.add_option("--load-format", load_format, "auto (safetensors) or dummy (random weights from config.json)")
      ->capture_default_str();
  cmd.add_option("--dtype", cfg.dtype,
                 "Weights' dtype (vLLM's): auto (GPU: bfloat16; CPU: as stored; FP8 checkpoints: bfloat16), bfloat16, float32 or float (= float32); "
                 "the CPU computes in fp32 whatever it is")
      ->capture_default_str();
  cmd.add_flag("--enforce-eager", cfg.enforce_eager,
               "No CUDA graphs (vLLM's): every GPU step's kernels are launched one by one (the same results, slower "
               "decode); no effect on the CPU");
  cmd.add_option("-q,--quantization", cfg.quantization,
                 "The checkpoint's quantization method (vLLM's): fp8, compressed-tensors, modelopt, gptq (gptq_marlin) or awq (awq_marlin), checked against "
                 "config.json; default: as the checkpoint says (FP8, GPTQ and AWQ weights are dequantized as they load)");
  cmd.add_option("--max-num-batched-tokens", cfg.scheduler.max_num_batched_tokens, "Token budget per engine step")
      ->capture_default_str();
  cmd.add_option("--max-num-seqs", cfg.scheduler.max_num_seqs, "Most requests in one step")->capture_default_str();
  cmd.add_option("--num-state-blocks", cfg.num_state_blocks,
                 "Recurrent-state blocks incl. the null block (0 = max-num-seqs + 1)")->capture_default_str();
  cmd.add_option("--threads", cfg.num_threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("--tensor-parallel-size", cfg.tensor_parallel_size,
                 "Split the model over N ranks (in-process threads on the CPU; every architecture; the GPU: Mamba-1 and Mamba-2)")->capture_default_str();
  cmd.add_option("--mamba-cache-dtype", cfg.mamba_cache_dtype, "Conv state dtype: auto (fp32 on CPU), float32, bfloat16, float16")->capture_default_str();
  cmd.add_option("--mamba-ssm-cache-dtype", cfg.mamba_ssm_cache_dtype, "SSM state dtype: float32, bfloat16, float16, auto (= conv)")->capture_default_str();
  cmd.add_option("--gpu-memory-utilization", cfg.gpu_memory_utilization,
                 "Fraction of the GPU's memory the engine may use; the state pool gets what the weights and workspace leave")
      ->capture_default_str();
  cmd.add_option("--device", cfg.device, "cpu, cuda, or auto (cuda when built with it, a GPU is present and the architecture runs there)")
      ->capture_default_str();
  cmd.add_option("--num-scheduler-steps", cfg.num_scheduler_steps,
                 "Model steps per engine step for decode-only greedy batches (multi-step decode; tokens arrive in "
                 "bursts; with --speculative-config, steps that verify drafts run one model step)")
      ->capture_default_str();
  cmd.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", cfg.enable_prefix_caching,
               "Prefix caching of recurrent states (and shared KV blocks): a request whose tokens start with a cached prefix "
               "continues from its state (default on, as vLLM)");
  cmd.add_option("--mamba-cache-mode", cfg.mamba_cache_mode,
                 "Prefix caching of states: all (at every block boundary, stored inside prefill chunks; CPU and GPU), align "
                 "(at block boundaries ending a step; prefill chunks cut on them) or none")
      ->capture_default_str();
  cmd.add_option("--swap-space", cfg.swap_space,
                 "GiB of pinned host memory keeping cached states evicted from the GPU's pool "
                 "(brought back on a hit; no effect on the CPU backend)")
      ->capture_default_str();
  cmd.add_option("--speculative-config", cfg.speculative_config,
                 "Speculative decoding, as JSON (vLLM's): {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                 "\"prompt_lookup_min\": 2, \"prompt_lookup_max\": 5} drafts by prompt lookup; verify rows keep one "
                 "recurrent state per draft position; method draft_model: {\"model\": DIR} drafts with a smaller checkpoint "
                 "(method replay is bench latency's benchmark-only drafter)");
  cmd.add_option("--reasoning-parser", cfg.reasoning_parser,
                 "The model's reasoning format (vLLM's): qwen3 (Qwen3 / Qwen3.5 / Qwen3.6), nemotron_v3 (Nemotron 3 Nano) "
                 "or deepseek_r1; serve returns "
                 "chat replies' reasoning apart from their content, and structured outputs constrain only the text "
                 "after the reasoning");
  cmd.add_option("--mamba-block-size", cfg.mamba_block_size,
                 "Tokens per cached state (0 = the smallest multiple of the model's chunk length and KV block size of at "
                 "least 256)")
      ->capture_default_str();
}

void add_generation_config_options(CLI::App& cmd, EngineConfig& cfg) {
  cmd.add_option("--generation-config", cfg.generation_config,
                 "Default sampling parameters of requests that leave them unset (vLLM's): auto (the model folder's "
                 "generation_config.json: its temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens), "
                 "vllm (none: vLLM's neutral defaults), or a folder holding generation_config.json (its max_new_tokens "
                 "then also caps every request)")
      ->capture_default_str();
  cmd.add_option("--override-generation-config", cfg.override_generation_config,
                 "JSON object merged over the generation config, e.g. '{\"temperature\": 0.5}' (with "
                 "--generation-config vllm only these; a max_new_tokens here caps every request's max_tokens)");
}

CLI::Option* add_max_model_len_option(CLI::App& cmd, int& value, const std::string& no_limit_default) {
  return cmd.add_option("--max-model-len", value,
                        "Most prompt + generated tokens per request, >= 1, or vLLM's 32k / 1M / 32K (= 32768) forms "
                        "(default, or auto / -1: the model's max_position_embeddings, or " + no_limit_default +
                        " for models without a limit)");
}

void check_max_model_len(int value) {
  SSM_CHECK(value >= 1, "--max-model-len must be a positive number of tokens (got {})", value);
}

std::function<void()> add_engine_max_model_len(CLI::App& cmd, EngineConfig& cfg) {
  CLI::Option* o = add_max_model_len_option(cmd, cfg.max_model_len, "none");
  return [o, &cfg] {
    if (o->count() > 0 && cfg.max_model_len == -1) cfg.max_model_len = 0;  // -1 / auto: the model's (vLLM)
    else if (o->count() > 0) check_max_model_len(cfg.max_model_len);
  };
}

void check_bench_fits_context(const EngineConfig& cfg, int input_len, int output_len) {
  const long long total = static_cast<long long>(input_len) + output_len;
  if (cfg.max_model_len > 0) {
    SSM_CHECK(total <= cfg.max_model_len, "--input-len {} + --output-len {} exceed --max-model-len {}", input_len,
              output_len, cfg.max_model_len);
    return;
  }
  const int ctx = ModelConfig::load(cfg.model).max_model_len;
  SSM_CHECK(ctx <= 0 || total <= ctx,
            "--input-len {} + --output-len {} exceed the model's maximum context length of {} tokens "
            "(max_position_embeddings)", input_len, output_len, ctx);
}

void check_output_path(const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  const std::filesystem::path p(path);
  SSM_CHECK(!std::filesystem::is_directory(p, ec), "{}: cannot write the JSON output: it is a directory", path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  SSM_CHECK(std::filesystem::is_directory(dir, ec), "{}: cannot write the JSON output: folder {} does not exist", path, dir.string());
  // Open it now (appending: an existing file keeps its contents until the results replace them), so a benchmark
  // does not run for minutes before finding its output unwritable; a file created here is removed again.
  const bool existed = std::filesystem::exists(p, ec);
  {
    std::ofstream probe(path, std::ios::app);
    SSM_CHECK(probe.good(), "{}: cannot write the JSON output (cannot open the file: {})", path, std::strerror(errno));
  }
  if (!existed) std::filesystem::remove(p, ec);
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  SSM_CHECK(out, "{}: cannot write the JSON output (cannot open the file: {})", path, std::strerror(errno));
  out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";  // a server's bytes may not be UTF-8
  out.close();
  SSM_CHECK(!out.fail(), "{}: cannot write the JSON output (write failed)", path);
}

void resolve_engine_config(EngineConfig& cfg, const std::string& load_format) {
  SSM_CHECK(!cfg.model.empty(), "--model is required (a checkpoint folder with config.json)");
  // A Hugging Face id (org/name) as vLLM takes it: its snapshot in the local hub cache.
  cfg.model = resolve_model_path(cfg.model.string());
  if (!cfg.tokenizer.empty()) cfg.tokenizer = resolve_model_path(cfg.tokenizer.string());
  if (load_format == "auto" || load_format == "safetensors") cfg.load_format = LoadFormat::Auto;
  else if (load_format == "dummy") cfg.load_format = LoadFormat::Dummy;
  else fail("--load-format must be auto, safetensors or dummy (got \"{}\")", load_format);
}

}  // namespace ssmserve::cli

namespace {

/// "ssmserve generate", "ssmserve bench latency", ...: the deepest subcommand the command line selected.
std::string command_path(const CLI::App& app) {
  std::string path = "ssmserve";
  const CLI::App* cur = &app;
  while (true) {
    const auto subs = cur->get_subcommands();
    if (subs.empty()) return path;
    cur = subs.front();
    path += " " + cur->get_name();
  }
}

/// Names the root's flags in the help of every subcommand that runs (CLI11 lists them only in `ssmserve --help`).
void add_root_flags_footer(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands({})) {
    if (!sub->get_subcommands({}).empty()) {
      add_root_flags_footer(*sub);
      continue;
    }
    sub->footer("Also: --log-level LEVEL (trace ... off) and --config FILE.yaml (this command's flags as YAML keys, "
                "`max-model-len: 4096`; the command line wins), see ssmserve --help");
  }
}

/// Flushes stdout and throws when any write to it failed (a full disk, /dev/full, a closed pipe).
void check_stdout() {
  errno = 0;
  std::cout.flush();
  if (std::cout.fail())
    ssmserve::fail("cannot write the output to standard output{}", errno ? std::string(" (") + std::strerror(errno) + ")" : "");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ssmserve;
  apply_openmp_wait_defaults(argv);  // may re-exec this binary once (libgomp reads its environment before main)
#ifdef SSMSERVE_HAVE_CUDA
  cuda::register_cuda_backend();
#endif
  CLI::App app{"ssmserve: inference and serving for recurrent-state language models (Mamba-1, Mamba-2, lightning attention, Gated DeltaNet and their hybrids with attention and MoE)"};
  app.name("ssmserve");  // the usage line's name (parse() of a word list does not take it from argv[0])
  app.set_version_flag("--version", version());
  // A flag given twice: the last one wins, as with vLLM's argparse (inherited by every subcommand's options; options
  // taking several values keep them all).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical, off")
      ->capture_default_str()
      ->transform(CLI::Transformer({{"warning", "warn"}}, CLI::ignore_case))  // vLLM's / Python's spelling
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}, CLI::ignore_case));
  app.require_subcommand(1);
  // The top-level options (--log-level) are also read after the subcommand: `ssmserve generate --log-level debug`.
  app.fallthrough();
  cli::Runner generate = cli::add_generate(app);
  cli::Runner bench = cli::add_bench(app);
  cli::Runner serve = cli::add_serve(app);
  cli::Runner bench_serve = cli::add_bench_serve(*app.get_subcommand("bench"));
  cli::read_numbers_as_decimal(app);
  cli::add_config_file_option(app);  // --config FILE.yaml
  add_root_flags_footer(app);
  // vLLM's spellings (-tp 2, -O3, --max_model_len) as ssmserve's flags; CLI11 takes the words in reverse order.
  std::vector<std::string> args(argv + 1, argv + argc);
  cli::rewrite_vllm_argument_spellings(args);
  const std::vector<std::string> given = args;  // CLI11's parse consumes `args`
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    const CLI::Option* config = app.get_option_no_throw("--config");
    const std::string file = config && config->count() > 0 ? config->results().back() : "";
    std::string msg = cli::note_config_origin(cli::config_error_message(e.what(), command_path(app), file), given, file);
    // CLI11 lists the words it did not use as it holds them, last first (it reads a reversed vector): in command-line order.
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      std::vector<std::string> extra = app.remaining(true);
      if (!extra.empty()) msg = std::string("The following argument") + (extra.size() == 1 ? " was" : "s were") +
                                " not expected: " + CLI::detail::join(extra, " ");
    }
    // With no subcommand CLI11 reports only "A subcommand is required"; name the arguments it did not use too.
    if (const auto extra = app.remaining(true); !extra.empty() && dynamic_cast<const CLI::ExtrasError*>(&e) == nullptr) msg += "; unexpected argument " + CLI::detail::join(extra, " ");
    std::cerr << "error: " << msg << " (see " << command_path(app) << " --help)" << std::endl;
    return 1;
  }
  // `serve` logs at info by default, as vLLM's server (its access and stats lines); the other commands at warn.
  if (app.get_option("--log-level")->count() == 0 && app.got_subcommand("serve")) log_level = "info";
  for (char& c : log_level) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));  // "INFO": info
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_default_logger(spdlog::stderr_color_mt("ssmserve"));
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    int rc = 0;
    if (app.got_subcommand("generate")) rc = generate();
    else if (app.got_subcommand("bench") && app.get_subcommand("bench")->got_subcommand("serve")) rc = bench_serve();
    else if (app.got_subcommand("bench")) rc = bench();
    else if (app.got_subcommand("serve")) rc = serve();
    check_stdout();
    return rc;
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory (lower --max-num-seqs, --num-state-blocks, --max-num-batched-tokens or the batch / prompt "
                 "sizes)"
              << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
