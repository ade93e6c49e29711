// Owns the UTF-8 state machine behind ssmserve::utf8 (validation, maximal-subpart repair, streaming boundaries).
#include "tokenizer/utf8.h"

namespace ssmserve::utf8 {
namespace {

enum class Status { kValid, kInvalid, kTruncated };

struct Step {
  Status status;
  std::size_t len;  // bytes consumed: the character, the maximal subpart, or the truncated tail
};

/// Scans one character starting at bytes[i] (i < size) following Unicode Table 3-7 (well-formed byte sequences).
Step scan(std::string_view bytes, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(bytes[i]);
  if (b0 < 0x80) return {Status::kValid, 1};
  std::size_t need;          // continuation bytes after the lead byte
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Status::kInvalid, 1};
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= bytes.size()) return {Status::kTruncated, k};
    const auto b = static_cast<unsigned char>(bytes[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Status::kInvalid, k};
  }
  return {Status::kValid, need + 1};
}

}  // namespace

bool is_valid(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Step s = scan(bytes, i);
    if (s.status != Status::kValid) return false;
    i += s.len;
  }
  return true;
}

std::string repair(std::string_view bytes) {
  if (is_valid(bytes)) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  for (std::size_t i = 0; i < bytes.size();) {
    const Step s = scan(bytes, i);
    if (s.status == Status::kValid) {
      out.append(bytes.substr(i, s.len));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    i += s.len;
  }
  return out;
}

std::size_t complete_prefix_len(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    const Step s = scan(bytes, i);
    if (s.status == Status::kTruncated) return i;
    i += s.len;
  }
  return bytes.size();
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace ssmserve::utf8
