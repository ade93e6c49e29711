// Owns the tokenizer's LAMBADA exactness and speed test: every passage of shared/data/lambada_test.jsonl against committed HF ids.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

const std::filesystem::path kRoot = SSMSERVE_SOURCE_DIR;

std::filesystem::path shared_dir() {
  const char* env = std::getenv("SSMSERVE_SHARED_DIR");
  return env != nullptr && *env != '\0' ? std::filesystem::path(env) : kRoot / ".." / "shared";
}

TEST(TokenizerLambada, AllPassagesMatchHuggingFace) {
  const std::filesystem::path passages_path = shared_dir() / "data" / "lambada_test.jsonl";
  if (!std::filesystem::exists(passages_path)) {
    GTEST_SKIP() << "LAMBADA passages not found: " << passages_path.string()
                 << " (set SSMSERVE_SHARED_DIR to the folder holding data/lambada_test.jsonl)";
  }
  std::vector<std::string> texts;
  {
    std::ifstream in(passages_path);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    }
  }
  std::vector<std::vector<int>> expected;
  {
    std::ifstream in(kRoot / "tests/data/tokenizer/lambada_ids.txt");
    ASSERT_TRUE(in.good());
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::vector<int> ids;
      for (int id; ss >> id;) ids.push_back(id);
      expected.push_back(std::move(ids));
    }
  }
  ASSERT_EQ(texts.size(), expected.size()) << "lambada_ids.txt was made from a different lambada_test.jsonl";

  // A fresh tokenizer, so the timing includes filling the BPE word cache.
  const Tokenizer tok = Tokenizer::from_file(kRoot / "models/tiny-mamba/tokenizer.json");
  std::size_t bytes = 0, tokens = 0;
  std::vector<std::vector<int>> got(texts.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < texts.size(); ++i) got[i] = tok.encode(texts[i]);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::size_t bad = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    bytes += texts[i].size();
    tokens += got[i].size();
    if (got[i] != expected[i] && ++bad <= 5) ADD_FAILURE() << "encode mismatch on passage " << i;
    // HF decodes every passage back to its text exactly (checked by the generator script).
    if (tok.decode(expected[i]) != texts[i] && ++bad <= 5) ADD_FAILURE() << "decode mismatch on passage " << i;
    IncrementalDetokenizer d(tok);
    std::string streamed;
    for (int id : expected[i]) {
      const std::string chunk = d.push(id);
      if (!utf8::is_valid(chunk) && ++bad <= 5) ADD_FAILURE() << "invalid UTF-8 chunk in passage " << i;
      streamed += chunk;
    }
    streamed += d.flush();
    if (streamed != texts[i] && ++bad <= 5) ADD_FAILURE() << "streamed decode mismatch on passage " << i;
  }
  EXPECT_EQ(bad, 0u);
  std::printf("[tokenizer] LAMBADA: %zu passages, %zu bytes, %zu tokens encoded in %.3f s (%.1f MB/s)\n",
              texts.size(), bytes, tokens, secs, static_cast<double>(bytes) / secs / 1e6);
}

}  // namespace
}  // namespace ssmserve
