// Owns the tests of transformers 5's tokenizer class choice and pipeline rebuilds beyond Qwen: checkpoint folders
// pairing a family tokenizer.json with the model_type and tokenizer_class the families ship (Codestral-Mamba's
// LlamaTokenizer, Jamba, Granite-4.0-H, MiniMax / Bamba GPT2Tokenizer, Llama-3-style ByteLevel files, mamba's
// GPTNeoXTokenizer) give AutoTokenizer's ids and decodes (tools/make_tokenizer_transformers_expected.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint_fixtures.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/transformers_class.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::write_file;

const std::filesystem::path kData = std::filesystem::path(SSMSERVE_SOURCE_DIR) / "tests/data/tokenizers";

std::string fnv(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(TokenizerClasses, FoldersTokenizeAsAutoTokenizer) {
  std::vector<std::string> texts;
  for (const std::string& line : lines(kData / "texts.jsonl")) {
    const std::string hex = json::parse(line).at("hex");
    std::string bytes;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    texts.push_back(std::move(bytes));
  }
  const json cases = json::parse(read_text(kData / "classes/cases.json"));
  ASSERT_GE(cases.size(), 9u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    TempDir dir("tok-classes");
    const std::string tokenizer_json = read_text(kData / c.at("family").get<std::string>() / "tokenizer.json");
    write_file(dir / "tokenizer.json", tokenizer_json);
    write_file(dir / "config.json", c.at("config").dump());
    if (!c.at("tokenizer_config").is_null()) write_file(dir / "tokenizer_config.json", c.at("tokenizer_config").dump());
    // The class choice, as transformers made it.
    const std::string want_class = c.at("class") == "TokenizersBackend" ? "" : c.at("class").get<std::string>();
    EXPECT_EQ(transformers_class::of_folder(dir.path(), tokenizer_json.find("\"ByteLevel\"") != std::string::npos),
              want_class)
        << name;
    const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
    // The class it reports (named in errors, e.g. a draft model's): a rebuilding class, else "" (tokenizer.json's own).
    EXPECT_EQ(tok.tokenizer_class(), transformers_class::rebuilds_pipeline(want_class) ? want_class : "") << name;
    const std::vector<std::string> expected = lines(kData / "classes" / (name + ".txt"));
    ASSERT_EQ(expected.size(), texts.size()) << name;
    int bad = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const std::vector<int> ids = tok.encode(texts[i]);
      std::string key;
      for (std::size_t k = 0; k < ids.size(); ++k) key += (k > 0 ? "," : "") + std::to_string(ids[k]);
      std::istringstream in(expected[i]);
      std::string ids_fnv, dec_fnv;
      std::size_t count = 0;
      in >> ids_fnv >> count >> dec_fnv;
      const std::string what = name + ": text #" + std::to_string(i) + " " + json(utf8::repair(texts[i])).dump();
      if ((fnv(key) != ids_fnv || ids.size() != count) && ++bad <= 5) ADD_FAILURE() << "encode differs on " << what << ": " << key;
      if (fnv(tok.decode(ids)) != dec_fnv && ++bad <= 5)
        ADD_FAILURE() << "decode differs on " << what << ": " << json(tok.decode(ids)).dump();
    }
    EXPECT_EQ(bad, 0) << name;
  }
}

}  // namespace
}  // namespace ssmserve
