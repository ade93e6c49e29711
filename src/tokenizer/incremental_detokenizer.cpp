// Owns IncrementalDetokenizer: streaming decode that only emits complete UTF-8 characters.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace ssmserve {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int id) {
  if (!tok_.has_id(id)) return {};  // out of vocabulary: nothing, like Tokenizer::decode
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  const std::size_t n = utf8::complete_prefix_len(pending_);
  if (n == 0) return {};
  std::string out = utf8::repair(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8::repair(pending_);
  pending_.clear();
  text_ += out;
  return out;
}

}  // namespace ssmserve
