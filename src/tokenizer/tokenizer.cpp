// Owns Tokenizer's encode/decode pipeline and vocabulary queries (loading lives in tokenizer_load.cpp).
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ssmserve {

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 4 + 4 + m.prefix_ids.size() + m.suffix_ids.size());
  if (add_special_tokens) ids.insert(ids.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  if (m.spm) {
    const std::vector<int> body = m.spm->encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
  } else {
    std::vector<TextSegment> raw_segments, norm_segments;
    std::vector<PreToken> words;
    std::vector<std::string_view> views, scratch;
    std::string normalized;
    m.raw_added.split(text, raw_segments);
    for (const TextSegment& seg : raw_segments) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
        continue;
      }
      normalized = m.normalizer.empty() ? std::string(seg.text) : m.normalizer.apply(seg.text);
      norm_segments.clear();
      m.normalized_added.split(normalized, norm_segments);
      for (const TextSegment& piece : norm_segments) {
        if (piece.id >= 0) {
          ids.push_back(piece.id);
          continue;
        }
        if (m.pre_tokenizer.splits_only()) {  // byte-level pipelines: words are views, no copies
          m.pre_tokenizer.run_views(piece.text, views, scratch);
          for (std::string_view w : views) m.bpe->encode_word(w, ids);
          continue;
        }
        words.clear();
        m.pre_tokenizer.run(piece.text, seg.start == 0 && piece.start == 0, words);
        for (const PreToken& w : words) m.bpe->encode_word(w.text, ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  if (m.spm) {
    std::vector<int> kept;
    kept.reserve(ids.size());
    for (int id : ids)
      if (m.has(id) && !(skip_special_tokens && m.kinds[static_cast<std::size_t>(id)] == Impl::kSpecial))
        kept.push_back(id);
    return m.spm->decode(kept);
  }
  if (m.byte_level_decoder) {
    std::string bytes;
    for (int id : ids) {
      if (!m.has(id)) continue;  // out of vocabulary (e.g. embedding padding): nothing, like HF
      const auto i = static_cast<std::size_t>(id);
      if (skip_special_tokens && m.kinds[i] == Impl::kSpecial) continue;
      bytes += m.token_raw[i];
    }
    return utf8::repair(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    if (!m.has(id)) continue;
    const auto i = static_cast<std::size_t>(id);
    if (skip_special_tokens && m.kinds[i] == Impl::kSpecial) continue;
    tokens.push_back(m.decode_strings[i]);
  }
  return m.decoder.decode(std::move(tokens));
}

std::optional<int> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& m = *impl_;
  const std::string key(token);
  if (auto it = m.added.find(key); it != m.added.end()) return it->second;
  if (auto it = m.vocab.find(key); it != m.vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int id) const {
  SSM_CHECK(impl_->has(id), "token id {} is outside the vocabulary (size {})", id, vocab_size());
  return impl_->token_strings[static_cast<std::size_t>(id)];
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->kinds.size()); }

const std::string& Tokenizer::tokenizer_class() const { return impl_->tokenizer_class; }

bool Tokenizer::is_special(int id) const {
  return impl_->has(id) && impl_->kinds[static_cast<std::size_t>(id)] == Impl::kSpecial;
}

std::string Tokenizer::token_bytes(int id) const {
  SSM_CHECK(impl_->has(id), "token id {} is outside the vocabulary (size {})", id, vocab_size());
  return impl_->token_raw[static_cast<std::size_t>(id)];
}

bool Tokenizer::has_id(int id) const { return impl_->has(id); }

}  // namespace ssmserve
