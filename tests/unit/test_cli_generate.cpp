// `ssmserve generate` as a user runs it: the --json contract (fields, order, logprob shapes), --prompts-file
// order, streaming text, and clear errors with exit code 1 for bad flags and files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "checkpoint_fixtures.h"
#include "cli_runner.h"
#include "engine/structured_output.h"
#include "test_util.h"

namespace {

using ::testing::HasSubstr;

using ssmserve::testing::CliRun;
CliRun run(const std::string& args) { return ssmserve::testing::run_cli(args); }

TEST(CliGenerate, JsonContract) {
  ssmserve::testing::TempDir tmp("cli");
  ssmserve::testing::write_file(tmp / "p.jsonl", "{\"prompt\": \"In the beginning\"}\n\n{\"prompt\": \"The\"}\n");
  const CliRun r = run("generate --prompts-file " + (tmp / "p.jsonl").string() +
                    " --json --max-tokens 5 --logprobs 3 --prompt-logprobs 2 --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<nlohmann::json> objs;
  while (std::getline(lines, line)) objs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(objs.size(), 2u);
  EXPECT_EQ(objs[0]["prompt"], "In the beginning");
  EXPECT_EQ(objs[1]["prompt"], "The");
  for (const auto& o : objs) {
    for (const char* k : {"prompt", "prompt_token_ids", "text", "token_ids", "finish_reason", "logprobs", "prompt_logprobs"})
      EXPECT_TRUE(o.contains(k)) << k;
    EXPECT_EQ(o["token_ids"].size(), 5u);
    EXPECT_EQ(o["finish_reason"], "length");
    ASSERT_EQ(o["logprobs"].size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(o["logprobs"][i][0]["id"], o["token_ids"][i]);  // sampled token first
      EXPECT_GE(o["logprobs"][i].size(), 3u);
      EXPECT_LE(o["logprobs"][i][0]["logprob"].get<double>(), 0.0);
    }
    ASSERT_EQ(o["prompt_logprobs"].size(), o["prompt_token_ids"].size());
    EXPECT_TRUE(o["prompt_logprobs"][0].is_null());
    for (size_t i = 1; i < o["prompt_logprobs"].size(); ++i) {
      EXPECT_TRUE(o["prompt_logprobs"][i]["token_logprob"].is_number());
      EXPECT_EQ(o["prompt_logprobs"][i]["top"].size(), 2u);
    }
  }
  EXPECT_EQ(objs[1]["prompt_token_ids"], nlohmann::json::array({510}));  // "The"
}

// The engine-core contract: small budgets and few sequences per step give the same results as the defaults.
TEST(CliGenerate, SmallBudgetSameAsDefaults) {
  ssmserve::testing::TempDir tmp("cli");
  std::string lines;
  for (const char* p : {"In the beginning God created", "It is a truth universally acknowledged, that a single man",
                        "The", "Emma Woodhouse, handsome, clever, and rich, with a comfortable home", "And Moses said"})
    lines += std::string("{\"prompt\": \"") + p + "\"}\n";
  ssmserve::testing::write_file(tmp / "p.jsonl", lines);
  const std::string common = "generate --prompts-file " + (tmp / "p.jsonl").string() +
                             " --json --max-tokens 10 --logprobs 2 --prompt-logprobs 1 --ignore-eos";
  const CliRun a = run(common);
  const CliRun b = run(common + " --max-num-batched-tokens 13 --max-num-seqs 3");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(std::count(a.out.begin(), a.out.end(), '\n'), 5);
}

// vLLM's --dtype on the CPU (which computes in fp32 whatever it says): float32 and bfloat16 give the default run's
// ids and logprobs on the bf16 tiny-mamba checkpoint, bfloat16 with a note that it runs fp32 math; fp16 and names
// vLLM does not take fail naming --dtype and the accepted values.
TEST(CliGenerate, DtypeFlag) {
  const std::string common = "generate --prompt 'In the beginning God created' --json --max-tokens 8 --logprobs 2 --ignore-eos";
  const CliRun a = run(common), b = run(common + " --dtype float32"), c = run(common + " --dtype bfloat16");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["token_ids"].size(), 8u);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  EXPECT_THAT(b.err, ::testing::Not(HasSubstr("--dtype")));
  EXPECT_THAT(c.err, HasSubstr("--dtype bfloat16: the CPU backend computes in fp32"));
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"--dtype half", "error: --dtype half: fp16 weights are not supported (the kernels run bf16 or fp32 weights); use "
                       "one of: auto, bfloat16, float32, float"},
      {"--dtype float16", "error: --dtype float16: fp16 weights are not supported"},
      {"--dtype bf16", "error: --dtype must be one of: auto, bfloat16, float32, float (got \"bf16\")"},
  };
  for (const auto& k : cases) {
    const CliRun r = run("generate --prompt hi --max-tokens 2 " + k.args);
    EXPECT_EQ(r.status, 1) << k.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(k.expect)) << k.args;
  }
}

// A flag given twice: the last one wins, as with vLLM's argparse (a script's defaults, then an override); options that
// take several values keep every value given.
TEST(CliGenerate, RepeatedFlagTakesTheLast) {
  const std::string common = "generate --prompt 'In the beginning God created' --json --ignore-eos";
  const CliRun a = run(common + " --max-tokens 2 --max-tokens 5"), b = run(common + " --max-tokens 5");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(nlohmann::json::parse(a.out)["token_ids"].size(), 5u);
  // --stop-token-ids twice: the ids of both stop generation (the first token generated stops it either way).
  const auto first = nlohmann::json::parse(b.out)["token_ids"][0].get<int>();
  for (const std::string& ids : {std::to_string(first) + " --stop-token-ids 1", "1 --stop-token-ids " + std::to_string(first)}) {
    const CliRun r = run("generate --prompt 'In the beginning God created' --json --max-tokens 5 --stop-token-ids " + ids);
    ASSERT_EQ(r.status, 0) << ids << "\n" << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["finish_reason"], "stop") << ids;
  }
}

TEST(CliGenerate, StreamsTextForOnePrompt) {
  const CliRun r = run("generate --prompt 'And God said' --max-tokens 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.rfind("And God said", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("And God said\n").size());
}

TEST(CliGenerate, ErrorsExitWithOne) {
  ssmserve::testing::TempDir tmp("cli");
  ssmserve::testing::write_file(tmp / "bad.jsonl", "{\"prompt\": \"ok\"}\n{not json\n");
  ssmserve::testing::write_file(tmp / "noprompt.jsonl", "{\"text\": \"ok\"}\n");
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"generate --prompts-file " + (tmp / "bad.jsonl").string(), "bad.jsonl:2"},
      {"generate --prompts-file " + (tmp / "noprompt.jsonl").string(), "\"prompt\""},
      {"generate --prompts-file " + (tmp / "missing.jsonl").string(), "missing.jsonl"},
      {"generate --prompt hi --temperature -1", "temperature"},
      {"generate --prompt hi --top-p 0", "--top-p"},
      {"generate --prompt hi --model " + (tmp / "nowhere").string(), "nowhere"},
      {"generate --prompt hi --load-format foo", "load-format"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args;
    EXPECT_THAT(r.err, HasSubstr("error:")) << c.args;
  }
}

// Every line of --json output, parsed.
std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::istringstream lines(out);
  std::string line;
  std::vector<nlohmann::json> objs;
  while (std::getline(lines, line)) objs.push_back(nlohmann::json::parse(line));
  return objs;
}

// CLI11 parse errors follow the README's promise: "error: <what>" plus a --help hint, exit code 1.
TEST(CliGenerate, ParseErrorsExitWithOneAndHint) {
  struct Case {
    std::string args, expect, hint;
  } cases[] = {
      {"generate --prompt hi --max-tokens abc", "--max-tokens", "ssmserve generate --help"},
      {"generate --prompt hi --bogus", "--bogus", "ssmserve generate --help"},
      {"--bogus", "--bogus", "ssmserve --help"},
      {"generate --prompt x --prompts-file y", "excludes", "ssmserve generate --help"},
      {"", "subcommand", "ssmserve --help"},
      {"generate", "--prompt", "ssmserve generate --help"},
      {"--log-level foo generate --prompt hi", "--log-level", "ssmserve generate --help"},
      {"generate --prompt hi --log-level foo", "--log-level", "ssmserve generate --help"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args;
    EXPECT_THAT(r.err, HasSubstr("(see " + c.hint + ")")) << c.args;
  }
}

// Numbers on the command line read as vLLM's argparse reads them (Python's int() / float()): "010" is ten, not octal
// eight; hexadecimal, an empty value and a negative unsigned value are errors naming the flag.
TEST(CliGenerate, NumbersReadAsDecimal) {
  const std::string common = "generate --prompt 'In the beginning God created' --json --ignore-eos";
  for (const std::string& ten : {"010", "+10", "' 10 '", "0000000000000000000000010"}) {
    const CliRun r = run(common + " --max-tokens " + ten);
    ASSERT_EQ(r.status, 0) << ten << "\n" << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"].size(), 10u) << ten;
  }
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"--max-tokens 0x10", "--max-tokens: expected a decimal integer, got \"0x10\""},
      {"--max-tokens ''", "--max-tokens: expected a decimal integer, got \"\""},
      {"--max-tokens 1e1", "--max-tokens: expected a decimal integer"},
      {"--max-tokens 1_0", "--max-tokens: expected a decimal integer"},
      {"--top-k 0b11", "--top-k: expected a decimal integer"},
      {"--temperature ''", "--temperature: expected a number"},
      {"--temperature 0x1p-1", "--temperature: expected a decimal number"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(common + " " + c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args;
  }
  // An option with its own validator too (CLI11 lists it in the type name: "UINT:UINT in [0 - ...]").
  const CliRun hex = run("serve --max-pending-output-bytes 0x10");
  EXPECT_EQ(hex.status, 1) << hex.err;
  EXPECT_THAT(hex.err, HasSubstr("--max-pending-output-bytes: expected a decimal integer, got \"0x10\"")) << hex.err;
  const CliRun neg = run("serve --max-pending-output-bytes -1");
  EXPECT_EQ(neg.status, 1) << neg.err;
  EXPECT_THAT(neg.err, HasSubstr("--max-pending-output-bytes: expected a non-negative integer")) << neg.err;
  const CliRun vec = run("bench latency --batch-size 1 0x2 --input-len 4 --output-len 2");  // each value of a list
  EXPECT_EQ(vec.status, 1) << vec.err;
  EXPECT_THAT(vec.err, HasSubstr("--batch-size: expected a decimal integer, got \"0x2\"")) << vec.err;
  // Negative numbers and "inf" still read where they mean something.
  const CliRun k = run(common + " --max-tokens 3 --top-k -1 --temperature inf");
  EXPECT_EQ(k.status, 1) << k.err;
  EXPECT_THAT(k.err, HasSubstr("--temperature must be finite")) << k.err;  // top-k -1 passed; inf reached the check
}

// The top-level --log-level is read after the subcommand too (CLI11's fallthrough), as users type it.
TEST(CliGenerate, LogLevelAfterTheSubcommand) {
  const CliRun r = run("generate --prompt hi --max-tokens 2 --log-level info");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("[info]"));
  // Any case, and Python's / vLLM's "warning" (an unknown name read as spdlog's "off" silenced everything).
  const CliRun upper = run("generate --prompt hi --max-tokens 2 --log-level INFO");
  ASSERT_EQ(upper.status, 0) << upper.err;
  EXPECT_THAT(upper.err, HasSubstr("[info]"));
  const CliRun warning = run("--log-level Warning generate --prompt hi --max-tokens 2");
  ASSERT_EQ(warning.status, 0) << warning.err;
  EXPECT_THAT(warning.err, ::testing::Not(HasSubstr("[info]")));
}

TEST(CliGenerate, HelpAndVersionExitZero) {
  for (const char* args : {"--help", "generate --help", "bench latency --help", "--version"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    EXPECT_FALSE(r.out.empty()) << args;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("error:"))) << args;
  }
}

// --prompt "" is given (not missing): the engine rejects it as empty.
TEST(CliGenerate, EmptyPromptIsGivenAndRejected) {
  const CliRun r = run("generate --prompt ''");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: the prompt is empty"));
}

// Engine knobs that would overflow or allocate absurd state fail fast, naming the knob.
TEST(CliGenerate, EngineKnobLimits) {
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"--max-num-seqs 100000", "--max-num-seqs"},
      {"--max-num-seqs 2147483647", "--max-num-seqs"},
      {"--max-num-seqs 0", "--max-num-seqs"},
      {"--max-num-batched-tokens 2000000", "--max-num-batched-tokens"},
      {"--num-state-blocks 2000000000", "--num-state-blocks"},
      {"--threads 100000", "--threads"},
      {"--threads 50000", "--threads"},
      {"--threads -1", "--threads"},
  };
  for (const auto& c : cases) {
    const CliRun r = run("generate --prompt hi --max-tokens 2 " + c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: " + c.expect)) << c.args;
  }
}

// The state pool is sized before it is allocated: 2^20 blocks of tiny-mamba (~0.3 MiB each, ~290 GiB) exceed
// 80% of RAM on any machine this suite runs on.
TEST(CliGenerate, StateMemoryBudget) {
  const double ram_gib = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / (1024.0 * 1024 * 1024);
  if (ram_gib > 300) GTEST_SKIP() << "machine has " << ram_gib << " GiB of RAM";
  const CliRun r = run("generate --prompt hi --max-tokens 2 --num-state-blocks 1048576");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: --num-state-blocks 1048576 needs"));
  EXPECT_THAT(r.err, HasSubstr("GiB"));
}

// A failed write to stdout is an error, not a success.
TEST(CliGenerate, FailedStdoutWriteExitsWithOne) {
  for (const char* args : {"generate --prompt hi --max-tokens 3 --json > /dev/full", "generate --prompt hi --max-tokens 3 > /dev/full"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: cannot write")) << args;
  }
}

// "stop_reason" is on every object: null (length, EOS), the stop string, or the stop token id.
TEST(CliGenerate, JsonStopReasonAlwaysPresent) {
  // Greedy "The" continues " first thing of the world," (806 2181 273 253 1533 13).
  const CliRun plain = run("generate --prompt The --json --max-tokens 3 --ignore-eos");
  ASSERT_EQ(plain.status, 0) << plain.err;
  const auto p = json_lines(plain.out);
  ASSERT_EQ(p.size(), 1u);
  ASSERT_TRUE(p[0].contains("stop_reason"));
  EXPECT_TRUE(p[0]["stop_reason"].is_null());
  EXPECT_EQ(p[0]["finish_reason"], "length");

  const CliRun str = run("generate --prompt The --json --max-tokens 20 --stop ','");
  ASSERT_EQ(str.status, 0) << str.err;
  const auto s = json_lines(str.out);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]["finish_reason"], "stop");
  EXPECT_EQ(s[0]["stop_reason"], ",");

  const CliRun tok = run("generate --prompt The --json --max-tokens 20 --stop-token-ids 13");
  ASSERT_EQ(tok.status, 0) << tok.err;
  const auto t = json_lines(tok.out);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0]["finish_reason"], "stop");
  EXPECT_EQ(t[0]["stop_reason"], 13);
  EXPECT_EQ(t[0]["token_ids"].back(), 13);
  EXPECT_EQ(p[0].size(), t[0].size());  // the same key set either way
}

// A prompts-file line's logit_bias, allowed_token_ids, bad_words and structured_outputs apply to that prompt alone, as
// vLLM's SamplingParams fields; null leaves the field unset.
TEST(CliGenerate, PromptsFileMasksAndBiases) {
  ssmserve::testing::TempDir tmp("cli");
  // Greedy "The" continues " first thing of the world," (806 2181 273 253 1533 13).
  const std::string common = R"("prompt": "The", "max_tokens": 6, "ignore_eos": true)";
  std::string lines = "{" + common + "}\n" +
                      "{" + common + R"(, "allowed_token_ids": [273]})" + "\n" +       // " of" only
                      "{" + common + R"(, "logit_bias": {"253": 100}})" + "\n" +       // " the" at +100
                      "{" + common + R"(, "bad_words": ["thing"]})" + "\n" +           // bans " thing" (2181)
                      "{" + common + R"(, "logit_bias": null, "allowed_token_ids": null, "bad_words": null, )" +
                      R"("structured_outputs": null})" + "\n";
  const bool structured = ssmserve::StructuredOutputManager::available();
  if (structured) {
    lines += R"({"prompt": "The", "max_tokens": 6, "structured_outputs": {"choice": ["yes", "no"]}})" "\n";
    // The server's other spellings of a constraint: vLLM's guided_* and OpenAI's response_format.
    lines += R"({"prompt": "The", "max_tokens": 6, "guided_choice": ["up", "down"]})" "\n";
    lines += R"({"prompt": "The", "max_tokens": 12, "response_format": {"type": "json_schema", "json_schema": )"
             R"({"name": "n", "schema": {"type": "integer"}}}})" "\n";
  }
  ssmserve::testing::write_file(tmp / "p.jsonl", lines);
  const CliRun r = run("generate --prompts-file " + (tmp / "p.jsonl").string() + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto o = json_lines(r.out);
  ASSERT_EQ(o.size(), structured ? 8u : 5u) << r.out;
  using ids = std::vector<int>;
  EXPECT_EQ(o[0]["token_ids"].get<ids>(), (ids{806, 2181, 273, 253, 1533, 13}));
  EXPECT_EQ(o[1]["token_ids"].get<ids>(), ids(6, 273));
  EXPECT_EQ(o[2]["token_ids"].get<ids>(), ids(6, 253));
  const auto banned = o[3]["token_ids"].get<ids>();
  EXPECT_EQ(std::count(banned.begin(), banned.end(), 2181), 0) << o[3].dump();
  EXPECT_EQ(banned[0], 806);  // the ban changes the output only where the word would come
  EXPECT_THAT(o[3]["text"].get<std::string>(), ::testing::Not(HasSubstr("thing")));
  EXPECT_EQ(o[4]["token_ids"], o[0]["token_ids"]);
  if (structured) {
    EXPECT_THAT(o[5]["text"].get<std::string>(), ::testing::AnyOf("yes", "no"));
    EXPECT_EQ(o[5]["finish_reason"], "stop");
    EXPECT_THAT(o[6]["text"].get<std::string>(), ::testing::AnyOf("up", "down"));
    const std::string number = o[7]["text"].get<std::string>();
    EXPECT_FALSE(number.empty());
    if (o[7]["finish_reason"] == "stop") {
      EXPECT_TRUE(nlohmann::json::parse(number).is_number_integer()) << number;
    }
    EXPECT_EQ(number.find_first_not_of("-0123456789"), std::string::npos) << number;
  }
}

// Bad values of those fields fail before anything is generated, naming file:line and the field; token ids are
// checked against the model's vocabulary (50280 for tiny-mamba) once it is loaded, still naming the line.
TEST(CliGenerate, PromptsFileMaskErrorsNameLineAndField) {
  ssmserve::testing::TempDir tmp("cli");
  struct Case {
    std::string fields, expect;
  } cases[] = {
      {R"("logit_bias": [1])", "logit_bias must be an object"},
      {R"("logit_bias": {"x": 1})", "logit_bias keys must be token ids"},
      {R"("logit_bias": {"1": "a"})", "logit_bias must be a number"},
      {R"("logit_bias": {"50280": 1})", "logit_bias: token id 50280 is out of vocabulary range [0, 50280)"},
      {R"("allowed_token_ids": [])", "allowed_token_ids must not be empty"},
      {R"("allowed_token_ids": 5)", "allowed_token_ids must be a list of integers"},
      {R"("allowed_token_ids": [-1])", "allowed_token_ids must be in [0, 2147483647]"},
      {R"("allowed_token_ids": [7, 999999])", "allowed_token_ids[1] = 999999 is out of vocabulary range [0, 50280)"},
      {R"("bad_words": "thing")", "bad_words must be a list of strings"},
      {R"("bad_words": [""])", "bad_words cannot contain an empty string"},
      {R"("bad_words": [3])", "bad_words must be a list of strings"},
      {R"("bad_words": ["   "])", "bad_words[0] must tokenize to at least one token"},
      {R"("stop_token_ids": [50280])", "stop_token_ids[0] = 50280 is out of vocabulary range [0, 50280)"},
      {R"("structured_outputs": "x")", "structured_outputs must be an object"},
      {R"("structured_outputs": {"choice": []})", "structured_outputs.choice must list at least one string"},
      {R"("structured_outputs": {"regex": "a", "choice": ["b"]})", "multiple are specified"},
      {R"("structured_outputs": {"foo": 1})", "structured_outputs.foo is not a field of structured_outputs"},
      {R"("guided_regex": "a", "response_format": {"type": "json_object"})", "multiple are specified: guided_regex, response_format"},
      {R"("response_format": {"type": "xml"})", "response_format.type must be"},
      {R"("guided_whitespace_pattern": " ")", "guided_whitespace_pattern is not supported"},
  };
  for (const auto& c : cases) {
    // The bad line second: the error names its line, not the first.
    ssmserve::testing::write_file(tmp / "p.jsonl", "{\"prompt\": \"The\"}\n{\"prompt\": \"The\", " + c.fields + "}\n");
    const CliRun r = run("generate --prompts-file " + (tmp / "p.jsonl").string() + " --json --max-tokens 2");
    EXPECT_EQ(r.status, 1) << c.fields << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: " + (tmp / "p.jsonl").string() + ":2: ")) << c.fields << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.fields << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.fields << "\n" << r.out;
  }
  if (ssmserve::StructuredOutputManager::available()) {  // xgrammar's reason, before the model loads
    ssmserve::testing::write_file(tmp / "p.jsonl", R"({"prompt": "The", "structured_outputs": {"regex": "[("}})" "\n");
    const CliRun r = run("generate --prompts-file " + (tmp / "p.jsonl").string());
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("p.jsonl:1: structured_outputs.regex is not a valid or supported regular expression"));
  }
}

TEST(CliGenerate, PromptsFromStdin) {
  ssmserve::testing::TempDir tmp("cli");
  ssmserve::testing::write_file(tmp / "p.jsonl", "{\"prompt\": \"The\"}\n{\"prompt\": \"In the\"}\n");
  const CliRun r = run("generate --prompts-file - --json --max-tokens 2 < " + (tmp / "p.jsonl").string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto objs = json_lines(r.out);
  ASSERT_EQ(objs.size(), 2u);
  EXPECT_EQ(objs[0]["prompt"], "The");
  EXPECT_EQ(objs[1]["prompt"], "In the");
}

TEST(CliGenerate, FlagAndFileErrorsNameTheProblem) {
  ssmserve::testing::TempDir tmp("cli");
  ssmserve::testing::write_file(tmp / "empty_prompt.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": \"\"}\n");
  // A "stop" nested 300,000 deep (crashed the JSON value copy before the depth check).
  ssmserve::testing::write_file(tmp / "deep_stop.jsonl",
                                "{\"prompt\": \"x\", \"stop\": " + std::string(300000, '[') + std::string(300000, ']') + "}\n");
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"generate --prompt hi --stop-token-ids -1", "--stop-token-ids"},
      {"generate --prompt hi --stop-token-ids 999999", "[0, 50280)"},  // the model's real vocabulary
      {"generate --prompt hi --temperature inf", "--temperature must be finite"},
      {"generate --prompt hi --repetition-penalty nan", "--repetition-penalty must be finite"},
      {"generate --prompts-file " + (tmp / "empty_prompt.jsonl").string(), "empty_prompt.jsonl:2: the prompt is empty"},
      {"generate --prompts-file " + tmp.path().string(), "is a directory"},
      {"generate --prompt hi --seed -1", "--seed must be an integer in [0, 9223372036854775807]"},
      // Beyond the server's range: an error naming the value, never clamped to 2^63 - 1.
      {"generate --prompt hi --seed 9223372036854775808", "(got '9223372036854775808')"},
      {"generate --prompt hi --seed 99999999999999999999", "--seed must be an integer"},
      {"generate --prompt hi --seed 1x", "(got '1x')"},
      {"generate --prompts-file " + (tmp / "deep_stop.jsonl").string(), "deep_stop.jsonl:1"},
      // The flag the folder came from, and what is wrong with it.
      {"generate --prompt hi --tokenizer " + (tmp / "nowhere").string(), "--tokenizer " + (tmp / "nowhere").string() + ": no such folder"},
      {"generate --prompt hi --tokenizer " + tmp.path().string(), ": no tokenizer.json (nor a SentencePiece tokenizer.model) in that folder"},
      {"generate --prompt hi --device foo", "--device foo: unknown device (choose from: cpu, auto"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error:")) << c.args;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("1073741824"))) << c.args;
  }
}

// A sampling flag's bad value is reported under the flag the user typed, not SamplingParams' field; a prompts-file
// line's under file:line and its JSON field.
TEST(CliGenerate, SamplingErrorsNameTheFlagOrTheLineField) {
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"--max-tokens 0", "--max-tokens must be at least 1, got 0"},
      {"--min-tokens -1", "--min-tokens must be greater than or equal to 0, got -1"},
      {"--min-tokens 5 --max-tokens 2", "--min-tokens must be less than or equal to --max-tokens=2, got 5"},
      {"--temperature -1", "--temperature must be non-negative, got -1"},
      {"--top-p 1.5", "--top-p must be in (0, 1], got 1.5"},
      {"--top-k -2", "--top-k must be 0 or -1 (disable), or at least 1, got -2"},
      {"--min-p 2", "--min-p must be in [0, 1], got 2"},
      {"--repetition-penalty 0", "--repetition-penalty must be greater than zero, got 0"},
      {"--presence-penalty 3", "--presence-penalty must be in [-2, 2], got 3"},
      {"--frequency-penalty -3", "--frequency-penalty must be in [-2, 2], got -3"},
      {"--stop ''", "--stop cannot contain an empty string (stop[0])"},
      {"--logprobs 21", "--logprobs must be in [0, 20], got 21"},
      {"--prompt-logprobs 21", "--prompt-logprobs must be in [0, 20], got 21"},
      {"--stop-token-ids 50280", "--stop-token-ids[0] = 50280 is out of vocabulary range [0, 50280)"},  // the model's
  };
  for (const auto& c : cases) {
    const CliRun r = run("generate --prompt hi " + c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: " + c.expect)) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("SamplingParams"))) << c.args << "\n" << r.err;
  }
  ssmserve::testing::TempDir tmp("cli");
  struct LineCase {
    std::string fields, flags, expect;
  } lines[] = {
      {R"("max_tokens": 0)", "", "max_tokens must be at least 1, got 0"},
      {R"("top_p": 0)", "", "top_p must be in (0, 1], got 0"},
      {R"("min_tokens": 3)", "--max-tokens 2", "min_tokens must be less than or equal to max_tokens=2, got 3"},
      {R"("stop_token_ids": [50280])", "", "stop_token_ids[0] = 50280 is out of vocabulary range [0, 50280)"},
  };
  for (const auto& c : lines) {
    ssmserve::testing::write_file(tmp / "p.jsonl", "{\"prompt\": \"The\"}\n{\"prompt\": \"The\", " + c.fields + "}\n");
    const CliRun r = run("generate --prompts-file " + (tmp / "p.jsonl").string() + " --json " + c.flags);
    EXPECT_EQ(r.status, 1) << c.fields << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error: " + (tmp / "p.jsonl").string() + ":2: " + c.expect)) << c.fields << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("SamplingParams"))) << c.fields << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.fields << "\n" << r.out;
  }
}

// The hybrid checkpoints run with `--model DIR --json` and a prompt, nothing else (default pool, context, budget, greedy 64
// tokens) and give transformers' greedy continuation: the golden's 32 tokens (tests/data/goldens; this prompt has
// no near-tie in them) start the output.
void expect_generate_matches_golden(const std::string& model) {
  const auto dir = ssmserve::testing::model_dir(model);
  SSM_SKIP_IF_NO_MODEL(dir);
  const auto golden = ssmserve::testing::read_json(ssmserve::testing::source_dir() / "tests/data/goldens" / (model + ".json"));
  const nlohmann::json* g = nullptr;
  for (const auto& p : golden["prompts"])
    if (p["name"] == "kjv_moses") g = &p;
  ASSERT_NE(g, nullptr);
  ASSERT_EQ((*g)["prompt"], "And the LORD said unto Moses,");
  const CliRun r = run("generate --model " + dir.string() + " --prompt 'And the LORD said unto Moses,' --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto objs = json_lines(r.out);
  ASSERT_EQ(objs.size(), 1u) << r.out;
  const nlohmann::json& o = objs[0];
  EXPECT_EQ(o["prompt_token_ids"], (*g)["prompt_token_ids"]);
  const auto ids = o["token_ids"].get<std::vector<int>>(), want = (*g)["greedy_token_ids"].get<std::vector<int>>();
  if (o["finish_reason"] == "length") {
    EXPECT_EQ(ids.size(), 64u);  // the default --max-tokens
  }
  ASSERT_GE(ids.size(), want.size()) << "stopped early: " << o.dump();
  EXPECT_EQ(std::vector<int>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(want.size())), want);
  EXPECT_FALSE(o["text"].get<std::string>().empty());
}

TEST(CliGenerate, GraniteMoeHybridWithNoOtherFlag) { expect_generate_matches_golden("tiny-granitemoehybrid"); }

TEST(CliGenerate, NemotronHWithNoOtherFlag) { expect_generate_matches_golden("tiny-nemotron_h"); }

// `serve` refuses to start, as vLLM does, when one request of the given --max-model-len cannot fit in the block
// pool (a hybrid model's KV blocks), instead of failing the request mid-generation; it names the flags that fix it.
// (Without --max-model-len the model's context is lowered to the pool's capacity with a warning.)
TEST(CliServe, RefusesAPoolBelowMaxModelLen) {
  const auto dir = ssmserve::testing::model_dir("tiny-minimax");
  if (!std::filesystem::exists(dir / "config.json")) GTEST_SKIP() << "no " << dir;
  const CliRun r = run("serve --model " + dir.string() + " --num-state-blocks 4 --max-model-len 8192 --port 0 --threads 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("does not fit in the block pool")) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--num-state-blocks")) << r.err;
}

}  // namespace
