// `ssmserve bench throughput` as a user runs it on models/tiny-mamba: the printed numbers, the --output-json
// fields, --dataset prompts from a JSONL file, and clear errors with exit code 1 for bad flags and files; `bench
// latency` and `bench multiturn` limits against the context.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <unistd.h>

#include "checkpoint_fixtures.h"
#include "cli_runner.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using ssmserve::testing::CliRun;
CliRun run(const std::string& args) { return ssmserve::testing::run_cli(args); }

const std::string kTiny = std::string(SSMSERVE_SOURCE_DIR) + "/models/tiny-mamba";

TEST(CliBenchThroughput, PrintsNumbersAndWritesJson) {
  ssmserve::testing::TempDir tmp("clibench");
  const std::string json_path = (tmp / "tput.json").string();
  const CliRun r = run("bench throughput --model " + kTiny +
                       " --num-prompts 6 --input-len 16 --output-len 8 --max-num-seqs 4 --seed 3 --output-json " + json_path);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("requests/s"));
  EXPECT_THAT(r.out, HasSubstr("total tokens/s"));
  EXPECT_THAT(r.out, HasSubstr("output tokens/s"));
  EXPECT_THAT(r.out, HasSubstr("elapsed:"));
  EXPECT_THAT(r.err, HasSubstr("6/6"));  // progress bar reached the end
  const nlohmann::json j = nlohmann::json::parse(ssmserve::testing::read_file(json_path));
  for (const char* k : {"num_requests", "elapsed_time", "requests_per_second", "tokens_per_second", "output_tokens_per_second",
                        "total_num_tokens", "num_prompt_tokens", "num_output_tokens", "max_num_seqs"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["num_requests"], 6);
  EXPECT_EQ(j["num_prompt_tokens"], 6 * 16);
  EXPECT_EQ(j["num_output_tokens"], 6 * 8);  // ignore_eos: exactly output-len each
  EXPECT_EQ(j["total_num_tokens"], 6 * 24);
  EXPECT_EQ(j["max_num_seqs"], 4);
  EXPECT_GT(j["elapsed_time"].get<double>(), 0.0);
  EXPECT_NEAR(j["output_tokens_per_second"].get<double>(), 48.0 / j["elapsed_time"].get<double>(), 1e-6);
  EXPECT_NEAR(j["requests_per_second"].get<double>(), 6.0 / j["elapsed_time"].get<double>(), 1e-6);
}

TEST(CliBenchThroughput, DatasetPromptsWithDummyWeights) {
  ssmserve::testing::TempDir tmp("clibench");
  ssmserve::testing::write_file(tmp / "d.jsonl",
                                "{\"text\": \"In the beginning God created the heaven and the earth.\"}\n\n"
                                "{\"prompt\": \"And the earth was without form, and void\"}\n"
                                "{\"text\": \"never read: only the first N records are used\"}\n");
  const std::string json_path = (tmp / "d.json").string();
  // Dummy weights from tiny-mamba's config; its tokenizer.json comes with the folder.
  const CliRun r = run("bench throughput --model " + kTiny + " --load-format dummy --tokenizer " + kTiny + " --dataset " +
                       (tmp / "d.jsonl").string() + " --num-prompts 2 --input-len 4 --output-len 3 --output-json " + json_path);
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(ssmserve::testing::read_file(json_path));
  EXPECT_EQ(j["num_requests"], 2);
  EXPECT_EQ(j["num_prompt_tokens"], 2 * 4);  // both prompts are longer than 4 tokens: truncated
  EXPECT_EQ(j["num_output_tokens"], 2 * 3);
}

// vLLM's spellings: --dataset-name random | custom with --dataset-path, --random-input-len / --random-output-len.
TEST(CliBenchThroughput, TakesVllmsDatasetSpellings) {
  ssmserve::testing::TempDir tmp("clibench");
  ssmserve::testing::write_file(tmp / "d.jsonl", "{\"prompt\": \"In the beginning God created the heaven\"}\n");
  const std::string json_path = (tmp / "v.json").string();
  CliRun r = run("bench throughput --model " + kTiny + " --dataset-name custom --dataset-path " + (tmp / "d.jsonl").string() +
                 " --num-prompts 2 --random-input-len 3 --random-output-len 2 --output-json " + json_path);
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(ssmserve::testing::read_file(json_path));
  EXPECT_EQ(j["dataset"], (tmp / "d.jsonl").string());
  EXPECT_EQ(j["num_prompt_tokens"], 2 * 3);
  EXPECT_EQ(j["num_output_tokens"], 2 * 2);
  r = run("bench throughput --model " + kTiny + " --dataset-name random --num-prompts 2 --random-input-len 5 --output-len 2 "
          "--output-json " + json_path);
  ASSERT_EQ(r.status, 0) << r.err;
  j = nlohmann::json::parse(ssmserve::testing::read_file(json_path));
  EXPECT_TRUE(j["dataset"].is_null());
  EXPECT_EQ(j["num_prompt_tokens"], 2 * 5);
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--dataset-name sharegpt", "--dataset-name sharegpt is not supported"},
           {"--dataset-name custom", "--dataset-name custom needs --dataset-path"},
           {"--dataset-name random --dataset-path x.jsonl", "--dataset-path needs --dataset-name custom"},
           {"--dataset a.jsonl --dataset-path b.jsonl", "give the dataset once"}}) {
    r = run("bench throughput --model " + kTiny + " --num-prompts 1 " + args);
    EXPECT_EQ(r.status, 1) << args;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << ": " << r.err;
  }
}

TEST(CliBenchThroughput, DatasetWithoutInputLenKeepsWholePrompts) {
  ssmserve::testing::TempDir tmp("clibench");
  ssmserve::testing::write_file(tmp / "d.jsonl", "{\"prompt\": \"The\"}\n");  // "The" = one token
  const std::string json_path = (tmp / "d.json").string();
  const CliRun r = run("bench throughput --model " + kTiny + " --dataset " + (tmp / "d.jsonl").string() +
                       " --num-prompts 5 --output-len 2 --output-json " + json_path);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("only 1 record; it is reused"));
  // The record is reused to make --num-prompts requests (as bench serve and vLLM's oversampling).
  const nlohmann::json j = nlohmann::json::parse(ssmserve::testing::read_file(json_path));
  EXPECT_EQ(j["num_requests"], 5);
  EXPECT_EQ(j["num_prompt_tokens"], 5);
}

TEST(CliBenchThroughput, ErrorsExitWithOne) {
  ssmserve::testing::TempDir tmp("clibench");
  ssmserve::testing::write_file(tmp / "bad.jsonl", "{\"text\": \"ok\"}\n{not json\n");
  ssmserve::testing::write_file(tmp / "nokey.jsonl", "{\"title\": \"ok\"}\n");
  ssmserve::testing::write_file(tmp / "empty.jsonl", "\n\n");
  std::filesystem::create_directories(tmp / "config-only");  // dummy weights and no tokenizer
  std::filesystem::copy_file(std::filesystem::path(kTiny) / "config.json", tmp / "config-only" / "config.json");
  const std::string base = "bench throughput --model " + kTiny + " --output-len 2 ";
  struct Case {
    std::string args, expect;
  } cases[] = {
      {base + "--num-prompts 0", "--num-prompts"},
      {base + "--input-len 0", "--input-len"},
      {"bench throughput --model " + kTiny + " --output-len 0", "--output-len"},
      {base + "--num-prompts 2 --dataset " + (tmp / "bad.jsonl").string(), "bad.jsonl:2"},
      {base + "--dataset " + (tmp / "nokey.jsonl").string(), "nokey.jsonl:1"},
      {base + "--dataset " + (tmp / "empty.jsonl").string(), "no records"},
      {base + "--dataset " + (tmp / "missing.jsonl").string(), "missing.jsonl"},
      {base + "--load-format dummy --tokenizer " + tmp.path().string() + " --dataset " + (tmp / "bad.jsonl").string(),
       "--tokenizer " + tmp.path().string() + ": no tokenizer.json"},
      {"bench throughput --output-len 2 --load-format dummy --model " + (tmp / "config-only").string() + " --dataset " +
           (tmp / "bad.jsonl").string(),
       "--dataset needs a tokenizer"},
      {base + "--load-format foo", "load-format"},
      {base + "--dtype half", "--dtype half: fp16 weights are not supported"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args;
    EXPECT_THAT(r.err, HasSubstr("error:")) << c.args;
  }
}

TEST(CliBenchLatency, ErrorsExitWithOne) {
  ssmserve::testing::TempDir tmp("clibench");
  const std::string base = "bench latency --model " + kTiny + " --num-iters 1 --output-len 2 ";
  struct Case {
    std::string args, expect;
  } cases[] = {
      {base + "--num-iters-warmup -5", "--num-iters-warmup"},
      {base + "--num-iters-warmup -1", "--num-iters-warmup"},
      {base + "--batch-size 1000000", "--batch-size"},
      {base + "--batch-size 0", "--batch-size"},
      {base + "--input-len 2000000", "--input-len"},
      {"bench latency --model " + kTiny + " --output-len 2000000", "--output-len"},
      {base + "--threads 100000", "--threads"},
      {base + "--max-num-seqs 2147483647", "--max-num-seqs"},
      // The bench raises --max-num-seqs to the batch and --max-num-batched-tokens to its prompts, but only after the
      // user's values are checked (as generate checks them).
      {base + "--max-num-seqs 0", "--max-num-seqs must be in [1, 16384] (got 0)"},
      {base + "--batch-size 3 --max-num-seqs -5", "--max-num-seqs must be in [1, 16384] (got -5)"},
      {base + "--max-num-batched-tokens -3", "--max-num-batched-tokens must be in [1, "},
      {base + "--max-num-seqs 0 --num-state-blocks 8", "--max-num-seqs must be in [1, 16384] (got 0)"},
      {base + "--max-num-seqs 0 --speculative-config '{\"method\": \"replay\", \"num_speculative_tokens\": 2}'",
       "--max-num-seqs must be in [1, 16384] (got 0)"},
      {base + "--dtype fp32", "--dtype must be one of"},
      // A pool given by hand must hold the whole batch at once, else the requests run a few at a time.
      {base + "--batch-size 3 --num-state-blocks 3 --no-enable-prefix-caching",
       "--num-state-blocks 3 cannot hold --batch-size 3 running requests at once (it needs 4: one block per request, "
       "plus the null block)"},
      {base + "--batch-size 3 --num-state-blocks 6 --speculative-config '{\"method\": \"ngram\", "
              "\"num_speculative_tokens\": 2}'",
       "(it needs 10: one block per request and 2 per request for the speculative tokens, plus the null block)"},
      {"bench latency --model " + std::string(SSMSERVE_SOURCE_DIR) + "/tests/data/tiny-hybrids/tiny-bamba --load-format "
       "dummy --num-iters 1 --input-len 8 --output-len 4 --batch-size 3 --num-state-blocks 6",
       "(it needs 7: one block per request and 1 KV block of 128 tokens per request, plus the null block)"},
      {base + "--output-json /nonexistent/dir/x.json", "/nonexistent/dir/x.json: cannot write"},
      {base + "--output-json " + tmp.path().string(), "is a directory"},
      {base + "--bogus", "(see ssmserve bench latency --help)"},
      {base + "--input-len abc", "(see ssmserve bench latency --help)"},
      {"bench", "(see ssmserve bench --help)"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error:")) << c.args;
  }
}

TEST(CliBenchLatency, ReplayChecksAHandGivenPoolBeforeThePlainPass) {
  // The plain pass needs 4 blocks, the speculative pass after it 10: refused before anything is measured.
  const CliRun r = run("bench latency --model " + kTiny + " --num-iters 1 --input-len 8 --output-len 4 --batch-size 3 "
                       "--num-state-blocks 6 --speculative-config '{\"method\": \"replay\", \"num_speculative_tokens\": 2}'");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(it needs 10: one block per request and 2 per request for the speculative tokens, plus "
                               "the null block)"));
  EXPECT_THAT(r.err, Not(HasSubstr("(warmup)"))) << "the plain pass ran first";
}

TEST(CliBenchLatency, HelpSaysThePoolAndSchedulerFollowTheBatch) {
  // generate's "0 = max-num-seqs + 1" is not what bench latency does with --num-state-blocks 0.
  const CliRun r = run("bench latency --help");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("0 = max-num-seqs + 1")));
  EXPECT_THAT(r.out, HasSubstr("0 = sized for the largest --batch-size"));
  EXPECT_THAT(r.out, HasSubstr("then set to the largest --batch-size"));
  const CliRun g = run("generate --help");
  EXPECT_THAT(g.out, HasSubstr("0 = max-num-seqs + 1"));
}

TEST(CliBenchLatency, AGivenPoolHoldingTheBatchRunsWithoutWarnings) {
  // Only the batch's requests ever run, so a pool that holds them and one cached state is enough: no warning about
  // --max-num-seqs 256 (never given) leaving no room for cached states.
  const CliRun r = run("bench latency --model " + kTiny +
                       " --batch-size 3 --num-state-blocks 5 --input-len 8 --output-len 2 --num-iters 1 --threads 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("batch 3,"));
  EXPECT_THAT(r.err, Not(HasSubstr("no room for cached states"))) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("--max-num-seqs 256"))) << r.err;
}

TEST(CliBenchLatency, UnwritableOutputFailsBeforeTheRun) {
  // A folder where no file can be created: the error comes before the benchmark runs (nothing printed).
  for (const char* sub : {"latency --num-iters 1 --output-len 2", "throughput --num-prompts 1 --input-len 2 --output-len 2"}) {
    const CliRun r = run(std::string("bench ") + sub + " --model " + kTiny + " --output-json /proc/ssmserve-bench.json");
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("/proc/ssmserve-bench.json: cannot write the JSON output (cannot open the file"));
    EXPECT_EQ(r.out, "") << sub;
  }
}

TEST(CliBenchLatency, InputPlusOutputBeyondTheContextIsAnError) {
  // configs/minimax-bench has max_position_embeddings 131072; the decode numbers assume every token is generated.
  const CliRun r = run("bench latency --model " + std::string(SSMSERVE_SOURCE_DIR) + "/configs/minimax-bench" +
                       " --load-format dummy --input-len 131000 --output-len 100 --num-iters 1 --num-iters-warmup 0");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--input-len 131000 + --output-len 100 exceed the model's maximum context length of 131072"));
}

TEST(CliBenchThroughput, InputPlusOutputBeyondTheContextIsAnError) {
  // As bench latency: without --max-model-len the model's context bounds --input-len + --output-len (before: the
  // engine stopped each request at the context and the run reported 2 output tokens per request instead of 100).
  const CliRun r = run("bench throughput --model " + std::string(SSMSERVE_SOURCE_DIR) + "/tests/data/tiny-hybrids/tiny-qwen3_5" +
                       " --load-format dummy --input-len 4090 --output-len 100 --num-prompts 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--input-len 4090 + --output-len 100 exceed the model's maximum context length of 4096"));
  EXPECT_THAT(r.out, Not(HasSubstr("Throughput")));
}

TEST(CliBenchMultiturn, HistoryBeyondTheContextIsAnErrorBeforeAnyRow) {
  // Turn 2 = history + answer + new tokens must leave room for one token; checked for every length up front, not
  // after the shorter lengths have run (before: an unnamed prompt-length error at the last default length).
  const CliRun r = run("bench multiturn --model " + kTiny + " --max-model-len 300 --history-lens 16 280 --num-iters 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--history-lens 280 + --output-len 32 + --turn-tokens 200 leave no room"));
  EXPECT_THAT(r.out, Not(HasSubstr("TTFT")));
}

TEST(CliBenchMultiturn, HybridHistoryBeyondTheBlockPoolIsCheckedUpFront) {
  // A hybrid's turn 2 must also fit what one request's KV blocks can take in the pool (here 18 x 32 tokens or
  // 58 x 32): given lengths are an error before any row, default ones are trimmed (before: the rows that fit ran,
  // then the run died at the first longer one with the engine's "needs N blocks" error).
  const std::string hybrid = std::string(SSMSERVE_SOURCE_DIR) + "/tests/data/tiny-hybrids/tiny-qwen3_5 --load-format dummy";
  const CliRun given = run("bench multiturn --model " + hybrid + " --num-state-blocks 20 --history-lens 16 2000 --num-iters 1");
  EXPECT_EQ(given.status, 1) << given.err;
  EXPECT_THAT(given.err, HasSubstr("--history-lens 2000 + --output-len 32 + --turn-tokens 200 leave no room for a token "
                                   "within what one request's KV blocks can take in the block pool (--num-state-blocks), "
                                   "576 tokens"));
  EXPECT_THAT(given.out, Not(HasSubstr("TTFT")));
  const CliRun trimmed = run("bench multiturn --model " + hybrid + " --num-state-blocks 60 --num-iters 1");
  ASSERT_EQ(trimmed.status, 0) << trimmed.err;
  EXPECT_THAT(trimmed.out, HasSubstr("      1024"));
  EXPECT_THAT(trimmed.out, Not(HasSubstr("      2048")));
}

TEST(CliBenchMultiturn, DefaultHistoryLengthsAreTrimmedToTheContext) {
  const CliRun r = run("bench multiturn --model " + kTiny + " --max-model-len 1100 --num-iters 1 --output-len 2 --turn-tokens 8");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("      1024"));
  EXPECT_THAT(r.out, Not(HasSubstr("2048")));
  const CliRun none = run("bench multiturn --model " + kTiny + " --max-model-len 500");
  EXPECT_EQ(none.status, 1) << none.err;
  EXPECT_THAT(none.err, HasSubstr("too short for the default --history-lens"));
}

TEST(CliBenchLatency, WritesJson) {
  ssmserve::testing::TempDir tmp("clibench");
  const std::string json_path = (tmp / "lat.json").string();
  const CliRun r = run("bench latency --model " + kTiny + " --num-iters 1 --num-iters-warmup 0 --input-len 4 --output-len 2 --output-json " +
                       json_path);
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(ssmserve::testing::read_file(json_path));
  EXPECT_EQ(j["batch_size"], 1);
  EXPECT_EQ(j["input_len"], 4);
  // The host time per decode step outside the model's forward: positive and below the whole time per step.
  const double host_us = j["decode_host_us_per_step"].get<double>(), tps = j["decode_tokens_per_s"].get<double>();
  EXPECT_GT(host_us, 0.0);
  EXPECT_LT(host_us, 1e6 / tps);
  EXPECT_NE(r.out.find("decode host time outside the model's forward"), std::string::npos) << r.out;
  // vLLM's fields: each iteration's whole latency, their mean and percentiles (ascending, inside the range).
  const auto lat = j["latencies"].get<std::vector<double>>();
  ASSERT_EQ(lat.size(), 1u);
  EXPECT_DOUBLE_EQ(j["avg_latency"].get<double>(), lat[0]);
  for (const char* q : {"10", "25", "50", "75", "90", "99"}) EXPECT_DOUBLE_EQ(j["percentiles"][q].get<double>(), lat[0]) << q;
  EXPECT_NE(r.out.find("Avg latency: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("99% percentile latency: "), std::string::npos) << r.out;
}

// The batch's state blocks are sized before they are allocated: 16384 blocks of mamba-130m (~2.7 MiB each,
// ~43 GiB) are refused on a machine with less than ~54 GiB of RAM, naming --batch-size.
TEST(CliBenchLatency, StateMemoryBudget) {
  const double ram_gib = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / (1024.0 * 1024 * 1024);
  if (ram_gib > 50) GTEST_SKIP() << "machine has " << ram_gib << " GiB of RAM";
  const CliRun r = run("bench latency --model " + std::string(SSMSERVE_SOURCE_DIR) +
                       "/configs/mamba-130m --load-format dummy --batch-size 16384 --num-iters 1 --output-len 2");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: --batch-size 16384"));
  EXPECT_THAT(r.err, HasSubstr("GiB"));
}

TEST(CliBenchThroughput, LimitsAndOutputErrors) {
  ssmserve::testing::TempDir tmp("clibench");
  const std::string base = "bench throughput --model " + kTiny + " --num-prompts 1 --input-len 2 --output-len 2 ";
  struct Case {
    std::string args, expect;
  } cases[] = {
      {base + "--seed -1", "--seed"},
      {"bench throughput --model " + kTiny + " --num-prompts 2000000", "--num-prompts"},
      {"bench throughput --model " + kTiny + " --num-prompts 1000000 --input-len 1000000", "prompt tokens"},
      {"bench throughput --model " + kTiny + " --output-len 2000000", "--output-len"},
      {base + "--max-num-batched-tokens 2000000", "--max-num-batched-tokens"},
      {base + "--output-json /nonexistent/dir/x.json", "cannot write"},
      {base + "--output-json " + tmp.path().string(), "is a directory"},
  };
  for (const auto& c : cases) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect)) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("error:")) << c.args;
  }
}

TEST(CliBenchThroughput, FailedStdoutWriteExitsWithOne) {
  const CliRun r = run("bench throughput --model " + kTiny + " --num-prompts 1 --input-len 2 --output-len 2 > /dev/full");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("error: cannot write"));
}

}  // namespace
