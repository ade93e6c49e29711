// Tests of `--config FILE.yaml` (apps/yaml_config.h): the YAML file's items, their precedence under the command line,
// flags switched off, JSON-valued flags from mappings, and the errors naming the file and key.
#include <gtest/gtest.h>

#ifdef SSMSERVE_HAVE_YAML_CPP
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "apps/yaml_config.h"

namespace {

using ssmserve::cli::read_yaml_config;

std::vector<CLI::ConfigItem> items(const std::string& yaml) {
  std::istringstream in(yaml);
  return read_yaml_config(in, "c.yaml");
}

std::string error_of(const std::string& yaml) {
  try {
    items(yaml);
  } catch (const CLI::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CliYamlConfig, KeysAreLongFlagsAndValuesTheirWords) {
  const auto it = items(
      "model: /m\n"
      "max_model_len: 4096\n"
      "--port: 8000\n"
      "enable-prefix-caching: False\n"
      "api-key: [a, 'b c']\n"
      "speculative-config: {method: ngram, num_speculative_tokens: 4, x: '5', y: 0.5, z: null}\n");
  ASSERT_EQ(it.size(), 6u);
  EXPECT_EQ(it[0].name, "model");
  EXPECT_EQ(it[0].inputs, std::vector<std::string>{"/m"});
  EXPECT_EQ(it[1].name, "max-model-len");
  EXPECT_EQ(it[1].inputs, std::vector<std::string>{"4096"});
  EXPECT_EQ(it[2].name, "port");
  EXPECT_EQ(it[3].name, "enable-prefix-caching");
  EXPECT_EQ(it[3].inputs, std::vector<std::string>{"false"});
  EXPECT_EQ(it[4].inputs, (std::vector<std::string>{"a", "b c"}));
  const auto spec = nlohmann::json::parse(it[5].inputs.at(0));
  EXPECT_EQ(spec["method"], "ngram");
  EXPECT_EQ(spec["num_speculative_tokens"], 4);
  EXPECT_EQ(spec["x"], "5");  // quoted: a string
  EXPECT_EQ(spec["y"], 0.5);
  EXPECT_TRUE(spec["z"].is_null());
  EXPECT_TRUE(items("").empty());
  EXPECT_TRUE(items("# only a comment\n").empty());
}

TEST(CliYamlConfig, BadFilesAreErrorsNamingTheFileAndKey) {
  EXPECT_NE(error_of("a: [1\n").find("--config c.yaml: not valid YAML (line"), std::string::npos) << error_of("a: [1\n");
  EXPECT_NE(error_of("- a\n- b\n").find("expected a mapping"), std::string::npos);
  EXPECT_NE(error_of("port:\n").find("\"port\" has no value"), std::string::npos);
  EXPECT_NE(error_of("port: ~\n").find("\"port\" has no value"), std::string::npos);
  EXPECT_NE(error_of("api-key: []\n").find("\"api-key\" has no value"), std::string::npos);
  EXPECT_NE(error_of("api-key: [[a]]\n").find("scalars only"), std::string::npos);
  EXPECT_NE(error_of("[a]: 1\n").find("a key must be a flag's name"), std::string::npos);
  EXPECT_NE(error_of("'a b': 1\n").find("\"a b\" is not a flag's name"), std::string::npos);
  EXPECT_NE(error_of("---x: 1\n").find("is not a flag's name"), std::string::npos);
}

/// A command with the kinds of flags ssmserve has, parsed as main parses (TakeLast), with `yaml` as its --config.
struct Parsed {
  int port = 1, max_model_len = 0;
  bool prefix = true;
  std::vector<std::string> keys;
  std::string spec;
  std::string error;
};

Parsed parse(const std::string& yaml, std::vector<std::string> args) {
  const auto path = std::filesystem::temp_directory_path() / ("ssmserve-yaml-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(path) << yaml;
  Parsed p;
  CLI::App app{"t"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.fallthrough();
  std::string log_level;
  app.add_option("--log-level", log_level);
  CLI::App* serve = app.add_subcommand("serve");
  serve->add_option("--port", p.port);
  serve->add_option("--max-model-len", p.max_model_len);
  serve->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", p.prefix);
  serve->add_option("--api-key", p.keys)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  serve->add_option("--speculative-config", p.spec);
  ssmserve::cli::add_config_file_option(app);
  args.insert(args.begin(), {"serve", "--config", path.string()});
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    p.error = ssmserve::cli::config_error_message(e.what(), "t serve");
  }
  std::filesystem::remove(path);
  return p;
}

TEST(CliYamlConfig, TheCommandLineWinsOverTheFile) {
  const std::string yaml =
      "port: 8001\nmax_model_len: 64\nenable_prefix_caching: false\napi-key: [k1, k2]\n"
      "speculative-config: {method: ngram}\n";
  Parsed p = parse(yaml, {});
  EXPECT_EQ(p.error, "");
  EXPECT_EQ(p.port, 8001);
  EXPECT_EQ(p.max_model_len, 64);
  EXPECT_FALSE(p.prefix);
  EXPECT_EQ(p.keys, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(nlohmann::json::parse(p.spec)["method"], "ngram");
  p = parse(yaml, {"--port", "9000", "--enable-prefix-caching"});
  EXPECT_EQ(p.port, 9000);
  EXPECT_TRUE(p.prefix);
  EXPECT_EQ(p.max_model_len, 64);
  EXPECT_TRUE(parse("enable-prefix-caching: true\n", {"--no-enable-prefix-caching"}).prefix == false);
}

TEST(CliYamlConfig, UnknownKeysAndBadValuesAreErrors) {
  EXPECT_EQ(parse("prot: 8000\n", {}).error, "--config: unknown option \"prot\" (not a flag of t serve)");
  EXPECT_NE(parse("port: [1, 2]\n", {}).error.find("\"port\" takes one value, not a list of 2"), std::string::npos);
  EXPECT_NE(parse("port: eighty\n", {}).error.find("port"), std::string::npos);
  EXPECT_NE(parse("port: [1, 2\n", {}).error.find("not valid YAML"), std::string::npos);
  // A switch takes a YAML boolean (PyYAML's spellings); a number or a word is an error naming the key.
  EXPECT_NE(parse("enable-prefix-caching: 2\n", {}).error.find("\"enable-prefix-caching\" is a switch: give true or false, not \"2\""),
            std::string::npos);
  EXPECT_NE(parse("enable-prefix-caching: maybe\n", {}).error.find("is a switch"), std::string::npos);
  for (const char* yes : {"yes", "On", "TRUE", "true"}) {
    const Parsed q = parse(std::string("enable-prefix-caching: ") + yes + "\n", {"--no-enable-prefix-caching"});
    EXPECT_EQ(q.error, "") << yes;
    EXPECT_TRUE(parse(std::string("enable-prefix-caching: ") + yes + "\n", {}).prefix) << yes;
  }
  EXPECT_FALSE(parse("enable-prefix-caching: off\n", {}).prefix);
}

// A value error names the file when the flag came from it, not when the command line gave it.
TEST(CliYamlConfig, ValueErrorsFromTheFileNameIt) {
  using ssmserve::cli::note_config_origin;
  const std::string msg = "--max-model-len: expected a decimal integer, got \"abc\"";
  EXPECT_EQ(note_config_origin(msg, {"serve", "m"}, "c.yaml"), msg + " (from --config c.yaml)");
  EXPECT_EQ(note_config_origin(msg, {"serve", "--max-model-len", "abc"}, "c.yaml"), msg);
  EXPECT_EQ(note_config_origin(msg, {"serve", "--max-model-len=abc"}, "c.yaml"), msg);
  EXPECT_EQ(note_config_origin(msg, {"serve"}, ""), msg);  // no file
  EXPECT_EQ(note_config_origin("A subcommand is required", {}, "c.yaml"), "A subcommand is required");
  EXPECT_EQ(note_config_origin("--config c.yaml: not valid YAML", {}, "c.yaml"), "--config c.yaml: not valid YAML");
}

}  // namespace
#else
TEST(CliYamlConfig, NeedsYamlCpp) { GTEST_SKIP() << "built without yaml-cpp (libyaml-cpp-dev)"; }
#endif
