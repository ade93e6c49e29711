// Owns the unit tests of hostile-file handling below the CLI: read_text_file (missing, non-regular, symlink loop,
// size cap), the JSON depth pre-scan, bounded excerpts in messages, safetensors headers that nest deeply, and
// tokenizer.json files with huge or malformed token ids. Suite names contain "Corrupt" so scripts/test.sh also
// runs them under AddressSanitizer + UBSan.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <limits>

#include "checkpoint_fixtures.h"
#include "config/hf_json.h"
#include "core/error.h"
#include "model/safetensors_header.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {
namespace {

namespace fs = std::filesystem;
using ::ssmserve::testing::TempDir;
using ::ssmserve::testing::write_file;
using ::testing::HasSubstr;
using json = nlohmann::json;

/// Message of the Error thrown by `f` (empty + test failure when none; any other exception fails the test).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an ssmserve::Error";
  return {};
}

std::string read_error(const fs::path& p, size_t cap = kMaxConfigFileBytes) {
  return error_of([&] { read_text_file(p, cap); });
}

TEST(CorruptFiles, ReadTextFileReadsRegularFilesAndSymlinksToThem) {
  TempDir dir("hostile");
  write_file(dir / "a.json", "{\"x\": 1}");
  EXPECT_EQ(read_text_file(dir / "a.json"), "{\"x\": 1}");
  fs::create_symlink(dir / "a.json", dir / "link.json");
  EXPECT_EQ(read_text_file(dir / "link.json"), "{\"x\": 1}");
  write_file(dir / "empty.json", "");
  EXPECT_EQ(read_text_file(dir / "empty.json"), "");
  EXPECT_TRUE(path_entry_exists(dir / "a.json"));
  EXPECT_FALSE(path_entry_exists(dir / "absent.json"));
}

TEST(CorruptFiles, ReadTextFileNamesWhatIsWrong) {
  TempDir dir("hostile");
  const fs::path missing = dir / "missing.json";
  EXPECT_THAT(read_error(missing), HasSubstr(missing.string() + ": file not found"));

  fs::create_directory(dir / "d.json");
  EXPECT_THAT(read_error(dir / "d.json"), HasSubstr("d.json: is a directory, not a regular file"));

  fs::create_symlink("/dev/zero", dir / "zero.json");
  EXPECT_THAT(read_error(dir / "zero.json"), HasSubstr("zero.json: is a character device, not a regular file"));

  ASSERT_EQ(::mkfifo((dir / "fifo.json").c_str(), 0644), 0);
  EXPECT_THAT(read_error(dir / "fifo.json"), HasSubstr("fifo.json: is a fifo"));

  fs::create_symlink(dir / "loop_b.json", dir / "loop_a.json");
  fs::create_symlink(dir / "loop_a.json", dir / "loop_b.json");
  EXPECT_THAT(read_error(dir / "loop_a.json"), HasSubstr("loop_a.json: symlink loop"));
  EXPECT_TRUE(path_entry_exists(dir / "loop_a.json"));

  fs::create_symlink(dir / "nowhere.json", dir / "dangling.json");
  EXPECT_THAT(read_error(dir / "dangling.json"), HasSubstr("dangling.json: dangling symlink"));
  EXPECT_TRUE(path_entry_exists(dir / "dangling.json"));

  // A path through a regular file ("a.json/x") is "not found", not a raw filesystem_error.
  write_file(dir / "a.json", "{}");
  EXPECT_THAT(read_error(dir / "a.json" / "x"), HasSubstr("file not found"));
}

TEST(CorruptFiles, ReadTextFileEnforcesSizeCap) {
  TempDir dir("hostile");
  write_file(dir / "big.json", std::string(1000, ' '));
  EXPECT_EQ(read_text_file(dir / "big.json", 1000).size(), 1000u);
  EXPECT_THAT(read_error(dir / "big.json", 999), HasSubstr("1000 bytes, larger than the 999 byte limit"));
  write_file(dir / "sparse.json", "");
  fs::resize_file(dir / "sparse.json", kMaxConfigFileBytes + 1);  // sparse: no disk used, no read attempted
  EXPECT_THAT(read_error(dir / "sparse.json"), HasSubstr("byte limit"));
}

TEST(CorruptFiles, DepthScanLimitsNestingAndSkipsStrings) {
  EXPECT_NO_THROW(check_json_depth(std::string(256, '[') + std::string(256, ']'), "t"));
  const std::string msg = error_of([] { check_json_depth(std::string(257, '[') + std::string(257, ']'), "t.json"); });
  EXPECT_THAT(msg, HasSubstr("t.json: JSON nests arrays/objects more than 256 levels deep (at byte 256)"));
  EXPECT_THROW(check_json_depth(std::string(300, '{'), "t"), Error);  // unbalanced still counts
  // Brackets inside strings, including after escaped quotes, do not count.
  const std::string in_string = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  EXPECT_NO_THROW(check_json_depth(in_string, "t"));
  EXPECT_NO_THROW(check_json_depth(std::string(100000, ']'), "t"));  // left for the parser
  EXPECT_NO_THROW(check_json_depth("[1, [2, {\"a\": [3]}]] [[[", "t", 4));
  EXPECT_THROW(check_json_depth("[[[[[", "t", 4), Error);
}

/// json_max_object_keys: the most keys of one object (nested objects counted apart, arrays and colons inside strings not
/// counted), stopping at the first past the bound (the server's request bodies: test_server_structured_outputs.cpp).
TEST(CorruptFiles, ObjectKeyScanCountsEachObjectAndSkipsStrings) {
  EXPECT_EQ(json_max_object_keys("1"), 0u);
  EXPECT_EQ(json_max_object_keys(R"({"a": 1, "b": {"c": 2, "d": 3, "e": [{"f": 1}]}, "g:h": "x:y"})"), 3u);
  EXPECT_EQ(json_max_object_keys(R"([1, 2, {"a\":": 1}, "::::"])"), 1u);
  std::string many = "{";
  for (int i = 0; i < 50; ++i) many += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
  many += "}";
  EXPECT_EQ(json_max_object_keys(many), 50u);
  std::size_t at = 0;
  EXPECT_EQ(json_max_object_keys(many, 9, &at), 10u);
  EXPECT_EQ(many[at], ':');
}

TEST(CorruptFiles, ParseHfJsonRejectsDeepNesting) {
  const std::string msg = error_of([] { parse_hf_json(std::string(100000, '[') + std::string(100000, ']'), "c"); });
  EXPECT_THAT(msg, HasSubstr("c: JSON nests"));
  EXPECT_THROW(parse_hf_json("{\"a\": " + std::string(100000, '{'), "c"), Error);
  EXPECT_EQ(parse_hf_json(std::string(200, '[') + std::string(200, ']'), "c").dump().size(), 400u);
}

// A config.json saved as UTF-16 (or binary junk): the parse error quotes the bytes it read as \xNN, so the message is
// printable ASCII (Python could not decode a stray UTF-8 lead byte and raised UnicodeDecodeError instead).
TEST(CorruptFiles, ParseErrorsQuoteNonAsciiBytesEscaped) {
  const std::string utf16("\xFF\xFE{\0\n\0\"\0", 8);
  std::string msg = error_of([&] { parse_hf_json(utf16, "c"); });
  EXPECT_THAT(msg, HasSubstr("c: invalid JSON at byte 0"));
  EXPECT_THAT(msg, HasSubstr("\\xFF"));
  msg = error_of([] { parse_hf_json("{\"a\": \xC3}", "c"); });
  EXPECT_THAT(msg, HasSubstr("\\xC3"));
  for (const char ch : msg) EXPECT_TRUE(ch >= 0x20 && ch < 0x7f) << msg;
}

TEST(CorruptFiles, ExcerptsAreBoundedAndShowNonFinite) {
  json big = json::array();
  for (int i = 0; i < 1000000; ++i) big.push_back(i);
  std::string e = json_excerpt(big);
  EXPECT_LE(e.size(), 60u);
  EXPECT_EQ(e.substr(0, 8), "[0,1,2,3");
  EXPECT_EQ(e.substr(e.size() - 3), "...");
  EXPECT_LE(json_excerpt(json(std::string(10000000, 'x'))).size(), 60u);
  EXPECT_EQ(json_excerpt(json{{"a", 1}, {"b", "x"}}), R"({"a":1,"b":"x"})");
  EXPECT_EQ(json_excerpt(json(std::numeric_limits<double>::infinity())), "Infinity");
  EXPECT_EQ(json_excerpt(json(-std::numeric_limits<double>::infinity())), "-Infinity");
  EXPECT_EQ(json_excerpt(json(std::nan(""))), "NaN");
  EXPECT_EQ(json_excerpt(json(1.5)), "1.5");
  // A deeply nested value built in memory (not parsed) is still quoted without deep recursion.
  json deep = json::array();
  for (int i = 0; i < 5000; ++i) deep = json::array({std::move(deep)});
  EXPECT_LE(json_excerpt(deep).size(), 60u);
  // UTF-8 characters are not cut in half.
  const std::string snow = "\xE2\x98\x83";  // U+2603, 3 bytes
  std::string many;
  for (int i = 0; i < 40; ++i) many += snow;
  e = text_excerpt(many, 10);
  EXPECT_EQ(e, snow + snow + "...");
}

/// A safetensors file image: 8-byte little-endian length, then `header`.
std::string safetensors_bytes(const std::string& header) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  return out + header;
}

std::string header_error(const std::string& header) {
  const std::string bytes = safetensors_bytes(header);
  return error_of([&] {
    parse_safetensors_header(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), "m.safetensors");
  });
}

TEST(CorruptFiles, SafetensorsHeaderDeepNestingAndHugeValues) {
  EXPECT_THAT(header_error(std::string(100000, '[') + std::string(100000, ']')),
              HasSubstr("m.safetensors: safetensors header: JSON nests"));
  std::string objs;
  for (int i = 0; i < 1000; ++i) objs += "{\"a\":";
  objs += "1" + std::string(1000, '}');
  EXPECT_THAT(header_error(objs), HasSubstr("levels deep"));
  // Not an object: quoted short, not dumped whole.
  std::string arr = "[";
  for (int i = 0; i < 100000; ++i) arr += "1,";
  arr += "1]";
  const std::string msg = header_error(arr);
  EXPECT_THAT(msg, HasSubstr("must be a JSON object"));
  EXPECT_LT(msg.size(), 300u);
  // A tensor entry that is a big array.
  const std::string entry = header_error("{\"t\": " + arr + "}");
  EXPECT_THAT(entry, HasSubstr("tensor \"t\": header entry must be an object"));
  EXPECT_LT(entry.size(), 300u);
}

/// A minimal tokenizer.json accepted by Tokenizer::from_file: byte-level BPE over "a", "b", "ab".
json tiny_tokenizer() {
  return json::parse(R"({
    "added_tokens": [{"id": 3, "content": "<eos>", "special": true, "normalized": false,
                      "single_word": false, "lstrip": false, "rstrip": false}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})");
}

std::string tokenizer_error(const TempDir& dir, const json& t) {
  write_file(dir / "tokenizer.json", t.dump());
  return error_of([&] { Tokenizer::from_file(dir / "tokenizer.json"); });
}

TEST(CorruptTokenizerFile, TinyTokenizerLoads) {
  TempDir dir("hostile-tok");
  write_file(dir / "tokenizer.json", tiny_tokenizer().dump());
  const Tokenizer t = Tokenizer::from_file(dir / "tokenizer.json");
  EXPECT_EQ(t.vocab_size(), 4);
  EXPECT_EQ(t.encode("ab"), std::vector<int>{2});
  // Gaps below the bound are fine (max(4 x entries, 1024)).
  json gap = tiny_tokenizer();
  gap["added_tokens"][0]["id"] = 1000;
  write_file(dir / "tokenizer.json", gap.dump());
  EXPECT_EQ(Tokenizer::from_file(dir / "tokenizer.json").vocab_size(), 1001);
}

TEST(CorruptTokenizerFile, HugeIdsAreRejectedNamingTheToken) {
  TempDir dir("hostile-tok");
  json t = tiny_tokenizer();
  t["added_tokens"][0]["id"] = 200000000;
  std::string msg = tokenizer_error(dir, t);
  EXPECT_THAT(msg, HasSubstr("tokenizer.json"));
  EXPECT_THAT(msg, HasSubstr("added token '<eos>' has id 200000000, above the limit of 1024"));

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = 2147483647;  // id + 1 would overflow int
  msg = tokenizer_error(dir, t);
  EXPECT_THAT(msg, HasSubstr("token 'ab' has id 2147483647"));

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = uint64_t{18446744073709551615u};
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("token 'ab' has id 18446744073709551615"));

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = int64_t{4294967298};  // would wrap to 2 through get<int>()
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("has id 4294967298"));

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = -5;
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("negative id -5 for token 'ab'"));

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = 2.5;
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("token 'ab' has id 2.5, which is not an integer"));

  t = tiny_tokenizer();
  t["added_tokens"][0]["id"] = "3";
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("not an integer"));

  // A long token is quoted short.
  t = tiny_tokenizer();
  t["added_tokens"][0]["content"] = std::string(100000, 'x');
  t["added_tokens"][0]["id"] = 99999999;
  msg = tokenizer_error(dir, t);
  EXPECT_THAT(msg, HasSubstr("has id 99999999"));
  EXPECT_LT(msg.size(), 500u);
}

TEST(CorruptTokenizerFile, MalformedSectionsAreErrors) {
  TempDir dir("hostile-tok");
  json t = tiny_tokenizer();
  t["model"]["vocab"] = json::array({1, 2});
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("model.vocab must be an object"));
  t = tiny_tokenizer();
  t["model"]["vocab"] = json::object();  // named as such, not as an added token's id above the limit
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("model.vocab is empty"));
  t = tiny_tokenizer();
  t["added_tokens"] = 7;
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("added_tokens must be a list"));
  t = tiny_tokenizer();
  t["added_tokens"] = json::array({5});
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("added_tokens entry must be an object"));
  t = tiny_tokenizer();
  t["model"]["merges"] = json::array({json::array({1, 2, 3})});
  EXPECT_THAT(tokenizer_error(dir, t), HasSubstr("bad merge [1,2,3]"));
}

TEST(CorruptTokenizerFile, NonRegularFilesAndDeepJson) {
  TempDir dir("hostile-tok");
  auto from_file_error = [](const fs::path& p) { return error_of([&] { Tokenizer::from_file(p); }); };
  fs::create_directory(dir / "dir.json");
  EXPECT_THAT(from_file_error(dir / "dir.json"), HasSubstr("dir.json: is a directory, not a regular file"));
  fs::create_symlink("/dev/zero", dir / "zero.json");
  EXPECT_THAT(from_file_error(dir / "zero.json"), HasSubstr("zero.json: is a character device"));
  fs::create_symlink(dir / "loop.json", dir / "loop.json.tmp");
  fs::rename(dir / "loop.json.tmp", dir / "loop.json");
  EXPECT_THAT(from_file_error(dir / "loop.json"), HasSubstr("loop.json: symlink loop"));
  write_file(dir / "big.json", "");
  fs::resize_file(dir / "big.json", kMaxTokenizerFileBytes + 1);
  EXPECT_THAT(from_file_error(dir / "big.json"), HasSubstr("big.json: file is"));
  write_file(dir / "deep.json", "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  const std::string msg = from_file_error(dir / "deep.json");
  EXPECT_THAT(msg, HasSubstr("deep.json"));
  EXPECT_THAT(msg, HasSubstr("levels deep"));
}

}  // namespace
}  // namespace ssmserve
