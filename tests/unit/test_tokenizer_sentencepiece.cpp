// Owns the SentencePiece tests: tokenizer.model files (BPE and unigram, byte fallback) against the `sentencepiece`
// Python package's ids and decodes (tools/make_tokenizer_sentencepiece_expected.py), streaming decode, folder
// loading, and hostile model files (truncated, lying protobuf lengths, random bytes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_file;

const std::filesystem::path kRoot = SSMSERVE_SOURCE_DIR;
const std::filesystem::path kData = kRoot / "tests/data/tokenizers";

std::string fnv(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<std::string> lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << "cannot read " << p;
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class SentencePiece : public ::testing::TestWithParam<std::string> {};

TEST_P(SentencePiece, MatchesThePythonPackage) {
  const std::filesystem::path dir = kData / GetParam();
  const Tokenizer tok = Tokenizer::from_sentencepiece(dir / "tokenizer.model");
  std::vector<std::string> texts;
  for (const std::string& line : lines(kData / "texts.jsonl")) {
    const std::string hex = json::parse(line).at("hex");
    std::string bytes;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    texts.push_back(std::move(bytes));
  }
  const std::vector<std::string> expected = lines(dir / "expected.jsonl");
  ASSERT_EQ(texts.size(), expected.size());
  const int bos = *tok.token_to_id("<s>");
  int bad = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const json e = json::parse(expected[i]);
    const std::string what = "text #" + std::to_string(i) + " " + json(utf8::repair(texts[i])).dump();
    const std::vector<int> want = tok.encode(texts[i], false);
    std::string key;
    for (std::size_t k = 0; k < want.size(); ++k) key += (k > 0 ? "," : "") + std::to_string(want[k]);
    if ((fnv(key) != e.at("ids").get<std::string>() || want.size() != e.at("n").get<std::size_t>()) && ++bad <= 10)
      ADD_FAILURE() << "encode differs on " << what << ": got " << key;
    std::vector<int> with_bos = want;
    with_bos.insert(with_bos.begin(), bos);
    if (tok.encode(texts[i]) != with_bos && ++bad <= 10) ADD_FAILURE() << "encode with BOS differs on " << what;
    const std::string dec = tok.decode(want);
    if (fnv(dec) != e.at("dec").get<std::string>() && ++bad <= 10)
      ADD_FAILURE() << "decode differs on " << what << ": " << json(dec).dump();
    IncrementalDetokenizer d(tok);
    std::string streamed;
    for (int id : with_bos) streamed += d.push(id);
    streamed += d.flush();
    if (streamed != tok.decode(with_bos) && ++bad <= 10)
      ADD_FAILURE() << "streamed decode differs on " << what << ": " << json(streamed).dump();
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(SentencePiece, MatchesThePythonPackageOnLambada) {
  const char* env = std::getenv("SSMSERVE_SHARED_DIR");
  const std::filesystem::path shared = env != nullptr && *env != '\0' ? std::filesystem::path(env) : kRoot / ".." / "shared";
  const std::filesystem::path passages_path = shared / "data" / "lambada_test.jsonl";
  if (!std::filesystem::exists(passages_path)) GTEST_SKIP() << "LAMBADA passages not found: " << passages_path;
  const std::filesystem::path dir = kData / GetParam();
  const Tokenizer tok = Tokenizer::from_sentencepiece(dir / "tokenizer.model");
  const std::vector<std::string> expected = lines(dir / "lambada.txt");
  const std::vector<std::string> passages = lines(passages_path);
  ASSERT_EQ(passages.size(), expected.size());
  std::vector<std::string> texts;
  std::size_t bytes = 0;
  for (const std::string& line : passages) bytes += texts.emplace_back(json::parse(line).at("text")).size();
  std::vector<std::vector<int>> got(texts.size());
  double secs = 1e30;  // best of 3 passes
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < texts.size(); ++i) got[i] = tok.encode(texts[i], false);
    secs = std::min(secs, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("[tokenizer] %s LAMBADA: %zu bytes, encode %.1f MB/s\n", GetParam().c_str(), bytes,
              static_cast<double>(bytes) / secs / 1e6);
  int bad = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const std::vector<int>& ids = got[i];
    std::string key;
    for (std::size_t k = 0; k < ids.size(); ++k) key += (k > 0 ? "," : "") + std::to_string(ids[k]);
    std::istringstream in(expected[i]);
    std::string ids_fnv, dec_fnv;
    std::size_t count = 0;
    in >> ids_fnv >> count >> dec_fnv;
    if ((fnv(key) != ids_fnv || ids.size() != count) && ++bad <= 5) ADD_FAILURE() << "encode differs on passage " << i;
    if (fnv(tok.decode(ids)) != dec_fnv && ++bad <= 5) ADD_FAILURE() << "decode differs on passage " << i;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, SentencePiece, ::testing::Values("spm_bpe", "spm_unigram"),
                         [](const auto& info) { return info.param; });

TEST(SentencePieceFolder, FromPretrainedPrefersTokenizerJsonThenModel) {
  TempDir dir("spm-folder");
  write_file(dir / "tokenizer.model", read_bytes(kData / "spm_bpe/tokenizer.model"));
  const Tokenizer spm = Tokenizer::from_pretrained(dir.path());
  EXPECT_EQ(spm.vocab_size(), 1000);
  EXPECT_EQ(spm.decode(spm.encode("Hello there")), "Hello there");
  EXPECT_TRUE(spm.is_special(*spm.token_to_id("</s>")));
  EXPECT_FALSE(spm.token_to_id("no such piece").has_value());
  write_file(dir / "tokenizer.json", read_bytes(kData / "llama_legacy/tokenizer.json"));
  EXPECT_EQ(Tokenizer::from_pretrained(dir.path()).vocab_size(), 1004);
  TempDir empty("spm-empty");
  EXPECT_THAT(error_of([&] { Tokenizer::from_pretrained(empty.path()); }), HasSubstr("no tokenizer.json, tekken.json or SentencePiece"));
}

TEST(CorruptSentencePiece, HostileModelsAreErrorsNeverCrashes) {
  TempDir dir("spm-hostile");
  const std::string good = read_bytes(kData / "spm_unigram/tokenizer.model");
  auto load_error = [&](const std::string& bytes) {
    write_file(dir / "tokenizer.model", bytes);
    return error_of([&] { Tokenizer::from_sentencepiece(dir / "tokenizer.model"); });
  };
  EXPECT_THAT(load_error(""), HasSubstr("tokenizer.model"));
  EXPECT_THAT(load_error(good.substr(0, good.size() / 2)), HasSubstr("not a valid SentencePiece model"));
  EXPECT_THAT(load_error("{\"model\": {}}"), HasSubstr("not a valid SentencePiece model"));
  // Lying lengths: the first field's length varint claims far more bytes than there are.
  std::string lying = good;
  lying[1] = static_cast<char>(0xFF);
  lying[2] = static_cast<char>(0xFF);
  lying[3] = static_cast<char>(0x7F);
  EXPECT_THAT(load_error(lying), HasSubstr("tokenizer.model"));
  // Random corruption anywhere: an error or a working model, never a crash.
  std::mt19937 rng(32);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes = good;
    for (int k = 0; k < 4; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    write_file(dir / "tokenizer.model", bytes);
    try {
      const Tokenizer t = Tokenizer::from_sentencepiece(dir / "tokenizer.model");
      const std::vector<int> ids = t.encode("a test of corrupted models \xF0\x9F\x98\x80");
      (void)t.decode(ids);
    } catch (const Error&) {
    }
  }
}

}  // namespace
}  // namespace ssmserve
