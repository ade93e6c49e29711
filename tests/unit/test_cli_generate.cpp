// `ssmserve generate` as a user runs it: the --json contract (fields, order, logprob shapes), --prompts-file
// order, streaming text, and clear errors with exit code 1 for bad flags and files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "checkpoint_fixtures.h"

namespace {

using ::testing::HasSubstr;

struct CliRun {
  int status = -1;  // exit code, or -signal
  std::string out, err;
};

CliRun run(const std::string& args) {
  ssmserve::testing::TempDir tmp("cli");
  const std::string cmd = std::string(SSMSERVE_BINARY) + " " + args + " 2>" + (tmp / "err").string();
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  r.err = ssmserve::testing::read_file(tmp / "err");
  return r;
}

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
      {"generate --prompt hi --top-p 0", "top_p"},
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

}  // namespace
