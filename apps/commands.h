// Owns the subcommand registration interface of the `ssmserve` binary: each subcommand adds itself to the
// CLI11 app and returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

#include "engine/engine_config.h"

namespace ssmserve::cli {

/// Runs a parsed subcommand; returns the process exit code.
using Runner = std::function<int()>;

/// Adds `generate` to `app`; the returned runner executes it after parsing.
Runner add_generate(CLI::App& app);
/// Adds `bench` (with `bench latency` and `bench throughput`) to `app`.
Runner add_bench(CLI::App& app);
/// Adds `throughput` under the `bench` subcommand; the runner executes it (apps/cmd_bench_throughput.cpp).
Runner add_bench_throughput(CLI::App& bench);

/// Adds the engine knobs shared by every subcommand (--model, --load-format, --max-num-batched-tokens,
/// --max-num-seqs, --num-state-blocks, --threads, --tokenizer) bound to `cfg`. `load_format` receives the
/// string value and is applied by resolve_engine_config.
void add_engine_options(CLI::App& cmd, EngineConfig& cfg, std::string& load_format);
/// Applies string options to cfg (load format); throws Error on an unknown value.
void resolve_engine_config(EngineConfig& cfg, const std::string& load_format);

}  // namespace ssmserve::cli
