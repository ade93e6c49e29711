// Owns the per-code-point Unicode predicates the tokenizer.json components use (Rust's char methods, as HF
// tokenizers calls them), answered from utf8proc's tables.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace ssmserve::unicode_props {

/// Decodes the code point at text[i] (well-formed UTF-8, i < size) and its length in bytes.
char32_t decode_at(std::string_view text, std::size_t i, std::size_t& len);

/// Byte length of the UTF-8 character whose lead byte is `lead` (1 for stray continuation bytes).
inline std::size_t char_len(unsigned char lead) { return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

/// Rust `char::is_whitespace` (the White_Space property).
bool is_whitespace(char32_t cp);

/// Rust `char::is_numeric` (general categories Nd, Nl, No).
bool is_numeric(char32_t cp);

/// HF tokenizers' punctuation test: ASCII punctuation or a general category P*.
bool is_punctuation(char32_t cp);

/// Rust regex's Unicode `\w` (alphabetic, marks, decimal digits, connector punctuation, joiners), as HF's added-token
/// single_word check uses it.
bool is_word(char32_t cp);

/// Rust `char::to_lowercase` of `cp` appended to `out` (full mapping: U+0130 becomes "i\u0307").
void append_lowercase(std::string& out, char32_t cp);

}  // namespace ssmserve::unicode_props
