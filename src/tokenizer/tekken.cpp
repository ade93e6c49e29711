// Owns the tekken.json conversion (see tekken.h).
#include "tokenizer/tekken.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace ssmserve::tekken {

using nlohmann::json;

namespace {

/// mistral_common's special tokens of tokenizers up to v7 that list none.
const std::vector<std::string>& v7_specials() {
  static const std::vector<std::string> s = {
      "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
      "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
      "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"};
  return s;
}

int config_int(const json& cfg, const char* key) {
  SSM_CHECK(cfg.contains(key) && cfg.at(key).is_number_integer(), "tekken config.{} must be an integer", key);
  const auto v = cfg.at(key).get<long long>();
  SSM_CHECK(v >= 0 && v <= (1 << 24), "tekken config.{} = {} is out of range", key, v);
  return static_cast<int>(v);
}

std::string to_byte_level(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += byte_level::byte_to_string(b);
  return s;
}

}  // namespace

std::string base64_decode(const std::string& s) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  unsigned buf = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    const int v = val(c);
    SSM_CHECK(v >= 0, "invalid base64 character '{}'", c);
    buf = (buf << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buf >> bits) & 0xFF);
    }
  }
  return out;
}

Converted convert(const json& tekken) {
  SSM_CHECK(tekken.is_object(), "tekken file: the top level is not an object");
  SSM_CHECK(tekken.contains("config") && tekken.at("config").is_object(), "tekken file has no 'config' object");
  const json& cfg = tekken.at("config");
  SSM_CHECK(cfg.contains("pattern") && cfg.at("pattern").is_string(), "tekken config.pattern must be a string (the split regex)");
  const int num_special = config_int(cfg, "default_num_special_tokens");
  const int vocab_size = config_int(cfg, "default_vocab_size");
  Converted out;
  // 1. Special tokens: ids [0, num_special).
  if (tekken.contains("special_tokens") && !tekken.at("special_tokens").is_null()) {
    const json& sp = tekken.at("special_tokens");
    SSM_CHECK(sp.is_array(), "tekken special_tokens must be a list");
    for (size_t i = 0; i < sp.size(); ++i) {
      SSM_CHECK(sp[i].is_object() && sp[i].contains("token_str") && sp[i].at("token_str").is_string(),
                "tekken special_tokens[{}] needs a string token_str", i);
      SSM_CHECK(!sp[i].contains("rank") || sp[i].at("rank") == static_cast<int>(i), "tekken special_tokens[{}] has rank {}", i,
                sp[i].at("rank").dump());
      out.specials.push_back(sp[i].at("token_str").get<std::string>());
    }
  } else {
    out.specials = v7_specials();
  }
  SSM_CHECK(static_cast<int>(out.specials.size()) <= num_special, "tekken file lists {} special tokens, more than "
            "config.default_num_special_tokens {}", out.specials.size(), num_special);
  for (int i = static_cast<int>(out.specials.size()); i < num_special; ++i) out.specials.push_back("<SPECIAL_" + std::to_string(i) + ">");
  for (int i = 0; i < num_special; ++i)
    if (out.specials[i] == "<s>") out.bos_id = i;
  // 2. The ranked vocabulary, cut to default_vocab_size - num_special entries.
  SSM_CHECK(tekken.contains("vocab") && tekken.at("vocab").is_array(), "tekken file has no 'vocab' list");
  const json& vocab = tekken.at("vocab");
  const int inner = vocab_size - num_special;
  SSM_CHECK(inner >= 256 && inner <= static_cast<int>(vocab.size()),
            "tekken config.default_vocab_size {} minus {} special tokens must be in [256, {}] (the vocab's length)", vocab_size,
            num_special, vocab.size());
  std::vector<std::string> tokens(inner);
  std::unordered_map<std::string, int> rank;
  rank.reserve(inner * 2);
  for (int i = 0; i < inner; ++i) {
    const json& e = vocab[i];
    SSM_CHECK(e.is_object() && e.contains("token_bytes") && e.at("token_bytes").is_string(),
              "tekken vocab[{}] needs a string token_bytes (base64)", i);
    SSM_CHECK(!e.contains("rank") || e.at("rank") == i, "tekken vocab[{}] has rank {} (ranks must be 0, 1, 2, ...)", i,
              e.at("rank").dump());
    std::string b = base64_decode(e.at("token_bytes").get<std::string>());
    SSM_CHECK(i >= 256 || b == std::string(1, static_cast<char>(i)), "tekken vocab[{}] must be the single byte {}", i, i);
    SSM_CHECK(!b.empty() && rank.emplace(b, i).second, "tekken vocab[{}] is empty or repeats an earlier token", i);
    tokens[i] = std::move(b);
  }
  // 3. Merges: every split of a token into two tokens, by (token rank, left rank, right rank).
  std::vector<std::tuple<int, int, int>> merges;
  for (int r = 256; r < inner; ++r) {
    const std::string& t = tokens[r];
    for (size_t k = 1; k < t.size(); ++k) {
      const auto l = rank.find(t.substr(0, k)), rr = rank.find(t.substr(k));
      if (l != rank.end() && rr != rank.end()) merges.emplace_back(r, l->second, rr->second);
    }
  }
  std::sort(merges.begin(), merges.end());
  json v = json::object();
  for (int i = 0; i < inner; ++i) v[to_byte_level(tokens[i])] = i + num_special;
  json m = json::array();
  for (const auto& [r, l, rr] : merges) m.push_back(json::array({to_byte_level(tokens[l]), to_byte_level(tokens[rr])}));
  out.tokenizer_json = {
      {"model", {{"type", "BPE"}, {"vocab", std::move(v)}, {"merges", std::move(m)}, {"ignore_merges", true}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"}, {"pattern", {{"Regex", cfg.at("pattern")}}}, {"behavior", "Isolated"}, {"invert", false}},
                                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
  };
  return out;
}

}  // namespace ssmserve::tekken
