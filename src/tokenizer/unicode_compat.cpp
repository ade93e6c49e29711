// Owns the code point tables behind unicode_compat.h (see there for how they were derived and are tested).
#include "tokenizer/unicode_compat.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace ssmserve::unicode_compat {
namespace {

struct Range {
  char32_t lo, hi;
};

constexpr std::array<Range, 38> kNfcUnknown = {{
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},     {0xC3C, 0xC3C},
    {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x11A7, 0x11A7},   {0x1715, 0x1715},   {0x1ABF, 0x1ACE},
    {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E},
    {0x11839, 0x1183A}, {0x11935, 0x11935}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0},
    {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
    {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
}};

}  // namespace

bool hf_nfc_unknown(char32_t cp) {
  auto it = std::upper_bound(kNfcUnknown.begin(), kNfcUnknown.end(), cp,
                             [](char32_t c, const Range& r) { return c < r.lo; });
  return it != kNfcUnknown.begin() && cp <= std::prev(it)->hi;
}

std::string_view extra_letters() {
  return R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65})"
         R"(\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B}\x{1138E})"
         R"(\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10})"
         R"(\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D})"
         R"(\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D})"
         R"(\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
}

std::string_view extra_numbers() {
  return R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59}\x{16130}-\x{16139})"
         R"(\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";
}

std::string_view extra_marks() {
  return R"(\x{897}\x{CF3}\x{ECE}\x{10D69}-\x{10D6D}\x{10EFC}-\x{10EFF}\x{11241}\x{113B8}-\x{113C0}\x{113C2}\x{113C5})"
         R"(\x{113C7}-\x{113CA}\x{113CC}-\x{113D0}\x{113D2}\x{113E1}-\x{113E2}\x{11F00}-\x{11F01}\x{11F03})"
         R"(\x{11F34}-\x{11F3A}\x{11F3E}-\x{11F42}\x{11F5A}\x{13440}\x{13447}-\x{13455}\x{1611E}-\x{1612F}\x{1E08F})"
         R"(\x{1E4EC}-\x{1E4EF}\x{1E5EE}-\x{1E5EF})";
}

}  // namespace ssmserve::unicode_compat
