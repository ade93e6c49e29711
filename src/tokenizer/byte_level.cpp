// Owns the tables behind ssmserve::byte_level (GPT-2 bytes_to_unicode and its inverse).
#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace ssmserve::byte_level {
namespace {

constexpr char32_t kMaxMapped = 0x100 + 68;  // highest code point the alphabet uses, plus one

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, kMaxMapped> to_byte{};  // -1: not in the alphabet

  Tables() {
    to_byte.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(unsigned char b) { return tables().to_char[b]; }

std::string byte_to_string(unsigned char b) {
  std::string s;
  utf8::append_code_point(s, byte_to_char(b));
  return s;
}

std::string token_string_to_bytes(std::string_view token) {
  const Tables& t = tables();
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    // Decode one (well-formed: tokens come from parsed JSON) UTF-8 character.
    const auto b0 = static_cast<unsigned char>(token[i]);
    char32_t cp;
    std::size_t len;
    if (b0 < 0x80) {
      cp = b0, len = 1;
    } else if (b0 < 0xE0) {
      cp = b0 & 0x1F, len = 2;
    } else if (b0 < 0xF0) {
      cp = b0 & 0x0F, len = 3;
    } else {
      cp = b0 & 0x07, len = 4;
    }
    if (i + len > token.size()) return std::string(token);
    for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
    if (cp >= kMaxMapped || t.to_byte[cp] < 0) return std::string(token);
    out.push_back(static_cast<char>(t.to_byte[cp]));
    i += len;
  }
  return out;
}

}  // namespace ssmserve::byte_level
