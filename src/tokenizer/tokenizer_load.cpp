// Owns Tokenizer::from_file: parsing and validating a Hugging Face tokenizer.json into Tokenizer::Impl.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace ssmserve {
namespace {

using nlohmann::json;

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j.at("type").get<std::string>() : ""; }

bool is_false_or_absent(const json& obj, const char* key) {
  return !obj.contains(key) || obj.at(key).is_null() || (obj.at(key).is_boolean() && !obj.at(key).get<bool>());
}

bool is_empty_string_or_absent(const json& obj, const char* key) {
  return !obj.contains(key) || obj.at(key).is_null() || (obj.at(key).is_string() && obj.at(key).get<std::string>().empty());
}

/// Validates the pipeline parts around the model; returns whether NFC normalization is on.
bool check_pipeline(const json& root) {
  bool nfc = false;
  const json& norm = root.value("normalizer", json());
  if (!norm.is_null()) {
    const std::string t = type_of(norm);
    if (t == "NFC") {
      nfc = true;
    } else if (t == "Sequence" && norm.contains("normalizers")) {
      for (const json& n : norm.at("normalizers")) {
        SSM_CHECK(type_of(n) == "NFC", "unsupported normalizer '{}' in Sequence", type_of(n));
        nfc = true;
      }
    } else {
      fail("unsupported normalizer '{}'", t);
    }
  }
  const json& pre = root.value("pre_tokenizer", json());
  SSM_CHECK(type_of(pre) == "ByteLevel", "unsupported pre_tokenizer '{}' (only ByteLevel)", type_of(pre));
  SSM_CHECK(is_false_or_absent(pre, "add_prefix_space"), "unsupported pre_tokenizer ByteLevel add_prefix_space=true");
  SSM_CHECK(!pre.contains("use_regex") || pre.at("use_regex").get<bool>(), "unsupported ByteLevel use_regex=false");
  const json& post = root.value("post_processor", json());
  SSM_CHECK(post.is_null() || type_of(post) == "ByteLevel", "unsupported post_processor '{}'", type_of(post));
  const json& dec = root.value("decoder", json());
  SSM_CHECK(type_of(dec) == "ByteLevel", "unsupported decoder '{}' (only ByteLevel)", type_of(dec));
  return nfc;
}

std::vector<std::pair<std::string, std::string>> parse_merges(const json& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const json& m : merges) {
    if (m.is_string()) {  // legacy format "left right"
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      SSM_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "bad merge '{}'",
                text_excerpt(s));
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else {
      SSM_CHECK(m.is_array() && m.size() == 2, "bad merge {}", json_excerpt(m));
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return out;
}

/// Largest token id accepted at all: ids index dense per-id tables, so a huge id would allocate gigabytes.
constexpr std::int64_t kMaxTokenId = std::int64_t{1} << 24;  // 16,777,216

/// Reads a token id (`what` = "token" or "added token"), rejecting non-integers, negatives and ids above
/// `limit`, the bound that keeps the id tables proportional to the number of entries in the file.
int read_token_id(const json& id, const std::string& content, const char* what, std::int64_t limit,
                  std::size_t entries) {
  SSM_CHECK(id.is_number_integer(), "{} '{}' has id {}, which is not an integer", what, text_excerpt(content),
            json_excerpt(id));
  SSM_CHECK(id.is_number_unsigned() || id.get<std::int64_t>() >= 0, "negative id {} for {} '{}'",
            json_excerpt(id), what, text_excerpt(content));
  SSM_CHECK(id.is_number_unsigned() ? id.get<std::uint64_t>() <= static_cast<std::uint64_t>(limit)
                                    : id.get<std::int64_t>() <= limit,
            "{} '{}' has id {}, above the limit of {} (ids may be at most 4x the {} vocabulary + added entries, "
            "and never above {})",
            what, text_excerpt(content), json_excerpt(id), limit, entries, kMaxTokenId);
  return static_cast<int>(id.get<std::int64_t>());
}

void build(const json& root, Tokenizer::Impl& impl) {
  impl.nfc = check_pipeline(root);
  const json& model = root.at("model");
  const std::string mtype = model.value("type", std::string("BPE"));
  SSM_CHECK(mtype == "BPE", "unsupported model type '{}' (only BPE)", mtype);
  SSM_CHECK(model.value("dropout", json()).is_null() || model.at("dropout").get<double>() == 0.0,
            "unsupported BPE dropout");
  SSM_CHECK(is_empty_string_or_absent(model, "continuing_subword_prefix") &&
                is_empty_string_or_absent(model, "end_of_word_suffix"),
            "unsupported BPE continuing_subword_prefix/end_of_word_suffix");
  SSM_CHECK(is_false_or_absent(model, "byte_fallback") && is_false_or_absent(model, "ignore_merges"),
            "unsupported BPE byte_fallback/ignore_merges");

  const json& vocab = model.at("vocab");
  SSM_CHECK(vocab.is_object(), "model.vocab must be an object of token -> id (got {})", json_excerpt(vocab));
  static const json kNoAddedTokens = json::array();
  const json& added_json =
      root.contains("added_tokens") && !root.at("added_tokens").is_null() ? root.at("added_tokens") : kNoAddedTokens;
  SSM_CHECK(added_json.is_array(), "added_tokens must be a list (got {})", json_excerpt(added_json));
  const std::size_t entries = vocab.size() + added_json.size();
  const std::int64_t id_limit =
      std::min<std::int64_t>(kMaxTokenId, std::max<std::int64_t>(4 * static_cast<std::int64_t>(entries), 1024));
  int max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    const int i = read_token_id(id, tok, "token", id_limit, entries);
    impl.vocab.emplace(tok, i);
    max_id = std::max(max_id, i);
  }
  struct Added {
    std::string content;
    int id;
    bool special, normalized;
  };
  std::vector<Added> added;
  for (const json& a : added_json) {
    SSM_CHECK(a.is_object(), "added_tokens entry must be an object (got {})", json_excerpt(a));
    std::string content = a.at("content").get<std::string>();
    const int id = read_token_id(a.at("id"), content, "added token", id_limit, entries);
    Added t{std::move(content), id, a.value("special", false), a.value("normalized", false)};
    SSM_CHECK(!a.value("single_word", false) && !a.value("lstrip", false) && !a.value("rstrip", false),
              "unsupported added token options (single_word/lstrip/rstrip) on '{}'", text_excerpt(t.content));
    max_id = std::max(max_id, t.id);
    added.push_back(std::move(t));
  }
  const std::size_t n = max_id < 0 ? 0 : static_cast<std::size_t>(max_id) + 1;  // max_id <= kMaxTokenId
  impl.token_strings.assign(n, std::string());
  impl.token_raw.assign(n, std::string());
  impl.kinds.assign(n, Tokenizer::Impl::kNone);
  for (const auto& [tok, id] : impl.vocab) {
    impl.token_strings[id] = tok;
    impl.token_raw[id] = byte_level::token_string_to_bytes(tok);
    impl.kinds[id] = Tokenizer::Impl::kNormal;
  }
  for (const Added& t : added) {
    impl.token_strings[t.id] = t.content;
    impl.token_raw[t.id] = byte_level::token_string_to_bytes(t.content);
    impl.kinds[t.id] = t.special ? Tokenizer::Impl::kSpecial : Tokenizer::Impl::kNormal;
    impl.added.emplace(t.content, t.id);
    if (t.normalized) {
      impl.normalized_added.add(impl.nfc ? nfc_normalize(t.content) : t.content, t.id);
    } else {
      impl.raw_added.add(t.content, t.id);
    }
  }
  impl.bpe = std::make_unique<BpeModel>(impl.vocab, parse_merges(model.at("merges")));
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  // Missing, not a regular file (directory, /dev/zero, fifo), symlink loop, or over the size cap: a clear Error.
  const std::string text = read_text_file(tokenizer_json, kMaxTokenizerFileBytes);
  auto impl = std::make_shared<Impl>();
  try {
    check_json_depth(text, "invalid tokenizer JSON");
    const json root = json::parse(text);
    SSM_CHECK(root.is_object(), "top level is not an object");
    build(root, *impl);
  } catch (const json::exception& e) {
    fail("tokenizer file {}: invalid tokenizer JSON: {}", tokenizer_json.string(), e.what());
  } catch (const Error& e) {
    fail("tokenizer file {}: {}", tokenizer_json.string(), e.what());
  }
  return Tokenizer(std::move(impl));
}

}  // namespace ssmserve
