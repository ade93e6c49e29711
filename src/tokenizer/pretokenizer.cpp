// Owns the utf8proc NFC call, the Oniguruma-to-PCRE2 regex translation and the PCRE2 splitters (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/unicode_compat.h"

namespace ssmserve {

namespace {

/// `form` of well-formed UTF-8 with utf8proc (lengths passed explicitly, so embedded NULs are kept).
std::string utf8proc_normalize(std::string_view text, NormalForm form) {
  if (text.empty()) return {};
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &dst, static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    std::free(dst);
    fail("Unicode normalization failed: {}", utf8proc_errmsg(n));
  }
  std::string out(reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n));
  std::free(dst);
  return out;
}

}  // namespace

std::string unicode_normalize(std::string_view text, NormalForm form) {
  // Fast path: ASCII is stable under every form; code points below U+0300 are also NFC-stable and never compose with
  // a preceding character (only marks and characters from U+0300 on, lead bytes >= 0xCC, can change under NFC).
  const unsigned char limit = form == NormalForm::kNFC ? 0xCC : 0x80;
  bool simple = true;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= limit) {
      simple = false;
      break;
    }
  }
  if (simple) return std::string(text);
  // Characters HF's normalizer does not know act as plain starters there: normalize the runs between them separately.
  std::string out;
  out.reserve(text.size());
  std::size_t run = 0;
  for (std::size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    const std::size_t len = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
    if (b0 >= 0xCC) {
      char32_t cp = len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
      for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
      if (unicode_compat::hf_nfc_unknown(cp)) {
        out += utf8proc_normalize(text.substr(run, i - run), form);
        out.append(text.substr(i, len));
        run = i + len;
      }
    }
    i += len;
  }
  out += utf8proc_normalize(text.substr(run), form);
  return out;
}

std::string nfc_normalize(std::string_view text) { return unicode_normalize(text, NormalForm::kNFC); }

namespace {

/// Oniguruma's Unicode `\s` as PCRE2 class items (without brackets).
constexpr std::string_view kOnigSpace = R"(\t-\r\x{85}\p{Z})";

/// PCRE2 class items for \p{L}, \p{N} or \p{M} widened to Oniguruma's Unicode version (see unicode_compat.h).
std::string widened_property(char property) {
  switch (property) {
    case 'L': return "\\p{L}" + std::string(unicode_compat::extra_letters());
    case 'N': return "\\p{N}" + std::string(unicode_compat::extra_numbers());
    default: return "\\p{M}" + std::string(unicode_compat::extra_marks());
  }
}

/// Compiles a PCRE2 pattern (UTF, UCP) and JIT-compiles it when possible. Throws Error naming the offset on failure.
pcre2_code* compile_pcre2(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("PCRE2 cannot compile the pre-tokenizer regex at offset {}: {}", err_off, reinterpret_cast<char*>(msg));
  }
  // JIT is an optimization only: when unavailable, pcre2_match interprets the pattern.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  const std::string ws(kOnigSpace);
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  std::size_t class_body = 0;  // index of the first character inside the current class (after '[' or '[^')
  for (std::size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      SSM_CHECK(i + 1 < p.size(), "pre-tokenizer regex ends with a lone backslash");
      const char e = p[i + 1];
      if (e == 's') {
        out += in_class ? ws : "[" + ws + "]";
        i += 2;
        continue;
      }
      if (e == 'S') {
        SSM_CHECK(!in_class, "unsupported \\S inside a character class in pre-tokenizer regex '{}'", p);
        out += "[^" + ws + "]";
        i += 2;
        continue;
      }
      SSM_CHECK(e != 'h' && e != 'H', "unsupported \\{} (Oniguruma hex-digit class) in pre-tokenizer regex '{}'", e, p);
      if ((e == 'p' || e == 'P') && i + 4 < p.size() && p[i + 2] == '{' && p[i + 4] == '}' &&
          (p[i + 3] == 'L' || p[i + 3] == 'N' || p[i + 3] == 'M')) {
        const std::string items = widened_property(p[i + 3]);
        if (e == 'p') {
          out += in_class ? items : "[" + items + "]";
        } else {
          SSM_CHECK(!in_class, "unsupported \\P{{{}}} inside a character class in pre-tokenizer regex '{}'", p[i + 3], p);
          out += "[^" + items + "]";
        }
        i += 5;
        continue;
      }
      out.append(p.substr(i, 2));  // any other escape means the same in both engines (\r, \n, \x{..}, \p{Lu}, ...)
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[') {
        SSM_CHECK(i + 1 < p.size() && p[i + 1] == ':', "unsupported nested character class in pre-tokenizer regex '{}'", p);
        const std::size_t close = p.find(":]", i + 2);
        SSM_CHECK(close != std::string_view::npos, "unterminated POSIX class in pre-tokenizer regex '{}'", p);
        out.append(p.substr(i, close + 2 - i));
        i = close + 2;
        continue;
      }
      if (c == ']' && i > class_body) in_class = false;  // a ']' right after '[' or '[^' is a literal
      out += c;
      ++i;
      continue;
    }
    out += c;
    ++i;
    if (c == '[') {
      in_class = true;
      if (i < p.size() && p[i] == '^') out += p[i++];
      class_body = i;
    }
  }
  SSM_CHECK(!in_class, "unterminated character class in pre-tokenizer regex '{}'", p);
  return out;
}

std::string_view gpt2_split_pattern() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(PcreTag, const std::string& pcre2_pattern) : impl_(std::make_unique<Impl>()) {
  impl_->code = compile_pcre2(pcre2_pattern);
}

RegexSplitter::RegexSplitter(std::string_view onig_pattern) : RegexSplitter(PcreTag{}, onig_to_pcre2(onig_pattern)) {}

RegexSplitter RegexSplitter::literal(std::string_view literal) {
  std::string pattern;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) pattern += '\\';  // PCRE2 allows escaping any ASCII non-alphanumeric
    pattern += c;
  }
  return RegexSplitter(PcreTag{}, pattern);
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

namespace {
/// A match that PCRE2 gave up on (e.g. its match limit on a catastrophically backtracking pattern): an Error naming
/// the tokenizer's regex and PCRE2's reason.
[[noreturn]] void match_failed(int rc) {
  PCRE2_UCHAR reason[256];
  if (pcre2_get_error_message(rc, reason, sizeof(reason)) < 0) reason[0] = 0;
  fail("the tokenizer's regex (a tokenizer.json pre_tokenizer / normalizer pattern) failed on this text: PCRE2 error "
       "{} ({})", rc, reinterpret_cast<const char*>(reason));
}
}  // namespace

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  SSM_CHECK(md != nullptr, "PCRE2 could not allocate match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;   // where the next search starts
  std::size_t prev = 0;  // end of the text already emitted
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      match_failed(rc);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0], end = ov[1];
    if (start > prev) out.push_back(text.substr(prev, start - prev));
    if (end > start) {
      out.push_back(text.substr(start, end - start));
      pos = end;
    } else {  // an empty match emits nothing; search again from the next code point (as Oniguruma's find_iter)
      const auto b0 = static_cast<unsigned char>(text[start < text.size() ? start : text.size() - 1]);
      pos = start + (b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4);
    }
    prev = std::max(prev, start == end ? start : end);
  }
  if (prev < text.size()) out.push_back(text.substr(prev));
  pcre2_match_data_free(md);
}

void RegexSplitter::find_matches(std::string_view text, std::vector<PatternPiece>& out) const {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  SSM_CHECK(md != nullptr, "PCRE2 could not allocate match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t last_end = 0;   // where the next search starts
  std::size_t prev = 0;       // end of the pieces already emitted
  bool matched = false;       // a match was found before (last_match_end is valid)
  std::size_t last_match_end = 0;
  while (last_end <= text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), last_end, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      match_failed(rc);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0], end = ov[1];
    if (start == end && matched && last_match_end == end) {  // no empty match right after the previous match
      last_end += last_end < text.size() ? (static_cast<unsigned char>(text[last_end]) < 0x80   ? 1
                                            : static_cast<unsigned char>(text[last_end]) < 0xE0 ? 2
                                            : static_cast<unsigned char>(text[last_end]) < 0xF0 ? 3
                                                                                                : 4)
                                         : 1;
      continue;
    }
    last_end = end;
    matched = true;
    last_match_end = end;
    if (prev != start) out.push_back({prev, start, false});
    out.push_back({start, end, true});
    prev = end;
  }
  pcre2_match_data_free(md);
  if (prev != text.size()) out.push_back({prev, text.size(), false});
}

}  // namespace ssmserve
