// Owns the Unicode-version adjustments that make utf8proc/PCRE2 (Debian 12: Unicode 13/14) agree with HF tokenizers' own tables.
#pragma once
#include <string_view>

namespace ssmserve::unicode_compat {

/// True for code points that HF's NFC (crate unicode-normalization-alignments, Unicode 9 tables) does not know but
/// utf8proc 2.6 (Unicode 13) normalizes: combining marks of Unicode 10..13 (reordered by utf8proc, left in place by
/// HF), first parts of their new compositions, and U+11A7 (utf8proc wrongly composes LV + U+11A7). HF treats them as
/// plain starters, so NFC of a text equals NFC of the pieces between them with them copied unchanged.
/// Derived by comparing HF and utf8proc on every code point in probes (tests/unit/test_tokenizer_unicode.cpp
/// re-checks all of them against HF's answers stored in tests/data/tokenizer/nfc_probes.txt).
bool hf_nfc_unknown(char32_t cp);

/// PCRE2 class items (e.g. `\x{1C89}-\x{1C8A}...`) for letters / numbers of Unicode 15 and 16 that PCRE2 10.42
/// (Unicode 14) reports as unassigned, while HF's Oniguruma (Unicode 16) classifies them \p{L} / \p{N}. Derived by
/// classifying every code point with HF's ByteLevel pre-tokenizer (re-checked by test_tokenizer_unicode.cpp).
std::string_view extra_letters();
std::string_view extra_numbers();

/// PCRE2 class items for combining marks (\p{M}) of Unicode 15 and 16 that PCRE2 10.42 reports as unassigned, while
/// Oniguruma classifies them \p{M} (Qwen3.5's pattern uses [\p{L}\p{M}]). Derived by comparing every code point under
/// `tokenizers`' Split(Regex(r"\p{M}")) with PCRE2's \p{M} (re-checked by test_tokenizer_qwen.cpp against
/// tests/data/tokenizer/onig_classes.txt).
std::string_view extra_marks();

}  // namespace ssmserve::unicode_compat
