// Owns the tests of broken and hostile tokenizer.json files against the full pipeline loader: every unsupported
// component is an error naming it, and truncated files, merges naming unknown tokens, regexes that do not compile,
// huge added-token lists and degenerate decoder settings are clear errors or work, never a crash (the Corrupt* suites
// also run under ASan + UBSan in scripts/test.sh).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_file;

const std::filesystem::path kData = std::filesystem::path(SSMSERVE_SOURCE_DIR) / "tests/data/tokenizers";

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json family(const std::string& name) { return json::parse(read_text(kData / name / "tokenizer.json")); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string load_error(const TempDir& dir, const std::string& text) {
  write_file(dir / "tokenizer.json", text);
  return error_of([&] { Tokenizer::from_file(dir / "tokenizer.json"); });
}

std::string load_error(const TempDir& dir, const json& j) { return load_error(dir, j.dump()); }

TEST(CorruptTokenizerJson, UnsupportedComponentsAreNamed) {
  TempDir dir("tok-names");
  const json base = family("llama_legacy");
  auto with = [&](const char* key, json value) {
    json j = base;
    j[key] = std::move(value);
    return load_error(dir, j);
  };
  EXPECT_THAT(with("normalizer", json{{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}),
              HasSubstr("unsupported normalizer 'Precompiled'"));
  EXPECT_THAT(with("normalizer", json{{"type", "Sequence"}, {"normalizers", json::array({json{{"type", "NFC"}},
                                                                                         json{{"type", "BertNormalizer"}}})}}),
              HasSubstr("unsupported normalizer 'BertNormalizer'"));
  EXPECT_THAT(with("pre_tokenizer", json{{"type", "UnicodeScripts"}}), HasSubstr("unsupported pre_tokenizer 'UnicodeScripts'"));
  EXPECT_THAT(with("decoder", json{{"type", "WordPiece"}, {"prefix", "##"}}), HasSubstr("unsupported decoder 'WordPiece'"));
  EXPECT_THAT(with("decoder", json{{"type", "Sequence"}, {"decoders", json::array({json{{"type", "CTC"}}})}}),
              HasSubstr("unsupported decoder 'CTC'"));
  EXPECT_THAT(with("post_processor", json{{"type", "Mystery"}}), HasSubstr("unsupported post_processor 'Mystery'"));
  json unigram = base;
  unigram["model"] = json{{"type", "Unigram"}, {"vocab", json::array()}};
  EXPECT_THAT(load_error(dir, unigram), HasSubstr("unsupported model type 'Unigram'"));
  json dropout = base;
  dropout["model"]["dropout"] = 0.1;
  EXPECT_THAT(load_error(dir, dropout), HasSubstr("unsupported BPE dropout 0.1"));
  json unk = base;
  unk["model"]["unk_token"] = "<nope>";
  EXPECT_THAT(load_error(dir, unk), HasSubstr("unk_token '<nope>' is not in the vocabulary"));
  json template_missing = base;
  template_missing["post_processor"]["single"][0]["SpecialToken"]["id"] = "<bos>";
  EXPECT_THAT(load_error(dir, template_missing), HasSubstr("special token '<bos>' missing from special_tokens"));
  json template_bad_id = base;
  template_bad_id["post_processor"]["special_tokens"]["<s>"]["ids"] = json::array({999999});
  EXPECT_THAT(load_error(dir, template_bad_id), HasSubstr("post_processor adds token id 999999, which names no token"));
  json metaspace = family("metaspace_first");
  metaspace["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  EXPECT_THAT(load_error(dir, metaspace), HasSubstr("Metaspace prepend_scheme 'sometimes'"));
  metaspace = family("metaspace_first");
  metaspace["pre_tokenizer"]["replacement"] = "ab";
  EXPECT_THAT(load_error(dir, metaspace), HasSubstr("Metaspace replacement must be one character"));
  json behavior = family("normalizer_mix");
  behavior["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_THAT(load_error(dir, behavior), HasSubstr("Split behavior 'Sideways'"));
  // Every message names the file.
  EXPECT_THAT(with("decoder", json{{"type", "WordPiece"}}), HasSubstr("tokenizer.json"));
}

TEST(CorruptTokenizerJson, TruncatedFilesAreErrors) {
  TempDir dir("tok-trunc");
  for (const char* name : {"llama_legacy", "metaspace_first", "bytelevel_llama3", "falcon_digits", "normalizer_mix"}) {
    const std::string text = read_text(kData / name / "tokenizer.json");
    for (std::size_t cut : {std::size_t{0}, std::size_t{1}, text.size() / 7, text.size() / 3, text.size() / 2,
                            text.size() - 2, text.size() - 1}) {
      EXPECT_THAT(load_error(dir, text.substr(0, cut)), HasSubstr("tokenizer.json")) << name << " cut at " << cut;
    }
  }
}

TEST(CorruptTokenizerJson, BadMergesAndRegexesAreNamed) {
  TempDir dir("tok-bad");
  json j = family("llama_legacy");
  j["model"]["merges"].push_back(json::array({"\xE2\x96\x81zz", "qq"}));
  EXPECT_THAT(load_error(dir, j), HasSubstr("uses a token missing from the vocabulary"));
  j = family("normalizer_mix");
  j["model"]["merges"].push_back(json::array({"t", "h"}));  // right part without the ## prefix
  EXPECT_THAT(load_error(dir, j), HasSubstr("lacks the continuing_subword_prefix"));
  j = family("llama_legacy");
  j["model"]["merges"].push_back(json::array({"<s>", "</s>"}));  // both exist, their join does not
  EXPECT_THAT(load_error(dir, j), HasSubstr("makes a token missing from the vocabulary"));
  j = family("bytelevel_llama3");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_THAT(load_error(dir, j), HasSubstr("PCRE2 cannot compile"));
  j = family("normalizer_mix");
  j["normalizer"]["normalizers"][3]["pattern"]["Regex"] = "[z-a]";
  EXPECT_THAT(load_error(dir, j), HasSubstr("PCRE2 cannot compile"));
  j = family("llama_legacy");
  j["decoder"]["decoders"][0]["pattern"] = {{"Glob", "*"}};
  EXPECT_THAT(load_error(dir, j), HasSubstr("decoder Replace pattern must be"));
  j = family("llama_legacy");
  j["added_tokens"][0]["lstrip"] = "yes";
  EXPECT_THAT(load_error(dir, j), HasSubstr("added token 'lstrip' must be true or false"));
  j = family("llama_legacy");
  j["normalizer"] = json{{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int i = 0; i < 40; ++i) j["normalizer"] = json{{"type", "Sequence"}, {"normalizers", json::array({j["normalizer"]})}};
  EXPECT_THAT(load_error(dir, j), HasSubstr("nested too deeply"));
}

TEST(CorruptTokenizerJson, DegenerateSettingsDoNotCrash) {
  TempDir dir("tok-degenerate");
  // HF panics on Strip(stop > 0) of an empty token; here it is just nothing to strip.
  json j = family("llama_legacy");
  j["decoder"]["decoders"][3]["stop"] = 5;
  j["decoder"]["decoders"][3]["start"] = 1000000;
  write_file(dir / "tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  const std::vector<int> ids = tok.encode("  hello  ");
  EXPECT_NO_THROW(tok.decode(ids));
  EXPECT_NO_THROW(tok.decode(std::vector<int>{}));
  // An empty-matching Split regex and a Replace with an empty match.
  j = family("normalizer_mix");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "x*";
  j["normalizer"]["normalizers"][3]["pattern"]["Regex"] = "\\b";
  write_file(dir / "tokenizer.json", j.dump());
  const Tokenizer t2 = Tokenizer::from_file(dir / "tokenizer.json");
  EXPECT_FALSE(t2.encode("some text, with xx words").empty());
}

/// A pre-tokenizer regex that backtracks catastrophically on a long text: PCRE2 stops at its match limit and encode
/// reports an error naming the tokenizer's regex and PCRE2's reason, not a bare error code.
TEST(CorruptTokenizerJson, BacktrackingRegexIsANamedEncodeError) {
  TempDir dir("tok-backtrack");
  json j = family("normalizer_mix");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a+)+$";
  write_file(dir / "tokenizer.json", j.dump());
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  const std::string err = error_of([&] { tok.encode(std::string(30000, 'a') + "b"); });
  EXPECT_THAT(err, HasSubstr("the tokenizer's regex"));
  EXPECT_THAT(err, HasSubstr("limit"));
}

/// A bytelevel_llama3 file with `n` compact special added tokens <t0>..<tN-1> spliced in (ids from 2000).
std::string with_added_tokens(int n) {
  std::string text = family("bytelevel_llama3").dump();
  // Splicing text: building 10^6 json objects would dominate the test.
  const std::string key = "\"added_tokens\":[";
  const std::size_t at = text.find(key);
  std::string extra;
  extra.reserve(static_cast<std::size_t>(n) * 64);
  for (int i = 0; i < n; ++i) {
    extra += "{\"id\":" + std::to_string(2000 + i) + ",\"content\":\"<t" + std::to_string(i) +
             ">\",\"special\":true,\"normalized\":false},";
  }
  text.insert(at + key.size(), extra);
  return text;
}

TEST(CorruptTokenizerJson, ManyAddedTokensLoad) {
  TempDir dir("tok-many");
  write_file(dir / "tokenizer.json", with_added_tokens(100000));
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  EXPECT_EQ(tok.encode("a<t99999>", false)[1], 2000 + 99999);
}

// Not a Corrupt* suite: 10^6 entries take ~1 GB and a few seconds, too much under ASan.
TEST(TokenizerScale, MillionAddedTokensLoadAndMatchFast) {
  TempDir dir("tok-million");
  write_file(dir / "tokenizer.json", with_added_tokens(1000000));
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 2000 + 1000000);
  const std::vector<int> ids = tok.encode("a<t999999>b<t0><t12x");
  EXPECT_EQ(ids[2], 2000 + 999999);
  EXPECT_EQ(tok.decode(ids), "<|begin_of_text|>a<t999999>b<t0><t12x");
  std::string long_text;
  for (int i = 0; i < 20000; ++i) long_text += "<t1";  // every position starts a long trie walk that fails
  EXPECT_FALSE(tok.encode(long_text).empty());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 120.0);
}

}  // namespace
}  // namespace ssmserve
