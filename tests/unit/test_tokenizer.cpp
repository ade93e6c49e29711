// Owns the tokenizer's exactness tests against Hugging Face `tokenizers` (reference vectors, seeded generated strings) and its API contract.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

const std::filesystem::path kRoot = SSMSERVE_SOURCE_DIR;
const std::filesystem::path kTokenizerJson = kRoot / "models/tiny-mamba/tokenizer.json";
const std::filesystem::path kData = kRoot / "tests/data/tokenizer";

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::from_file(kTokenizerJson);
  return t;
}

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << "missing " << p;
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

/// Streams `ids` through an IncrementalDetokenizer, checking every chunk is valid UTF-8; returns the concatenation.
std::string stream(const std::vector<int>& ids, bool skip) {
  IncrementalDetokenizer d(tok(), skip);
  std::string all;
  for (int id : ids) {
    const std::string chunk = d.push(id);
    EXPECT_TRUE(utf8::is_valid(chunk)) << "push emitted invalid UTF-8";
    all += chunk;
  }
  const std::string rest = d.flush();
  EXPECT_TRUE(utf8::is_valid(rest));
  all += rest;
  EXPECT_EQ(all, d.text());
  return all;
}

TEST(Tokenizer, LoadsBundledVocabulary) {
  const Tokenizer& t = tok();
  EXPECT_EQ(t.vocab_size(), 50277);
  EXPECT_TRUE(t.is_special(0));
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(2));
  EXPECT_FALSE(t.is_special(50276));
  EXPECT_FALSE(t.is_special(50279));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(t.token_to_id("<|padding|>"), 1);
  EXPECT_EQ(t.token_to_id("\xC4\xA0the"), 253);  // "Ġthe"
  EXPECT_EQ(t.token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(t.id_to_token(0), "<|endoftext|>");
  EXPECT_EQ(t.id_to_token(253), "\xC4\xA0the");
  EXPECT_EQ(t.token_bytes(253), " the");
  EXPECT_EQ(t.token_bytes(50276), "  ");
  EXPECT_EQ(t.token_bytes(50254), std::string(24, ' '));
  EXPECT_EQ(t.token_bytes(0), "<|endoftext|>");
  EXPECT_THROW(t.token_bytes(50277), Error);
  EXPECT_THROW(t.token_bytes(-1), Error);
  EXPECT_THROW(t.id_to_token(50280), Error);
  for (int id = 0; id < t.vocab_size(); ++id) ASSERT_FALSE(t.token_bytes(id).empty()) << id;
}

TEST(Tokenizer, FromFileRejectsBadFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("ssm_tok_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto expect_error_naming = [](const std::filesystem::path& p) {
    try {
      Tokenizer::from_file(p);
      ADD_FAILURE() << "no error for " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  };
  expect_error_naming(dir / "missing.json");
  std::ofstream(dir / "bad.json") << "{ not json";
  expect_error_naming(dir / "bad.json");
  std::ofstream(dir / "wordpiece.json")
      << R"({"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false},"decoder":{"type":"ByteLevel"},)"
      << R"("model":{"type":"WordPiece","vocab":{}}})";
  expect_error_naming(dir / "wordpiece.json");
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, ReferenceVectors) {
  const auto recs = read_jsonl(kData / "vectors.jsonl");
  ASSERT_EQ(recs.size(), 44u);
  for (const auto& r : recs) {
    const std::string text = r["text"];
    const std::vector<int> ids = r["ids"];
    EXPECT_EQ(tok().encode(text), ids) << "text: " << text;
    EXPECT_EQ(tok().decode(ids), r["decoded"].get<std::string>()) << "text: " << text;
  }
}

TEST(Tokenizer, GeneratedStringsMatchHuggingFace) {
  const auto recs = read_jsonl(kData / "generated.jsonl");
  std::size_t n_text = 0, n_ids = 0, bad_encode = 0, bad_decode = 0;
  for (const auto& r : recs) {
    std::vector<int> ids;
    if (r.contains("hex")) {
      const std::string text = unhex(r["hex"]);
      ids = r["ids"].get<std::vector<int>>();
      const std::vector<int> got = tok().encode(text);
      if (got != ids && ++bad_encode <= 10) ADD_FAILURE() << "encode mismatch for hex " << r["hex"];
      ++n_text;
    } else {
      ids = r["ids_only"].get<std::vector<int>>();
      ++n_ids;
    }
    const std::string want = unhex(r["decoded_hex"]), want_skip = unhex(r["decoded_skip_hex"]);
    if ((tok().decode(ids) != want || tok().decode(ids, true) != want_skip) && ++bad_decode <= 10) {
      ADD_FAILURE() << "decode mismatch for record " << r.dump().substr(0, 200);
    }
    // Streaming gives exactly the full decode, valid UTF-8 chunk by chunk (also for partial-byte tokens).
    EXPECT_EQ(stream(ids, false), want);
    EXPECT_EQ(stream(ids, true), want_skip);
  }
  EXPECT_EQ(bad_encode, 0u);
  EXPECT_EQ(bad_decode, 0u);
  EXPECT_GE(n_text, 3000u);
  EXPECT_GE(n_ids, 400u);
  std::printf("[tokenizer] generated: %zu texts encoded+decoded, %zu id sequences decoded, all streamed\n", n_text,
              n_ids);
}

TEST(Tokenizer, DecodeIgnoresIdsOutsideVocabulary) {
  const std::vector<int> ids = {50277, 50278, 50279, -1, 1 << 30};
  EXPECT_EQ(tok().decode(ids), "");
  const std::vector<int> mixed = {12092, 50279, 1533};  // "Hello", padding id, " world"
  EXPECT_EQ(tok().decode(mixed), "Hello world");
  IncrementalDetokenizer d(tok());
  EXPECT_EQ(d.push(50279), "");
  EXPECT_EQ(d.push(-5), "");
  EXPECT_EQ(d.flush(), "");
}

TEST(Tokenizer, IncrementalNeverSplitsCharacters) {
  // " this is 🦙.cpp": the llama emoji spans three tokens (22692, 101, 236) of partial bytes.
  const std::vector<int> ids = {436, 310, 22692, 101, 236, 15, 14161};
  IncrementalDetokenizer d(tok());
  EXPECT_EQ(d.push(436), " this");
  EXPECT_EQ(d.push(310), " is");
  EXPECT_EQ(d.push(22692), " ");  // the space completes; the emoji's first bytes wait
  EXPECT_EQ(d.push(101), "");
  EXPECT_EQ(d.push(236), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(d.push(15), ".");
  EXPECT_EQ(d.push(14161), "cpp");
  EXPECT_EQ(d.flush(), "");
  EXPECT_EQ(d.text(), tok().decode(ids));
  // A truncated character is flushed as U+FFFD, like decode.
  IncrementalDetokenizer e(tok());
  EXPECT_EQ(e.push(22692), " ");
  EXPECT_EQ(e.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(e.text(), tok().decode(std::vector<int>{22692}));
}

TEST(Tokenizer, SpecialTokensAndSkipping) {
  const std::vector<int> ids = tok().encode("a<|endoftext|>b<|padding|>");
  EXPECT_EQ(ids, (std::vector<int>{66, 0, 67, 1}));
  EXPECT_EQ(tok().decode(ids), "a<|endoftext|>b<|padding|>");
  EXPECT_EQ(tok().decode(ids, true), "ab");
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
  const std::string text = "The quick brown fox jumps over the lazy dog; naïve café, 日本語 ";
  std::string big;
  for (int i = 0; i < 200; ++i) big += text + std::to_string(i) + " ";
  const std::vector<int> want = tok().encode(big);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { ok[t] = Tokenizer(tok()).encode(big) == want; });
  }
  for (auto& th : threads) th.join();
  for (int v : ok) EXPECT_TRUE(v);
}

}  // namespace
}  // namespace ssmserve
