// Owns the subcommand registration interface of the `ssmserve` binary: each subcommand adds itself to the
// CLI11 app and returns the function that runs it.
#pragma once
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "engine/engine_config.h"

namespace ssmserve::cli {

/// Runs a parsed subcommand; returns the process exit code.
using Runner = std::function<int()>;

/// Adds `generate` to `app`; the returned runner executes it after parsing.
Runner add_generate(CLI::App& app);
/// Adds `bench` (with `bench latency` and `bench throughput`) to `app`.
Runner add_bench(CLI::App& app);
/// Adds `serve` under the `bench` subcommand (a load generator for a running server, apps/cmd_bench_serve.cpp).
Runner add_bench_serve(CLI::App& bench);
/// Adds `serve` (the OpenAI-compatible HTTP server, apps/cmd_serve.cpp) to `app`.
Runner add_serve(CLI::App& app);
/// Adds `throughput` under the `bench` subcommand; the runner executes it (apps/cmd_bench_throughput.cpp).
Runner add_bench_throughput(CLI::App& bench);
/// Adds `multiturn` under the `bench` subcommand (prefix-cache TTFT per history length, apps/cmd_bench_multiturn.cpp);
/// its runner returns -1 when that subcommand was not the one parsed.
Runner add_bench_multiturn(CLI::App& bench);

/// Adds the engine knobs shared by every subcommand (--model, --load-format, --max-num-batched-tokens,
/// --max-num-seqs, --num-state-blocks, --threads, --tensor-parallel-size, --tokenizer) bound to `cfg`. `load_format` receives the
/// string value and is applied by resolve_engine_config.
void add_engine_options(CLI::App& cmd, EngineConfig& cfg, std::string& load_format);
/// Adds vLLM's --generation-config and --override-generation-config (where a request's default sampling parameters
/// come from: GenerationDefaults, engine/generation_defaults.h) bound to `cfg`: for the subcommands that fill in
/// unset request fields (serve), not those whose flags give every parameter (generate, bench).
void add_generation_config_options(CLI::App& cmd, EngineConfig& cfg);
/// Adds vLLM's --max-model-len (most prompt + generated tokens per request) to `cmd`, bound to `value`, with the one
/// help text of every subcommand that has it; `no_limit_default` says what the subcommand uses for a model without a
/// context limit (e.g. "8192"). The returned option's count() says whether it was given.
CLI::Option* add_max_model_len_option(CLI::App& cmd, int& value, const std::string& no_limit_default);
/// Checks a given --max-model-len before the model loads: throws Error unless it is >= 1.
void check_max_model_len(int value);
/// --max-model-len as an engine argument (the bench commands, as vLLM's): bound to cfg.max_model_len (the engine
/// refuses a value above the model's context or its block pool when it is built). The returned check, called before
/// the run, throws Error when the flag was given a value below 1.
std::function<void()> add_engine_max_model_len(CLI::App& cmd, EngineConfig& cfg);
/// Checks that a benchmark's --input-len + --output-len fit the context every request gets: cfg.max_model_len when
/// given (--max-model-len), else the model's max_position_embeddings (none: no limit), so each request generates all
/// of its --output-len tokens instead of being stopped at the context. Reads the model's config.json; throws Error
/// naming the flags and the limit.
void check_bench_fits_context(const EngineConfig& cfg, int input_len, int output_len);
/// Throws Error when `path` (an --output-json file; empty = none) is a directory or its folder does not exist,
/// so a bad path fails before the benchmark runs.
void check_output_path(const std::string& path);
/// Writes `j` (2-space indented) to `path`; throws Error "cannot write ..." when opening or writing fails.
void write_json_file(const std::string& path, const nlohmann::json& j);

/// Makes every integer and floating-point option of `app` and its subcommands (call it once all are added) read its
/// value as vLLM's argparse does: integers in decimal only ("010" is 10, "0x10" and "" are errors naming the option,
/// "-1" for an unsigned option is an error instead of 2^64 - 1), floats not empty and not hexadecimal;
/// --max-model-len and --max-num-batched-tokens also take vLLM's human-readable counts (expand_human_readable_int),
/// and --max-model-len "auto" (read as -1, the model's own length).
void read_numbers_as_decimal(CLI::App& app);

/// vLLM's human_readable_int for a flag's value, rewritten in place to its decimal digits: "32k" = 32000, "1.5k" =
/// 1500 (decimal suffixes k, m, g, t), "32K" = 32768 (binary suffixes K, M, G, T; whole numbers only); other words are
/// left for the decimal parser. Returns an error message ("" when fine), e.g. for "1.5K".
std::string expand_human_readable_int(std::string& value);

/// Applies string options to cfg (load format); throws Error on an unknown value, or when no --model was given (the
/// pip package's binary has no default model).
void resolve_engine_config(EngineConfig& cfg, const std::string& load_format);

}  // namespace ssmserve::cli
