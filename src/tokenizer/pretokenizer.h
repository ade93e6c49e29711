// Owns text preparation before BPE: the NFC normalizer (utf8proc) and the regex splitters of the Split / ByteLevel pre-tokenizers (PCRE2).
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

/// The Unicode normalization forms of HF's NFC / NFD / NFKC / NFKD normalizers.
enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

/// `form` of well-formed UTF-8, computed as nfc_normalize does (utf8proc, with the characters HF's tables do not know
/// kept as plain starters). Throws Error if utf8proc fails.
std::string unicode_normalize(std::string_view text, NormalForm form);

/// Translates a regex written for Oniguruma (the engine HF `tokenizers` runs Split and ByteLevel patterns with) into
/// an equivalent PCRE2 pattern: `\s` / `\S` become Oniguruma's Unicode whitespace class (U+0009..U+000D, U+0085 and
/// \p{Z}; PCRE2's UCP `\s` adds U+180E), and `\p{L}`, `\p{N}`, `\p{M}` (`\P{..}` outside classes) are widened with
/// the Unicode 15/16 code points PCRE2 10.42 does not know (unicode_compat). Everything else passes through.
/// Throws Error for constructs it cannot translate faithfully: `\S` or `\P{L|N|M}` inside a character class, and
/// nested character classes.
std::string onig_to_pcre2(std::string_view onig_pattern);

/// The GPT-2 split regex of HF's ByteLevel pre-tokenizer (use_regex=true), in Oniguruma syntax:
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::string_view gpt2_split_pattern();

/// One piece of a pattern search over a text (HF's Pattern::find_matches): bytes [start, end) and whether they are a
/// match or a gap between matches.
struct PatternPiece {
  std::size_t start;
  std::size_t end;
  bool is_match;
};

/// A `tokenizers` Split pre-tokenizer with behavior Isolated and invert=false: every regex match becomes a pre-token,
/// and so does every non-empty gap between matches. Empty matches produce no piece (they only cut a gap, as in
/// `tokenizers`). The pattern is an Oniguruma regex (translated by onig_to_pcre2) or a literal string; compiled with
/// PCRE2_UTF|PCRE2_UCP, JIT if available. Thread-safe: split() allocates its own match data.
class RegexSplitter {
 public:
  /// Compiles an Oniguruma-syntax regex. Throws Error if it cannot be translated or PCRE2 cannot compile it.
  explicit RegexSplitter(std::string_view onig_pattern);
  /// Matches `literal` verbatim (tokenizer.json `"pattern": {"String": ...}`).
  static RegexSplitter literal(std::string_view literal);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  /// Appends the pre-tokens of `text` (well-formed UTF-8) to `out`, in order, covering all of `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  /// HF's `Pattern::find_matches` for this regex, run as the `onig` crate's find_iter runs it: the matches and the
  /// gaps between them in order, covering all of `text` (an empty match is an empty piece, except right after the
  /// previous match; an empty `text` gives one empty gap). Appends to `out`.
  void find_matches(std::string_view text, std::vector<PatternPiece>& out) const;

 private:
  struct Impl;
  struct PcreTag {};
  RegexSplitter(PcreTag, const std::string& pcre2_pattern);
  std::unique_ptr<Impl> impl_;
};

/// The GPT-2 splitter of HF's ByteLevel pre-tokenizer (use_regex=true): RegexSplitter(gpt2_split_pattern()).
class GptSplitter : public RegexSplitter {
 public:
  /// Throws Error if PCRE2 cannot compile the pattern.
  GptSplitter() : RegexSplitter(gpt2_split_pattern()) {}
};

}  // namespace ssmserve
