// Mistral's tekken.json (issue 32): a small tekken file (tests/data/tokenizers/tekken/make_tekken.py: a byte-level
// BPE trained on LAMBADA, written in tekken's format with the v7 special tokens padded by fillers and the vocab cut
// by default_vocab_size) encodes to the ids of mistral_common's Tekkenizer.encode(text, bos=True, eos=False) and
// decodes back (specials skipped) to its decode; hostile files are clear errors naming the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tekken.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace ssmserve {
namespace {

const std::filesystem::path kDir = testing::source_dir() / "tests" / "data" / "tokenizers" / "tekken";

TEST(Tekken, MatchesMistralCommon) {
  const Tokenizer tok = Tokenizer::from_tekken(kDir / "tekken.json");
  std::ifstream in(kDir / "expected.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const auto e = nlohmann::json::parse(line);
    const std::string text = e["text"];
    const std::vector<int> want = e["ids"].get<std::vector<int>>();
    EXPECT_EQ(tok.encode(text, /*add_special_tokens=*/true), want) << text.substr(0, 80);
    EXPECT_EQ(tok.decode(want, /*skip_special_tokens=*/true), e["decoded"].get<std::string>()) << text.substr(0, 80);
    ++n;
  }
  EXPECT_GE(n, 70);
  // Special tokens: ids [0, 100), "<s>" = 1 added first; the last 20 merges were cut by default_vocab_size.
  EXPECT_EQ(tok.encode("", true), std::vector<int>{1});
  EXPECT_EQ(tok.vocab_size(), 100 + 956 - 20);
}

TEST(Tekken, FromPretrainedFindsIt) {
  const auto dir = std::filesystem::temp_directory_path() / ("ssm-tekken-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kDir / "tekken.json", dir / "tekken.json", std::filesystem::copy_options::overwrite_existing);
  const Tokenizer tok = Tokenizer::from_pretrained(dir);
  EXPECT_EQ(tok.encode("Hello", false), Tokenizer::from_tekken(kDir / "tekken.json").encode("Hello", false));
  std::filesystem::remove_all(dir);
}

TEST(Tekken, HostileFilesAreClearErrors) {
  nlohmann::json base = nlohmann::json::parse(std::ifstream(kDir / "tekken.json"));
  auto expect_error = [&](nlohmann::json j, const std::string& needle) {
    try {
      tekken::convert(j);
      ADD_FAILURE() << "no error, wanted " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto j = base;
  j["config"]["default_vocab_size"] = 5000;
  expect_error(j, "default_vocab_size");
  j = base;
  j["vocab"][3]["token_bytes"] = "QQ==";  // "A", not byte 3
  expect_error(j, "single byte");
  j = base;
  j["vocab"][300]["token_bytes"] = "!!";
  expect_error(j, "base64");
  j = base;
  j["config"].erase("pattern");
  expect_error(j, "pattern");
  j = base;
  j["config"]["default_num_special_tokens"] = 3;
  expect_error(j, "special tokens");
  j = base;
  j["vocab"][400]["rank"] = 7;
  expect_error(j, "rank");
  EXPECT_EQ(tekken::base64_decode("aGVsbG8="), "hello");
}

}  // namespace
}  // namespace ssmserve
