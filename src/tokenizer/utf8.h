// Owns ssmserve's UTF-8 helpers for the tokenizer: validation, repair of ill-formed bytes, and streaming boundaries.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace ssmserve::utf8 {

/// True when `bytes` is well-formed UTF-8 (Unicode 15, Table 3-7: no overlongs, surrogates or values > U+10FFFF).
bool is_valid(std::string_view bytes);

/// Returns `bytes` with every ill-formed subsequence replaced by U+FFFD, one per "maximal subpart"
/// (Unicode §3.9 "U+FFFD Substitution of Maximal Subparts"). This is exactly what Python's
/// `bytes.decode('utf-8', errors='replace')` and Rust's `String::from_utf8_lossy` (used by Hugging Face
/// tokenizers' ByteLevel decoder) produce. Never throws; valid input is returned unchanged.
std::string repair(std::string_view bytes);

/// Length of the longest prefix of `bytes` that can be decoded now: what follows it is empty or the start of a
/// character that is still incomplete but could become valid with more bytes (at most 3 bytes). Repairing the prefix
/// now and the rest later gives the same text as repairing everything at once.
std::size_t complete_prefix_len(std::string_view bytes);

/// Appends the UTF-8 encoding of code point `cp` (caller guarantees cp <= 0x10FFFF and not a surrogate).
void append_code_point(std::string& out, char32_t cp);

}  // namespace ssmserve::utf8
