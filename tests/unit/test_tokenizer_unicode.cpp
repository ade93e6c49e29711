// Owns the exhaustive Unicode audit of the tokenizer: every code point's regex class and NFC probes against HF's stored answers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

const std::filesystem::path kData = std::filesystem::path(SSMSERVE_SOURCE_DIR) / "tests/data/tokenizer";

std::string unhex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string utf8_of(char32_t cp) {
  std::string s;
  utf8::append_code_point(s, cp);
  return s;
}

bool is_surrogate(char32_t c) { return c >= 0xD800 && c < 0xE000; }

/// Class of `c` under our splitter, probed exactly like tools/make_tokenizer_expected.py probes HF.
char classify(const GptSplitter& sp, char32_t c) {
  const std::string ch = utf8_of(c);
  std::vector<std::string_view> pieces;
  for (auto [prefix, cls] : {std::pair{"a", 'L'}, std::pair{"1", 'N'}, std::pair{"!", 'O'}}) {
    const std::string probe = prefix + ch;
    pieces.clear();
    sp.split(probe, pieces);
    if (pieces.size() == 1) return cls;
  }
  return 'W';
}

TEST(TokenizerUnicode, EveryCodePointHasHfRegexClass) {
  std::ifstream in(kData / "unicode_classes.txt");
  ASSERT_TRUE(in.good());
  const GptSplitter sp;
  std::size_t checked = 0, bad = 0;
  char32_t next = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string lo_s, hi_s;
    char cls = 0;
    ss >> lo_s >> hi_s >> cls;
    const auto lo = static_cast<char32_t>(std::stoul(lo_s, nullptr, 16)), hi = static_cast<char32_t>(std::stoul(hi_s, nullptr, 16));
    for (char32_t c = lo; c <= hi; ++c) {
      if (is_surrogate(c)) continue;
      ++checked;
      const char got = classify(sp, c);
      if (got != cls && ++bad <= 10) ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(c) << ": HF " << cls << ", ours " << got;
    }
    next = hi + 1;
  }
  EXPECT_EQ(next, 0x110000u) << "unicode_classes.txt does not cover all code points";
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(checked, 0x110000u - 0x800u);
  std::printf("[tokenizer] regex class matches HF for %zu code points\n", checked);
}

TEST(TokenizerUnicode, NfcProbesMatchHf) {
  std::ifstream in(kData / "nfc_probes.txt");
  ASSERT_TRUE(in.good());
  std::unordered_map<std::string, std::string> listed;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.find(' ');
    listed.emplace(unhex(line.substr(0, sp)), unhex(line.substr(sp + 1)));
  }
  ASSERT_GT(listed.size(), 5000u);
  std::size_t checked = 0, bad = 0;
  auto check = [&](const std::string& probe, const std::string& want) {
    ++checked;
    const std::string got = nfc_normalize(probe);
    if (got != want && ++bad <= 10) ADD_FAILURE() << "NFC differs from HF for probe of " << probe.size() << " bytes";
  };
  // The generic probes (same set as the tool): unlisted ones must come out unchanged.
  const char* prefixes[] = {"", "\u05b0", "\u1100", "\uac00"};
  for (char32_t c = 0; c < 0x110000; ++c) {
    if (is_surrogate(c)) continue;
    const std::string ch = utf8_of(c);
    for (const char* p : prefixes) {
      const std::string probe = p + ch;
      auto it = listed.find(probe);
      check(probe, it != listed.end() ? it->second : probe);
    }
    const std::string suffixed = ch + "\u0334";
    auto it = listed.find(suffixed);
    check(suffixed, it != listed.end() ? it->second : suffixed);
  }
  for (const auto& [probe, want] : listed) check(probe, want);  // includes every composition pair
  EXPECT_EQ(bad, 0u);
  std::printf("[tokenizer] NFC matches HF on %zu probes (%zu listed)\n", checked, listed.size());
}

}  // namespace
}  // namespace ssmserve
