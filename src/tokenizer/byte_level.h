// Owns the GPT-2 byte-level alphabet: the reversible map between raw bytes and the printable characters BPE vocabularies use.
#pragma once
#include <string>
#include <string_view>

namespace ssmserve::byte_level {

/// Code point that stands for raw byte `b` in a byte-level vocabulary (GPT-2 `bytes_to_unicode()`: printable
/// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order).
char32_t byte_to_char(unsigned char b);

/// UTF-8 string of byte_to_char(b) (the vocabulary entry of the single byte b).
std::string byte_to_string(unsigned char b);

/// Raw bytes a vocabulary string stands for, as Hugging Face tokenizers' ByteLevel decoder computes them:
/// every character is mapped back through the byte-level alphabet; when any character is outside the alphabet
/// (e.g. added tokens made of plain spaces) the token's own UTF-8 bytes are used unchanged. Never throws.
std::string token_string_to_bytes(std::string_view token);

}  // namespace ssmserve::byte_level
