// Owns IncrementalDetokenizer: streaming decode that only emits complete UTF-8 characters.
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int id) {
  if (!tok_.has_id(id)) return {};  // out of vocabulary: nothing, like Tokenizer::decode
  if (skip_special_ && tok_.is_special(id)) return {};
  const Tokenizer::Impl& m = *tok_.impl_;
  if (m.byte_level_decoder && !m.spm) {
    pending_ += m.token_raw[static_cast<std::size_t>(id)];
    const std::size_t n = utf8::complete_prefix_len(pending_);
    if (n == 0) return {};
    std::string out = utf8::repair(std::string_view(pending_).substr(0, n));
    pending_.erase(0, n);
    text_ += out;
    return out;
  }
  // As tokenizers' DecodeStream::step: emit decode(window) past decode(window's prefix) unless it ends in U+FFFD;
  // the last emitted ids stay in the window as context for the decoder's first-token rules.
  window_.push_back(id);
  // A run of ByteFallback tokens decodes as a whole (a later byte can turn earlier ones into U+FFFD): wait for its end.
  if (static_cast<std::size_t>(id) < m.fallback_byte.size() && m.fallback_byte[static_cast<std::size_t>(id)] != 0)
    return {};
  const std::string full = tok_.decode(window_);
  if (full.size() <= prefix_.size() || ends_with_replacement(full) || full.compare(0, prefix_.size(), prefix_) != 0)
    return {};
  std::string out = full.substr(prefix_.size());
  // The new context is the ids after the old prefix, unless they decode to nothing (e.g. SentencePiece strips every
  // leading space piece): a context without text would let the decoder's start-of-text rules eat later text.
  const std::vector<int> rest(window_.begin() + static_cast<std::ptrdiff_t>(prefix_index_), window_.end());
  std::string rest_text = tok_.decode(rest);
  if (!rest_text.empty()) {
    window_ = rest;
    prefix_ = std::move(rest_text);
  } else {
    prefix_ = full;
  }
  prefix_index_ = window_.size();
  text_ += out;
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  if (!window_.empty()) {
    const std::string full = tok_.decode(window_);
    if (full.size() > prefix_.size() && full.compare(0, prefix_.size(), prefix_) == 0) out = full.substr(prefix_.size());
    window_.clear();
    prefix_.clear();
    prefix_index_ = 0;
  }
  out += utf8::repair(pending_);
  pending_.clear();
  text_ += out;
  return out;
}

}  // namespace ssmserve
