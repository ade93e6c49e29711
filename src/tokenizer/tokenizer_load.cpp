// Owns Tokenizer::from_file: parsing and validating a Hugging Face tokenizer.json into Tokenizer::Impl (with the
// pipeline transformers' tokenizer class rebuilds, where it does).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/transformers_class.h"

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

/// One `Split` pre-tokenizer: pattern {"Regex": ...} or {"String": ...}, behavior Isolated, invert false.
RegexSplitter parse_split(const json& split) {
  const std::string behavior = split.value("behavior", std::string());
  SSM_CHECK(behavior == "Isolated", "unsupported pre_tokenizer Split behavior '{}' (only Isolated)", behavior);
  SSM_CHECK(is_false_or_absent(split, "invert"), "unsupported pre_tokenizer Split invert=true");
  const json& pattern = split.value("pattern", json());
  SSM_CHECK(pattern.is_object() && pattern.size() == 1 && (pattern.contains("Regex") || pattern.contains("String")),
            "pre_tokenizer Split pattern must be {{\"Regex\": ...}} or {{\"String\": ...}} (got {})", json_excerpt(pattern));
  if (pattern.contains("Regex")) return RegexSplitter(pattern.at("Regex").get<std::string>());
  return RegexSplitter::literal(pattern.at("String").get<std::string>());
}

/// ByteLevel pre-tokenizer: the GPT-2 split when use_regex is true (the default), else the byte mapping only.
void parse_byte_level(const json& pre, std::vector<RegexSplitter>& splitters) {
  SSM_CHECK(is_false_or_absent(pre, "add_prefix_space"), "unsupported pre_tokenizer ByteLevel add_prefix_space=true");
  if (!pre.contains("use_regex") || pre.at("use_regex").get<bool>()) splitters.emplace_back(gpt2_split_pattern());
}

/// The pre-tokenizer as a chain of splitters applied in order: ByteLevel alone, or a Sequence of Split pre-tokenizers
/// ending in ByteLevel (which must come last: it maps bytes to the byte-level alphabet the vocabulary is written in).
std::vector<RegexSplitter> parse_pre_tokenizer(const json& pre) {
  std::vector<RegexSplitter> splitters;
  const std::string t = type_of(pre);
  if (t == "ByteLevel") {
    parse_byte_level(pre, splitters);
  } else if (t == "Sequence") {
    const json& list = pre.value("pretokenizers", json());
    SSM_CHECK(list.is_array() && !list.empty(), "pre_tokenizer Sequence needs a non-empty 'pretokenizers' list");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string ti = type_of(list[i]);
      if (ti == "Split" && i + 1 < list.size()) {
        splitters.push_back(parse_split(list[i]));
      } else if (ti == "ByteLevel" && i + 1 == list.size()) {
        parse_byte_level(list[i], splitters);
      } else {
        fail("unsupported pre_tokenizer '{}' at position {} of Sequence (supported: Split ..., then ByteLevel last)",
             ti, i);
      }
    }
  } else if (t == "Split") {
    fail("unsupported pre_tokenizer Split without ByteLevel (byte-level BPE needs Sequence[Split, ByteLevel])");
  } else {
    fail("unsupported pre_tokenizer '{}' (supported: ByteLevel, Sequence of Split and ByteLevel)", t);
  }
  return splitters;
}

/// Validates the pipeline parts around the model; sets impl.nfc and impl.splitters.
void check_pipeline(const json& root, Tokenizer::Impl& impl) {
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
  impl.nfc = nfc;
  impl.splitters = parse_pre_tokenizer(root.value("pre_tokenizer", json()));
  const json& post = root.value("post_processor", json());
  SSM_CHECK(post.is_null() || type_of(post) == "ByteLevel", "unsupported post_processor '{}'", type_of(post));
  const json& dec = root.value("decoder", json());
  SSM_CHECK(type_of(dec) == "ByteLevel", "unsupported decoder '{}' (only ByteLevel)", type_of(dec));
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
  check_pipeline(root, impl);
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
  std::string cls;
  try {
    cls = transformers_class::of_folder(tokenizer_json.parent_path());
  } catch (const Error& e) {
    fail("tokenizer file {}: {}", tokenizer_json.string(), e.what());
  }
  return from_file(tokenizer_json, cls);
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json, std::string_view tokenizer_class) {
  // Missing, not a regular file (directory, /dev/zero, fifo), symlink loop, or over the size cap: a clear Error.
  const std::string text = read_text_file(tokenizer_json, kMaxTokenizerFileBytes);
  auto impl = std::make_shared<Impl>();
  try {
    check_json_depth(text, "invalid tokenizer JSON");
    json root = json::parse(text);
    SSM_CHECK(root.is_object(), "top level is not an object");
    if (const auto pattern = transformers_class::rebuilt_pattern(tokenizer_class))
      transformers_class::rebuild_pipeline(root, *pattern);
    build(root, *impl);
  } catch (const json::exception& e) {
    fail("tokenizer file {}: invalid tokenizer JSON: {}", tokenizer_json.string(), e.what());
  } catch (const Error& e) {
    fail("tokenizer file {}: {}", tokenizer_json.string(), e.what());
  }
  return Tokenizer(std::move(impl));
}

}  // namespace ssmserve
