// Owns the utf8proc NFC call and the PCRE2-compiled GPT-2 split regex (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/unicode_compat.h"

namespace ssmserve {

namespace {

/// NFC of well-formed UTF-8 with utf8proc (lengths passed explicitly, so embedded NULs are kept).
std::string utf8proc_nfc(std::string_view text) {
  if (text.empty()) return {};
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    std::free(dst);
    fail("NFC normalization failed: {}", utf8proc_errmsg(n));
  }
  std::string out(reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n));
  std::free(dst);
  return out;
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  // Fast path: code points below U+0300 are NFC-stable and never compose with a preceding character; only marks and
  // characters from U+0300 on (lead bytes >= 0xCC) can change under NFC.
  bool simple = true;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0xCC) {
      simple = false;
      break;
    }
  }
  if (simple) return std::string(text);
  // Characters HF's NFC does not know act as plain starters there: normalize the runs between them separately.
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
        out += utf8proc_nfc(text.substr(run, i - run));
        out.append(text.substr(i, len));
        run = i + len;
      }
    }
    i += len;
  }
  out += utf8proc_nfc(text.substr(run));
  return out;
}

namespace {

/// The GPT-2 pattern with Oniguruma's Unicode \s spelled out and \p{L}, \p{N} widened to HF's Unicode version.
std::string gpt2_pattern() {
  const std::string ws = R"(\t-\r\x{85}\p{Z})";
  const std::string letter = "\\p{L}" + std::string(unicode_compat::extra_letters());
  const std::string number = "\\p{N}" + std::string(unicode_compat::extra_numbers());
  return "'s|'t|'re|'ve|'m|'ll|'d| ?[" + letter + "]+| ?[" + number + "]+| ?[^" + ws + letter + number + "]+|[" + ws +
         "]+(?![^" + ws + "])|[" + ws + "]+";
}

}  // namespace

struct GptSplitter::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

GptSplitter::GptSplitter() : impl_(std::make_unique<Impl>()) {
  const std::string pattern = gpt2_pattern();
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                              &err, &err_off, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("PCRE2 cannot compile the pre-tokenizer regex at offset {}: {}", err_off, reinterpret_cast<char*>(msg));
  }
  // JIT is an optimization only: when unavailable, pcre2_match interprets the pattern.
  (void)pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

GptSplitter::~GptSplitter() = default;
GptSplitter::GptSplitter(GptSplitter&&) noexcept = default;
GptSplitter& GptSplitter::operator=(GptSplitter&&) noexcept = default;

void GptSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  SSM_CHECK(md != nullptr, "PCRE2 could not allocate match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      fail("PCRE2 match failed with code {}", rc);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0], end = ov[1];
    if (start > pos) out.push_back(text.substr(pos, start - pos));
    if (end == start) {  // cannot happen with this pattern; avoid looping forever
      pos = start;
      break;
    }
    out.push_back(text.substr(start, end - start));
    pos = end;
  }
  if (pos < text.size()) out.push_back(text.substr(pos));
  pcre2_match_data_free(md);
}

}  // namespace ssmserve
