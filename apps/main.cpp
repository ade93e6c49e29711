// The `ssmserve` binary: parses the command line and dispatches to the subcommands (generate, bench).
// Every ssmserve::Error becomes "error: <message>" on stderr and exit code 1.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <iostream>

#include "apps/commands.h"
#include "core/error.h"
#include "core/version.h"
#include "model/causal_lm.h"

namespace ssmserve::cli {

void add_engine_options(CLI::App& cmd, EngineConfig& cfg, std::string& load_format) {
  cfg.model = SSMSERVE_DEFAULT_MODEL;
  cmd.add_option("--model", cfg.model, "Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json)")
      ->capture_default_str();
  cmd.add_option("--tokenizer", cfg.tokenizer, "Folder with tokenizer.json (default: the model folder)");
  cmd.add_option("--load-format", load_format, "auto (safetensors) or dummy (random weights from config.json)")
      ->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", cfg.scheduler.max_num_batched_tokens, "Token budget per engine step")
      ->capture_default_str();
  cmd.add_option("--max-num-seqs", cfg.scheduler.max_num_seqs, "Most requests in one step")->capture_default_str();
  cmd.add_option("--num-state-blocks", cfg.num_state_blocks,
                 "Recurrent-state blocks incl. the null block (0 = max-num-seqs + 1)")->capture_default_str();
  cmd.add_option("--threads", cfg.num_threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("--mamba-cache-dtype", cfg.mamba_cache_dtype, "Conv state dtype: auto (fp32 on CPU), float32, bfloat16, float16")->capture_default_str();
  cmd.add_option("--mamba-ssm-cache-dtype", cfg.mamba_ssm_cache_dtype, "SSM state dtype: float32, bfloat16, float16, auto (= conv)")->capture_default_str();
}

void resolve_engine_config(EngineConfig& cfg, const std::string& load_format) {
  if (load_format == "auto" || load_format == "safetensors") cfg.load_format = LoadFormat::Auto;
  else if (load_format == "dummy") cfg.load_format = LoadFormat::Dummy;
  else fail("--load-format must be auto, safetensors or dummy (got \"{}\")", load_format);
}

}  // namespace ssmserve::cli

int main(int argc, char** argv) {
  using namespace ssmserve;
  CLI::App app{"ssmserve: inference and serving for recurrent-state language models (Mamba-1, Mamba-2, lightning attention)"};
  app.set_version_flag("--version", version());
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  app.require_subcommand(1);
  cli::Runner generate = cli::add_generate(app);
  cli::Runner bench = cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_default_logger(spdlog::stderr_color_mt("ssmserve"));
  spdlog::set_level(spdlog::level::from_str(log_level));
  try {
    if (app.got_subcommand("generate")) return generate();
    if (app.got_subcommand("bench")) return bench();
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
