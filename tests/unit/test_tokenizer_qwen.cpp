// Owns the tests of pattern-driven pre-tokenizers: Split/Sequence tokenizer.json pipelines, the Qwen2/Qwen3.5 pipelines
// transformers' tokenizer classes rebuild (ids against transformers / `tokenizers`), the class choice mirroring
// AutoTokenizer, and the Oniguruma-to-PCRE2 class translation on every code point.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"
#include "core/error.h"
#include "test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/transformers_class.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::write_file;

const std::filesystem::path kRoot = SSMSERVE_SOURCE_DIR;
const std::filesystem::path kData = kRoot / "tests/data/tokenizer";

/// tests/data/tokenizer/qwen_ids.json (tools/make_tokenizer_qwen_expected.py).
const json& reference() {
  static const json j = testing::read_json(kData / "qwen_ids.json");
  return j;
}

/// tiny-mamba's GPT-NeoX tokenizer.json (the same vocabulary tiny-qwen3_5_moe ships).
json neox_tokenizer_json() { return testing::read_json(testing::model_dir("tiny-mamba") / "tokenizer.json"); }

/// `base` with its pre_tokenizer replaced by `pre`.
json with_pre_tokenizer(json base, json pre) {
  base["pre_tokenizer"] = std::move(pre);
  return base;
}

json split_then_byte_level(const std::string& pattern) {
  return json{{"type", "Sequence"},
              {"pretokenizers",
               json::array({json{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                            json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
}

/// Loads `tokenizer_json` written alone into a fresh folder (no config.json: tokenizer.json's own pipeline).
Tokenizer load_alone(const TempDir& dir, const json& tokenizer_json) {
  write_file(dir / "tokenizer.json", tokenizer_json.dump());
  return Tokenizer::from_file(dir / "tokenizer.json");
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

/// Compares encode and decode of every reference text with the stored ids of `key`.
void expect_matches_reference(const Tokenizer& tok, const std::string& key) {
  int bad = 0, n = 0;
  for (const json& c : reference()["cases"]) {
    const std::string text = c["text"];
    const auto want = c[key]["ids"].get<std::vector<int>>();
    const auto got = tok.encode(text);
    ++n;
    if (got != want && ++bad <= 10) ADD_FAILURE() << key << ": ids differ for " << json(text).dump();
    EXPECT_EQ(tok.decode(want), c[key]["decode"].get<std::string>()) << key << ": decode of " << json(text).dump();
  }
  EXPECT_EQ(bad, 0) << key;
  EXPECT_GT(n, 300);
}

TEST(TokenizerQwen, TinyQwen35MoeMatchesAutoTokenizer) {
  const auto dir = testing::model_dir("tiny-qwen3_5_moe");
  SSM_SKIP_IF_NO_MODEL(dir);
  EXPECT_EQ(transformers_class::of_folder(dir), "Qwen3_5Tokenizer");
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  EXPECT_EQ(tok.encode("a.\n\n\u201cOh"), (std::vector<int>{66, 15, 535, 1628, 4013}));
  expect_matches_reference(tok, "auto_qwen3_5_moe");
  // The same file read as the file's own pipeline stays GPT-2 (what the --tokenizer of another model gives).
  EXPECT_EQ(Tokenizer::from_file(dir / "tokenizer.json", "").encode("a.\n\n\u201cOh"),
            (std::vector<int>{66, 15, 187, 187, 1628, 4013}));
}

TEST(TokenizerQwen, ExplicitClassRebuildsThePipeline) {
  const Tokenizer tok = Tokenizer::from_file(testing::model_dir("tiny-mamba") / "tokenizer.json", "Qwen3_5Tokenizer");
  expect_matches_reference(tok, "auto_qwen3_5_moe");
}

TEST(TokenizerQwen, SequenceSplitByteLevelMatchesTokenizers) {
  for (const std::string key : {"seq_qwen2", "seq_qwen3_5"}) {
    TempDir dir("tok-seq");
    const Tokenizer tok = load_alone(dir, with_pre_tokenizer(neox_tokenizer_json(), split_then_byte_level(reference()["patterns"][key])));
    expect_matches_reference(tok, key);
  }
}

TEST(TokenizerQwen, DecodeRoundTripsNfcText) {
  const Tokenizer tok = Tokenizer::from_file(testing::model_dir("tiny-mamba") / "tokenizer.json", "Qwen3_5Tokenizer");
  for (const json& c : reference()["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok.decode(tok.encode(text)), nfc_normalize(text)) << json(text).dump();
  }
}

TEST(TokenizerQwen, ByteLevelWithoutRegexDoesNotSplit) {
  TempDir dir("tok-bl");
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const Tokenizer tok = load_alone(dir, with_pre_tokenizer(neox_tokenizer_json(), pre));
  // tokenizers 0.23 on the same file: the byte mapping only, so "\n\n" is one pre-token (GPT-2 regex: 187, 187).
  EXPECT_EQ(tok.encode("a.\n\n\u201cOh"), (std::vector<int>{66, 15, 535, 1628, 4013}));
  EXPECT_EQ(tok.encode("  x\n\ny"), (std::vector<int>{50276, 89, 535, 90}));
  const std::string text = "Hello world, hello again.";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  // A one-element Sequence[ByteLevel] is plain ByteLevel.
  json seq = {{"type", "Sequence"}, {"pretokenizers", json::array({json{{"type", "ByteLevel"}, {"add_prefix_space", false}}})}};
  const Tokenizer plain = load_alone(dir, with_pre_tokenizer(neox_tokenizer_json(), seq));
  EXPECT_EQ(plain.encode(text), Tokenizer::from_file(testing::model_dir("tiny-mamba") / "tokenizer.json").encode(text));
}

TEST(TokenizerQwen, SplitterMatchesTokenizersOnEmptyMatchesAndLiterals) {
  // Answers of tokenizers.pre_tokenizers.Split(pattern, behavior="isolated").pre_tokenize_str (tokenizers 0.23).
  auto pieces = [](const RegexSplitter& s, std::string_view text) {
    std::vector<std::string_view> out;
    s.split(text, out);
    return std::vector<std::string>(out.begin(), out.end());
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(RegexSplitter("x*"), "abxxc"), (V{"a", "b", "xx", "c"}));
  EXPECT_EQ(pieces(RegexSplitter(R"(\s*)"), "a b"), (V{"a", " ", "b"}));
  EXPECT_EQ(pieces(RegexSplitter("(?=b)"), "abab"), (V{"a", "ba", "b"}));
  EXPECT_EQ(pieces(RegexSplitter::literal("\n\n"), "a\n\n\nb"), (V{"a", "\n\n", "\nb"}));
  EXPECT_EQ(pieces(RegexSplitter::literal("."), "a.b..c"), (V{"a", ".", "b", ".", ".", "c"}));
  EXPECT_TRUE(pieces(RegexSplitter("x"), "").empty());
}

TEST(TokenizerQwen, StringPatternLoads) {
  TempDir dir("tok-str");
  json pre = split_then_byte_level("");
  pre["pretokenizers"][0]["pattern"] = {{"String", " "}};
  const Tokenizer tok = load_alone(dir, with_pre_tokenizer(neox_tokenizer_json(), pre));
  EXPECT_EQ(tok.decode(tok.encode("a b  c")), "a b  c");
}

TEST(TokenizerQwen, UnsupportedComponentsAreNamed) {
  TempDir dir("tok-bad");
  const json base = neox_tokenizer_json();
  auto err = [&](const json& pre) { return error_of([&] { load_alone(dir, with_pre_tokenizer(base, pre)); }); };
  json seq = split_then_byte_level("a");
  json bad_behavior = seq;
  bad_behavior["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_THAT(err(bad_behavior), HasSubstr("unsupported pre_tokenizer Split behavior 'Sideways'"));
  EXPECT_THAT(err(json{{"type", "BertPreTokenizer"}}), HasSubstr("unsupported pre_tokenizer 'BertPreTokenizer'"));
  json unknown_in_seq = seq;
  unknown_in_seq["pretokenizers"][0] = {{"type", "UnicodeScripts"}};
  EXPECT_THAT(err(unknown_in_seq), HasSubstr("unsupported pre_tokenizer 'UnicodeScripts'"));
  json bad_pattern = seq;
  bad_pattern["pretokenizers"][0]["pattern"] = {{"Glob", "*"}};
  EXPECT_THAT(err(bad_pattern), HasSubstr("Split pattern must be"));
  EXPECT_THAT(err(split_then_byte_level("[a")), HasSubstr("unterminated character class"));
  EXPECT_THAT(err(split_then_byte_level(R"([^\S])")), HasSubstr("\\S inside a character class"));
  EXPECT_THAT(err(split_then_byte_level(R"(\h+)")), HasSubstr("Oniguruma hex-digit class"));
  EXPECT_THAT(err(split_then_byte_level("(a")), HasSubstr("PCRE2 cannot compile"));
}

TEST(TokenizerQwen, ClassChoiceMirrorsAutoTokenizer) {
  // (config.json model_type, hub tokenizer_class) -> class AutoTokenizer.from_pretrained instantiated (transformers
  // 5.24, probed with copies of tiny-qwen3_5_moe); "" for TokenizersBackend / PreTrainedTokenizerFast.
  struct Case {
    const char *model_type, *hub, *want;
  };
  for (const Case& c : std::vector<Case>{{"qwen3_5_moe", "", "Qwen3_5Tokenizer"},
                                         {"qwen3_5_moe", "PreTrainedTokenizerFast", "Qwen3_5Tokenizer"},
                                         {"qwen3_5_moe", "Qwen2TokenizerFast", "Qwen3_5Tokenizer"},
                                         {"qwen3_5_moe", "TokenizersBackend", "Qwen3_5Tokenizer"},
                                         {"qwen3_next", "PreTrainedTokenizerFast", ""},
                                         {"qwen3_next", "", "Qwen2Tokenizer"},
                                         {"qwen3_next", "Qwen2TokenizerFast", "Qwen2Tokenizer"},
                                         {"qwen3_next", "Qwen3_5Tokenizer", "Qwen3_5Tokenizer"},
                                         {"qwen3_5_text", "PreTrainedTokenizerFast", ""},
                                         {"qwen2", "GPT2Tokenizer", "Qwen2Tokenizer"},
                                         {"mamba", "Qwen2Tokenizer", "Qwen2Tokenizer"},
                                         {"llama", "Qwen2Tokenizer", "Qwen2Tokenizer"},
                                         {"", "PreTrainedTokenizerFast", ""},
                                         {"", "Qwen2Tokenizer", "Qwen2Tokenizer"},
                                         {"mamba", "PreTrainedTokenizerFast", ""}}) {
    const std::string got = transformers_class::resolve(c.model_type, c.hub);
    EXPECT_EQ(transformers_class::rebuilt_pattern(got).has_value(), std::string(c.want) != "")
        << c.model_type << " / " << c.hub << " -> " << got;
    if (*c.want) {
      EXPECT_EQ(got, c.want) << c.model_type << " / " << c.hub;
    }
  }
}

TEST(TokenizerQwen, ClassChoiceReadsTheTokenizerFolder) {
  TempDir dir("tok-cls");
  EXPECT_EQ(transformers_class::of_folder(dir.path()), "");  // neither file
  // The wrapper's top-level model_type decides, not text_config.model_type.
  write_file(dir / "config.json", R"({"model_type": "qwen3_5_text", "text_config": {"model_type": "qwen3_5_moe_text"}})");
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "PreTrainedTokenizerFast"})");
  EXPECT_FALSE(transformers_class::rebuilt_pattern(transformers_class::of_folder(dir.path())));
  write_file(dir / "config.json", R"({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_text"}})");
  EXPECT_EQ(transformers_class::of_folder(dir.path()), "Qwen3_5Tokenizer");
  // config.json's tokenizer_class counts when tokenizer_config.json names none.
  write_file(dir / "tokenizer_config.json", "{}");
  write_file(dir / "config.json", R"({"model_type": "mamba", "tokenizer_class": "Qwen2TokenizerFast"})");
  EXPECT_EQ(transformers_class::of_folder(dir.path()), "Qwen2Tokenizer");
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "Qwen2Tokenizer", "add_prefix_space": true})");
  EXPECT_THAT(error_of([&] { transformers_class::of_folder(dir.path()); }), HasSubstr("add_prefix_space=true"));
  write_file(dir / "config.json", "{not json");
  write_file(dir / "tokenizer.json", neox_tokenizer_json().dump());
  EXPECT_THAT(error_of([&] { Tokenizer::from_file(dir / "tokenizer.json"); }), HasSubstr("config.json"));
}

/// Oniguruma class of every code point (tests/data/tokenizer/onig_classes.txt) against the translated patterns:
/// `\p{L}`, `\p{M}`, `\p{N}` and `\s` each split "#c#" into three pieces exactly when c is in the class.
TEST(TokenizerQwen, TranslatedClassesMatchOnigurumaOnEveryCodePoint) {
  std::ifstream in(kData / "onig_classes.txt");
  ASSERT_TRUE(in.good());
  const std::vector<std::pair<char, RegexSplitter>> classes = [] {
    std::vector<std::pair<char, RegexSplitter>> v;
    v.emplace_back('L', RegexSplitter(R"(\p{L})"));
    v.emplace_back('M', RegexSplitter(R"(\p{M})"));
    v.emplace_back('N', RegexSplitter(R"(\p{N})"));
    v.emplace_back('W', RegexSplitter(R"(\s)"));
    return v;
  }();
  const RegexSplitter not_letter(R"(\P{L}+)"), not_space(R"(\S+)");
  std::size_t checked = 0, bad = 0;
  char32_t next = 0;
  std::vector<std::string_view> pieces;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string lo_s, hi_s;
    char cls = 0;
    ss >> lo_s >> hi_s >> cls;
    const auto lo = static_cast<char32_t>(std::stoul(lo_s, nullptr, 16)), hi = static_cast<char32_t>(std::stoul(hi_s, nullptr, 16));
    for (char32_t c = lo; c <= hi; ++c) {
      if (c >= 0xD800 && c < 0xE000) continue;
      std::string probe = "#";
      utf8::append_code_point(probe, c);
      probe += "#";
      char got = 'O';
      for (const auto& [name, splitter] : classes) {
        pieces.clear();
        splitter.split(probe, pieces);
        if (pieces.size() == 3) {
          got = name;
          break;
        }
      }
      // The negations: \P{L}+ matches all of "#c#" unless c is a letter, \S+ unless c is whitespace.
      pieces.clear();
      not_letter.split(probe, pieces);
      const bool letter_by_negation = pieces.size() == 3;
      pieces.clear();
      not_space.split(probe, pieces);
      const bool space_by_negation = pieces.size() == 3;
      ++checked;
      if ((got != cls || letter_by_negation != (cls == 'L') || space_by_negation != (cls == 'W')) && ++bad <= 10)
        ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(c) << ": Oniguruma " << cls << ", ours " << got;
    }
    next = hi + 1;
  }
  EXPECT_EQ(next, 0x110000u);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(checked, 0x110000u - 0x800u);
}

}  // namespace
}  // namespace ssmserve
