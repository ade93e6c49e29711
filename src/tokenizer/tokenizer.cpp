// Owns Tokenizer's encode/decode pipeline and vocabulary queries (loading lives in tokenizer_load.cpp).
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ssmserve {

std::vector<int> Tokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 4 + 4);
  std::vector<TextSegment> raw_segments, norm_segments;
  std::vector<std::string_view> words, scratch;
  std::string normalized;
  m.raw_added.split(text, raw_segments);
  for (const TextSegment& seg : raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    normalized = m.nfc ? nfc_normalize(seg.text) : std::string(seg.text);
    norm_segments.clear();
    m.normalized_added.split(normalized, norm_segments);
    for (const TextSegment& piece : norm_segments) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      m.pre_tokenize(piece.text, words, scratch);
      for (std::string_view w : words) m.bpe->encode_word(w, ids);
    }
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (int id : ids) {
    if (!m.has(id)) continue;  // out of vocabulary (e.g. embedding padding): nothing, like HF
    const auto i = static_cast<std::size_t>(id);
    if (skip_special_tokens && m.kinds[i] == Impl::kSpecial) continue;
    bytes += m.token_raw[i];
  }
  return utf8::repair(bytes);
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

bool Tokenizer::is_special(int id) const {
  return impl_->has(id) && impl_->kinds[static_cast<std::size_t>(id)] == Impl::kSpecial;
}

std::string Tokenizer::token_bytes(int id) const {
  SSM_CHECK(impl_->has(id), "token id {} is outside the vocabulary (size {})", id, vocab_size());
  return impl_->token_raw[static_cast<std::size_t>(id)];
}

bool Tokenizer::has_id(int id) const { return impl_->has(id); }

}  // namespace ssmserve
