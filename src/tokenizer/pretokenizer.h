// Owns text preparation before BPE: the NFC normalizer (utf8proc) and the GPT-2 split regex of the ByteLevel pre-tokenizer (PCRE2).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve {

/// NFC normalization of well-formed UTF-8 as HF's `normalizers::NFC` computes it: utf8proc (UTF8PROC_STABLE |
/// UTF8PROC_COMPOSE), except that characters HF's older tables do not know are kept as plain starters (see
/// unicode_compat::hf_nfc_unknown). Embedded NULs are kept. Throws Error if utf8proc fails (only on out-of-memory:
/// input is already well-formed).
std::string nfc_normalize(std::string_view text);

/// Splits text into pre-tokens with the GPT-2 regex used by HF's ByteLevel pre-tokenizer (use_regex=true):
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// HF runs it with Oniguruma, whose Unicode `\s` is U+0009..U+000D, U+0085 and \p{Z}; PCRE2's UCP `\s` differs
/// (it adds U+180E), so `\s` is spelled out as that class; \p{L} and \p{N} are widened with the letters and numbers
/// of Unicode 15/16 that PCRE2 10.42 does not know (unicode_compat). Compiled with PCRE2_UTF|PCRE2_UCP, JIT if available.
/// Thread-safe: split() allocates its own match data.
class GptSplitter {
 public:
  /// Throws Error if PCRE2 cannot compile the pattern.
  GptSplitter();
  ~GptSplitter();
  GptSplitter(GptSplitter&&) noexcept;
  GptSplitter& operator=(GptSplitter&&) noexcept;

  /// Appends the pre-tokens of `text` (well-formed UTF-8) to `out`, in order, covering all of `text`
  /// (unmatched gaps, which this pattern cannot leave, would be kept as pieces like HF's Isolated split).
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ssmserve
