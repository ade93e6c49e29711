// Owns Tokenizer::from_file: parsing and validating a Hugging Face tokenizer.json into Tokenizer::Impl (with the
// pipeline transformers' tokenizer class rebuilds, where it does).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/tekken.h"
#include "tokenizer/transformers_class.h"

namespace ssmserve {
namespace {

using nlohmann::json;

/// The string at obj[key], "" when absent or null. Throws Error when it is something else.
std::string optional_string(const json& obj, const char* key, const char* what) {
  if (!obj.contains(key) || obj.at(key).is_null()) return {};
  SSM_CHECK(obj.at(key).is_string(), "{} '{}' must be a string (got {})", what, key, json_excerpt(obj.at(key)));
  return obj.at(key).get<std::string>();
}

bool optional_bool(const json& obj, const char* key, bool def, const char* what) {
  if (!obj.contains(key) || obj.at(key).is_null()) return def;
  SSM_CHECK(obj.at(key).is_boolean(), "{} '{}' must be true or false (got {})", what, key, json_excerpt(obj.at(key)));
  return obj.at(key).get<bool>();
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

/// A post-processor's token id: a non-negative integer naming a token (checked later against the tables).
int post_id(const json& id, const char* what) {
  SSM_CHECK(id.is_number_integer() && (id.is_number_unsigned() || id.get<std::int64_t>() >= 0) &&
                id.get<std::int64_t>() <= kMaxTokenId,
            "post_processor {} has a bad token id {}", what, json_excerpt(id));
  return static_cast<int>(id.get<std::int64_t>());
}

/// The ids a post-processor adds around a single sequence (HF's TemplateProcessing `single`, Bert / Roberta
/// processors' cls / sep, ByteLevel nothing, Sequence all in turn).
void parse_post_processor(const json& post, std::vector<int>& prefix, std::vector<int>& suffix, int depth) {
  if (post.is_null()) return;
  SSM_CHECK(depth < 16, "post_processor Sequences nested too deeply");
  SSM_CHECK(post.is_object() && post.contains("type") && post.at("type").is_string(),
            "post_processor must be an object with a 'type' (got {})", json_excerpt(post));
  const std::string t = post.at("type").get<std::string>();
  if (t == "ByteLevel") return;
  if (t == "Sequence") {
    const json& list = post.value("processors", json());
    SSM_CHECK(list.is_array(), "post_processor Sequence needs a 'processors' list (got {})", json_excerpt(list));
    for (const json& p : list) parse_post_processor(p, prefix, suffix, depth + 1);
    return;
  }
  if (t == "BertProcessing" || t == "RobertaProcessing") {
    const json& cls = post.value("cls", json()), sep = post.value("sep", json());
    SSM_CHECK(cls.is_array() && cls.size() == 2 && sep.is_array() && sep.size() == 2,
              "post_processor {} needs 'cls' and 'sep' as [token, id]", t);
    prefix.insert(prefix.begin(), post_id(cls[1], t.c_str()));
    suffix.push_back(post_id(sep[1], t.c_str()));
    return;
  }
  SSM_CHECK(t == "TemplateProcessing", "unsupported post_processor '{}' (supported: TemplateProcessing, ByteLevel, "
            "BertProcessing, RobertaProcessing, Sequence)", t);
  const json& single = post.value("single", json());
  const json& specials = post.value("special_tokens", json::object());
  SSM_CHECK(single.is_array(), "post_processor TemplateProcessing needs a 'single' list (got {})", json_excerpt(single));
  SSM_CHECK(specials.is_object(), "post_processor TemplateProcessing special_tokens must be an object");
  std::vector<int> before, after;
  bool seen_sequence = false;
  for (const json& piece : single) {
    SSM_CHECK(piece.is_object() && piece.size() == 1, "bad TemplateProcessing piece {}", json_excerpt(piece));
    if (piece.contains("Sequence")) {
      const json& seq = piece.at("Sequence");
      SSM_CHECK(seq.is_object() && seq.value("id", json()) == "A" && !seen_sequence,
                "post_processor TemplateProcessing 'single' must name sequence A once (got {})", json_excerpt(piece));
      seen_sequence = true;
      continue;
    }
    SSM_CHECK(piece.contains("SpecialToken") && piece.at("SpecialToken").is_object() &&
                  piece.at("SpecialToken").contains("id") && piece.at("SpecialToken").at("id").is_string(),
              "bad TemplateProcessing piece {}", json_excerpt(piece));
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    SSM_CHECK(specials.contains(name) && specials.at(name).is_object() && specials.at(name).contains("ids") &&
                  specials.at(name).at("ids").is_array(),
              "post_processor TemplateProcessing uses special token '{}' missing from special_tokens",
              text_excerpt(name));
    for (const json& id : specials.at(name).at("ids")) (seen_sequence ? after : before).push_back(post_id(id, name.c_str()));
  }
  SSM_CHECK(seen_sequence, "post_processor TemplateProcessing 'single' has no sequence $A");
  prefix.insert(prefix.end(), before.begin(), before.end());
  suffix.insert(suffix.begin(), after.begin(), after.end());
}

/// The BPE model's options, refusing dropout (HF samples merges at random: not reproducible).
BpeOptions parse_bpe_options(const json& model, bool byte_input) {
  const json& dropout = model.value("dropout", json());
  SSM_CHECK(dropout.is_null() || (dropout.is_number() && dropout.get<double>() == 0.0),
            "unsupported BPE dropout {} (sampled merges cannot match a deterministic tokenizer)", json_excerpt(dropout));
  BpeOptions o;
  o.byte_input = byte_input;
  o.byte_fallback = optional_bool(model, "byte_fallback", false, "BPE");
  o.ignore_merges = optional_bool(model, "ignore_merges", false, "BPE");
  o.fuse_unk = optional_bool(model, "fuse_unk", false, "BPE");
  o.continuing_subword_prefix = optional_string(model, "continuing_subword_prefix", "BPE");
  o.end_of_word_suffix = optional_string(model, "end_of_word_suffix", "BPE");
  return o;
}

void build(const json& root, Tokenizer::Impl& impl) {
  // 1. The pipeline components around the model.
  impl.normalizer = Normalizer::from_json(root.value("normalizer", json()));
  impl.pre_tokenizer = PreTokenizerChain::from_json(root.value("pre_tokenizer", json()));
  impl.decoder = Decoder::from_json(root.value("decoder", json()));
  impl.byte_level_decoder = impl.decoder.is_byte_level();
  parse_post_processor(root.value("post_processor", json()), impl.prefix_ids, impl.suffix_ids, 0);

  // 2. The model.
  SSM_CHECK(root.contains("model") && root.at("model").is_object(), "tokenizer.json has no 'model' object");
  const json& model = root.at("model");
  const json& mtype_json = model.value("type", json("BPE"));
  const std::string mtype = mtype_json.is_string() ? mtype_json.get<std::string>() : json_excerpt(mtype_json);
  SSM_CHECK(mtype == "BPE", "unsupported model type '{}' (only BPE)", mtype);
  BpeOptions options = parse_bpe_options(model, impl.pre_tokenizer.raw_bytes_out());
  const std::string unk_token = optional_string(model, "unk_token", "BPE");

  // 3. Vocabulary and added tokens, with bounded ids.
  SSM_CHECK(model.contains("vocab"), "model has no 'vocab'");
  const json& vocab = model.at("vocab");
  SSM_CHECK(vocab.is_object(), "model.vocab must be an object of token -> id (got {})", json_excerpt(vocab));
  SSM_CHECK(!vocab.empty(), "model.vocab is empty (a BPE tokenizer needs its tokens)");
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
  if (!unk_token.empty()) {
    auto it = impl.vocab.find(unk_token);
    SSM_CHECK(it != impl.vocab.end(), "BPE unk_token '{}' is not in the vocabulary", text_excerpt(unk_token));
    options.unk_id = it->second;
  }
  struct Added {
    std::string content;
    int id;
    bool special, normalized;
    AddedTokenFlags flags;
  };
  std::vector<Added> added;
  added.reserve(added_json.size());
  for (const json& a : added_json) {
    SSM_CHECK(a.is_object(), "added_tokens entry must be an object (got {})", json_excerpt(a));
    SSM_CHECK(a.contains("content") && a.at("content").is_string() && a.contains("id"),
              "added_tokens entry needs a string 'content' and an 'id' (got {})", json_excerpt(a));
    std::string content = a.at("content").get<std::string>();
    const int id = read_token_id(a.at("id"), content, "added token", id_limit, entries);
    const char* what = "added token";
    const bool special = optional_bool(a, "special", false, what);
    Added t{std::move(content), id, special, optional_bool(a, "normalized", !special, what),
            AddedTokenFlags{optional_bool(a, "lstrip", false, what), optional_bool(a, "rstrip", false, what),
                            optional_bool(a, "single_word", false, what)}};
    max_id = std::max(max_id, t.id);
    added.push_back(std::move(t));
  }

  // 4. Per-id tables.
  const std::size_t n = max_id < 0 ? 0 : static_cast<std::size_t>(max_id) + 1;  // max_id <= kMaxTokenId
  impl.token_strings.assign(n, std::string());
  impl.decode_strings.assign(n, std::string());
  impl.kinds.assign(n, Tokenizer::Impl::kNone);
  for (const auto& [tok, id] : impl.vocab) {
    impl.token_strings[id] = tok;
    impl.decode_strings[id] = tok;
    impl.kinds[id] = Tokenizer::Impl::kNormal;
  }
  for (const Added& t : added) {
    if (impl.added.count(t.content) != 0) continue;  // a repeated content keeps its first entry
    impl.token_strings[t.id] = t.content;
    impl.kinds[t.id] = t.special ? Tokenizer::Impl::kSpecial : Tokenizer::Impl::kNormal;
    impl.added.emplace(t.content, t.id);
    if (t.normalized) {
      // As HF: matched, and handed to the decoder, in its normalized form.
      std::string norm = impl.normalizer.apply(t.content);
      impl.decode_strings[t.id] = norm;
      impl.normalized_added.add(norm, t.id, t.flags);
    } else {
      impl.decode_strings[t.id] = t.content;
      impl.raw_added.add(t.content, t.id, t.flags);
    }
  }
  impl.token_raw.assign(n, std::string());
  impl.fallback_byte.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (impl.kinds[i] == Tokenizer::Impl::kNone) continue;
    impl.token_raw[i] = impl.decoder.token_bytes(impl.decode_strings[i]);
    impl.fallback_byte[i] = impl.decoder.is_fallback_byte(impl.decode_strings[i]) ? 1 : 0;
  }
  for (const int id : impl.prefix_ids)
    SSM_CHECK(impl.has(id), "post_processor adds token id {}, which names no token", id);
  for (const int id : impl.suffix_ids)
    SSM_CHECK(impl.has(id), "post_processor adds token id {}, which names no token", id);

  SSM_CHECK(model.contains("merges"), "model has no 'merges'");
  SSM_CHECK(model.at("merges").is_array(), "model.merges must be a list (got {})", json_excerpt(model.at("merges")));
  impl.bpe = std::make_unique<BpeModel>(impl.vocab, parse_merges(model.at("merges")), std::move(options));
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  std::string cls;
  try {
    // transformers' own test: the file's text mentions "ByteLevel" (a missing file fails later with a clear error).
    bool byte_level = false;
    if (path_entry_exists(tokenizer_json)) {
      try {
        byte_level = read_text_file(tokenizer_json, kMaxTokenizerFileBytes).find("\"ByteLevel\"") != std::string::npos;
      } catch (const Error&) {
      }
    }
    cls = transformers_class::of_folder(tokenizer_json.parent_path(), byte_level);
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
    const json tokenizer_config = transformers_class::tokenizer_config_of(tokenizer_json.parent_path());
    if (transformers_class::rebuilds_pipeline(tokenizer_class))
      transformers_class::rebuild_for_class(root, tokenizer_class, tokenizer_config);
    transformers_class::add_special_tokens(root, tokenizer_class, tokenizer_config);
    build(root, *impl);
    impl->tokenizer_class = transformers_class::rebuilds_pipeline(tokenizer_class) ? tokenizer_class : "";
  } catch (const json::exception& e) {
    fail("tokenizer file {}: invalid tokenizer JSON: {}", tokenizer_json.string(), e.what());
  } catch (const Error& e) {
    fail("tokenizer file {}: {}", tokenizer_json.string(), e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_sentencepiece(const std::filesystem::path& model_file) {
  const std::string bytes = read_text_file(model_file, kMaxTokenizerFileBytes);
  auto impl = std::make_shared<Impl>();
  auto spm = std::make_shared<const SentencePieceModel>(bytes, "tokenizer file " + model_file.string());
  const auto n = static_cast<std::size_t>(spm->size());
  impl->token_strings.resize(n);
  impl->token_raw.resize(n);
  impl->kinds.assign(n, Impl::kNormal);
  impl->fallback_byte.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const int id = static_cast<int>(i);
    std::string piece = spm->piece(id);
    if (spm->is_control(id)) impl->kinds[i] = Impl::kSpecial;
    // Mid-text bytes: byte pieces <0xHH> are that byte, U+2581 stands for a space.
    if (spm->is_byte(id) && piece.size() == 6) {
      impl->fallback_byte[i] = 1;  // byte runs decode as a whole: streaming waits for their end
      impl->token_raw[i].assign(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    } else if (!spm->is_control(id)) {
      std::string raw;
      for (std::size_t k = 0; k < piece.size();) {
        if (piece.compare(k, 3, "\xE2\x96\x81") == 0) {
          raw += ' ';
          k += 3;
        } else {
          raw += piece[k++];
        }
      }
      impl->token_raw[i] = std::move(raw);
    }
    impl->vocab.emplace(piece, id);
    impl->token_strings[i] = std::move(piece);
  }
  if (const int bos = spm->bos_id(); bos >= 0 && static_cast<std::size_t>(bos) < n) impl->prefix_ids.push_back(bos);
  impl->spm = std::move(spm);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_tekken(const std::filesystem::path& tekken_json) {
  const std::string text = read_text_file(tekken_json, kMaxTokenizerFileBytes);
  auto impl = std::make_shared<Impl>();
  try {
    check_json_depth(text, "invalid tekken JSON");
    const tekken::Converted c = tekken::convert(json::parse(text));
    build(c.tokenizer_json, *impl);
    // Special tokens take ids [0, n): decoded (kept or skipped) as specials, never matched in text (tiktoken encodes
    // their strings as plain text, as mistral_common does).
    const size_t n = c.specials.size();
    SSM_CHECK(impl->token_strings.size() >= n, "tekken file has no normal tokens");
    for (size_t i = 0; i < n; ++i) {
      impl->token_strings[i] = c.specials[i];
      impl->decode_strings[i] = c.specials[i];
      impl->token_raw[i] = c.specials[i];
      impl->kinds[i] = Impl::kSpecial;
      impl->added.emplace(c.specials[i], static_cast<int>(i));
    }
    impl->prefix_ids.clear();
    if (c.bos_id >= 0) impl->prefix_ids.push_back(c.bos_id);  // mistral_common's encode(text, bos=True)
  } catch (const json::exception& e) {
    fail("tokenizer file {}: invalid tekken JSON: {}", tekken_json.string(), e.what());
  } catch (const Error& e) {
    fail("tokenizer file {}: {}", tekken_json.string(), e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_pretrained(const std::filesystem::path& folder) {
  if (path_entry_exists(folder / "tokenizer.json")) return from_file(folder / "tokenizer.json");
  if (path_entry_exists(folder / "tekken.json")) return from_tekken(folder / "tekken.json");
  for (const char* name : {"tokenizer.model", "tokenizer.model.v3", "tokenizer.model.v1"})
    if (path_entry_exists(folder / name)) return from_sentencepiece(folder / name);
  fail("{}: no tokenizer.json, tekken.json or SentencePiece tokenizer.model", folder.string());
}

}  // namespace ssmserve
