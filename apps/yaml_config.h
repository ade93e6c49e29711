// Owns `--config FILE.yaml` of every subcommand (vLLM's `vllm serve --config config.yaml`): the YAML file's keys are
// the subcommand's long flags; what the command line gives wins over the file.
#pragma once
#include <CLI/CLI.hpp>

#include <istream>
#include <string>
#include <vector>

namespace ssmserve::cli {

/// Reads a YAML mapping of flag -> value into CLI11 config items, as vLLM's FlexibleArgumentParser reads its
/// --config file:
///   - a key is a long flag's name, with or without its leading "--", underscores read as dashes (`max_model_len`);
///   - a scalar value is the flag's value (`true` / `false` switch a flag on / off; integers in YAML 1.1's spellings,
///     0x10, 010, 1_000, as vLLM's PyYAML reads them, become decimal);
///   - a list gives a flag taking several values each of its scalars (`api-key: [a, b]`);
///   - a mapping (`speculative-config: {method: ngram, ...}`) is passed as its JSON text, as vLLM's JSON flags take it;
///   - a key given twice: the last value wins, as on the command line.
/// Errors (CLI::ConfigError naming the file): not YAML, several documents, not a mapping at the top, a key that is not
/// a plain word, a value that is null or a list holding lists / mappings, a mapping with non-scalar keys or one that
/// nests past 64 levels or 100,000 nodes (aliases), a list for a one-value flag, --config given twice.
class YamlConfig final : public CLI::Config {
 public:
  /// `file_option`: the --config option whose value names the file in errors (nullptr: "file"); `root`: the app
  /// whose parsed subcommand receives the items (nullptr: items without parents).
  explicit YamlConfig(const CLI::Option* file_option = nullptr, const CLI::App* root = nullptr)
      : file_option_(file_option), root_(root) {}
  /// The options of `app` that were given (or all, with `default_also`) as YAML, one `name: value` line each.
  std::string to_config(const CLI::App* app, bool default_also, bool write_description, std::string prefix) const override;
  /// The items of the YAML document read from `input` (one per top-level key, in file order).
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

 private:
  const CLI::Option* file_option_;
  const CLI::App* root_;
};

/// The items of a YAML --config document (YamlConfig's rules); `file` names it in the errors (CLI::ConfigError).
std::vector<CLI::ConfigItem> read_yaml_config(std::istream& input, const std::string& file);

/// Adds `--config FILE` to the root app (given after a subcommand, it reaches the root by fallthrough): a YAML file of
/// the flags of the subcommand the command line chose (YamlConfig), applied to those not given on the command line.
void add_config_file_option(CLI::App& root);

/// CLI11's message for a config key that names no option ("INI was not able to parse x.y") or one a file may not give
/// (--help) in ssmserve's words (`--config FILE: unknown option "y" (not a flag of ssmserve serve)`); other messages
/// unchanged. `file`: the --config value ("" when unknown).
std::string config_error_message(const std::string& what, const std::string& command, const std::string& file = "");

/// `msg` with " (from --config FILE)" added when it is about a flag's value ("--max-model-len: expected ...") and that
/// flag is not among the command line's `args` (after rewrite_vllm_argument_spellings), so its value came from the
/// file; else `msg` unchanged. `file`: the --config value ("": no file given).
std::string note_config_origin(const std::string& msg, const std::vector<std::string>& args, const std::string& file);

}  // namespace ssmserve::cli
