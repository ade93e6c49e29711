// Owns the tokenization of bad_words and the masking of the tokens they ban (see bad_words.h).
#include "engine/bad_words.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "engine/sampling_params.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_props.h"
#include "tokenizer/utf8.h"

namespace ssmserve {
namespace {

/// `s` without its leading whitespace, as Python's str.lstrip(): Unicode White_Space plus U+001C..U+001F (which
/// Python counts as whitespace too). s: well-formed UTF-8.
std::string_view lstrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 1;
    const char32_t cp = unicode_props::decode_at(s, i, len);
    if (!unicode_props::is_whitespace(cp) && !(cp >= 0x1C && cp <= 0x1F)) break;
    i += len;
  }
  return s.substr(i);
}

}  // namespace

std::vector<std::vector<int>> tokenize_bad_words(std::span<const std::string> words, const Tokenizer& tokenizer,
                                                 int vocab_size) {
  SSM_CHECK(words.size() <= static_cast<size_t>(kMaxBadWords), "SamplingParams.bad_words has {} words; at most {}",
            words.size(), kMaxBadWords);
  std::vector<std::vector<int>> out;
  size_t total = 0;
  auto keep = [&](std::vector<int> ids, size_t i) {
    if (std::find(out.begin(), out.end(), ids) != out.end()) return;
    for (const int t : ids)
      SSM_CHECK(t >= 0 && t < vocab_size, "SamplingParams.bad_words[{}] tokenizes to id {}, outside the vocabulary [0, {})",
                i, t, vocab_size);
    total += ids.size();
    out.push_back(std::move(ids));
    SSM_CHECK(out.size() <= static_cast<size_t>(kMaxBadWords),
              "SamplingParams.bad_words: too many token sequences after tokenization ({} words as given and with a "
              "leading space); at most {}", out.size(), kMaxBadWords);
    SSM_CHECK(total <= static_cast<size_t>(kMaxBadWordsTotalTokens),
              "SamplingParams.bad_words: {} tokens after tokenization (as given and with a leading space); at most {}",
              total, kMaxBadWordsTotalTokens);
  };
  for (size_t i = 0; i < words.size(); ++i) {
    SSM_CHECK(words[i].size() <= kMaxBadWordBytes, "SamplingParams.bad_words[{}] is {} bytes long; at most {}", i,
              words[i].size(), kMaxBadWordBytes);
    const std::string repaired = utf8::repair(words[i]), word(lstrip(repaired));
    std::vector<int> plain = tokenizer.encode(word, /*add_special_tokens=*/false);
    SSM_CHECK(!plain.empty(), "SamplingParams.bad_words[{}] must tokenize to at least one token (got \"{}\")", i,
              repaired);
    std::vector<int> spaced = tokenizer.encode(" " + word, /*add_special_tokens=*/false);
    // The spaced variant only when it is a different word of the same length (vLLM's rule).
    const bool spaced_differs = !spaced.empty() && spaced.front() != plain.front() && spaced.size() == plain.size();
    keep(std::move(plain), i);
    if (spaced_differs) keep(std::move(spaced), i);
  }
  return out;
}

void apply_bad_words(std::span<float> logits, std::span<const std::vector<int>> sequences,
                     std::span<const int> output_ids) {
  const int vocab = static_cast<int>(logits.size());
  for_each_banned_token(sequences, output_ids, [&](int id) {
    SSM_CHECK(id >= 0 && id < vocab, "sampler: bad_words token id {} is outside the vocabulary [0, {})", id, vocab);
    logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  });
}

}  // namespace ssmserve
