// Owns the decoder steps of decoder.h, each mirroring its HF `tokenizers` decode_chain (decoders/*.rs).
#include "tokenizer/decoder.h"

#include <algorithm>
#include <cstdint>

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_props.h"
#include "tokenizer/utf8.h"

namespace ssmserve {

using nlohmann::json;

struct Decoder::Step {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string replacement;  // Metaspace: the replacement character; Replace: the content
  bool prepend = true;      // Metaspace: prepend_scheme is not "never"
  std::shared_ptr<RegexSplitter> pattern;  // Replace
  std::string strip_char;   // Strip: the character (UTF-8)
  std::size_t start = 0, stop = 0;  // Strip
};

namespace {

/// 0..255 when `t` is a ByteFallback token `<0xHH>` (HH: two hex digits, either case), else -1.
int byte_fallback_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (t[3] == '+' && lo >= 0) return lo;  // Rust's u8::from_str_radix accepts a leading '+'
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string one_char(const json& j, const char* key, const char* def, const char* component) {
  const json& v = j.value(key, json(def));
  SSM_CHECK(v.is_string(), "decoder {} field '{}' must be a string (got {})", component, key, json_excerpt(v));
  const std::string s = v.get<std::string>();
  std::size_t len = 0;
  SSM_CHECK(!s.empty() && utf8::is_valid(s) && (unicode_props::decode_at(s, 0, len), len) == s.size(),
            "decoder {} field '{}' must be one character (got {})", component, key, json_excerpt(v));
  return s;
}

std::size_t count_field(const json& j, const char* key) {
  const json& v = j.value(key, json(0));
  SSM_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0),
            "decoder Strip field '{}' must be a non-negative integer (got {})", key, json_excerpt(v));
  return static_cast<std::size_t>(std::min<std::uint64_t>(v.get<std::uint64_t>(), 1u << 20));
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

/// Strip's per-token cut: up to `start` leading and `stop` trailing copies of `c` (HF counts characters).
std::string strip_token(const std::string& t, const std::string& c, std::size_t start, std::size_t stop) {
  std::size_t b = 0, e = t.size();
  for (std::size_t k = 0; k < start && b < e && t.compare(b, c.size(), c) == 0; ++k) b += c.size();
  for (std::size_t k = 0; k < stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k) e -= c.size();
  return t.substr(b, e - b);
}

}  // namespace

void Decoder::parse_into(const json& j, std::vector<std::shared_ptr<const Step>>& steps, int depth) {
  SSM_CHECK(depth < 16, "decoder Sequences nested too deeply");
  SSM_CHECK(j.is_object() && j.contains("type") && j.at("type").is_string(),
            "decoder must be an object with a 'type' (got {})", json_excerpt(j));
  const std::string t = j.at("type").get<std::string>();
  if (t == "Sequence") {
    const json& list = j.value("decoders", json());
    SSM_CHECK(list.is_array(), "decoder Sequence needs a 'decoders' list (got {})", json_excerpt(list));
    for (const json& d : list) parse_into(d, steps, depth + 1);
    return;
  }
  auto step = std::make_shared<Step>();
  if (t == "ByteLevel") {
    step->kind = Step::kByteLevel;
  } else if (t == "Metaspace") {
    step->kind = Step::kMetaspace;
    step->replacement = one_char(j, "replacement", "\xE2\x96\x81", "Metaspace");
    const bool legacy_prefix = !j.contains("add_prefix_space") || !j.at("add_prefix_space").is_boolean() ||
                               j.at("add_prefix_space").get<bool>();
    const json& scheme = j.value("prepend_scheme", json(legacy_prefix ? "always" : "never"));
    SSM_CHECK(scheme.is_string() && (scheme == "always" || scheme == "first" || scheme == "never"),
              "unsupported decoder Metaspace prepend_scheme {}", json_excerpt(scheme));
    step->prepend = scheme != "never";
  } else if (t == "Replace") {
    step->kind = Step::kReplace;
    step->pattern = parse_pattern(j.value("pattern", json()), "decoder Replace");
    const json& c = j.value("content", json());
    SSM_CHECK(c.is_string(), "decoder Replace needs a string 'content' (got {})", json_excerpt(c));
    step->replacement = c.get<std::string>();
  } else if (t == "ByteFallback") {
    step->kind = Step::kByteFallback;
  } else if (t == "Fuse") {
    step->kind = Step::kFuse;
  } else if (t == "Strip") {
    step->kind = Step::kStrip;
    step->strip_char = one_char(j, "content", " ", "Strip");
    step->start = count_field(j, "start");
    step->stop = count_field(j, "stop");
  } else {
    fail("unsupported decoder '{}' (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)", t);
  }
  steps.push_back(std::move(step));
}

Decoder Decoder::from_json(const json& j) {
  Decoder d;
  if (j.is_null()) {
    d.join_with_spaces_ = true;
    return d;
  }
  parse_into(j, d.steps_, 0);
  return d;
}

bool Decoder::has_byte_fallback() const {
  for (const auto& st : steps_)
    if (st->kind == Step::kByteFallback) return true;
  return false;
}

bool Decoder::is_fallback_byte(const std::string& token) const {
  return has_byte_fallback() && byte_fallback_value(token) >= 0;
}

bool Decoder::is_byte_level() const { return steps_.size() == 1 && steps_[0]->kind == Step::kByteLevel; }

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (join_with_spaces_) {
    std::string out;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  std::vector<std::string> next;
  std::vector<PatternPiece> pieces;
  for (const auto& sp : steps_) {
    const Step& st = *sp;
    switch (st.kind) {
      case Step::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) bytes += byte_level::token_string_to_bytes(t);
        tokens.assign(1, utf8::repair(bytes));
        break;
      }
      case Step::kMetaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = replace_all(tokens[i], st.replacement, i == 0 && st.prepend ? "" : " ");
        }
        break;
      case Step::kReplace:
        for (std::string& t : tokens) {
          pieces.clear();
          st.pattern->find_matches(t, pieces);
          std::string out;
          for (const PatternPiece& p : pieces) out += p.is_match ? st.replacement : t.substr(p.start, p.end - p.start);
          t = std::move(out);
        }
        break;
      case Step::kByteFallback: {
        next.clear();
        std::string run;  // bytes of consecutive <0xHH> tokens
        auto flush = [&]() {
          if (run.empty()) return;
          if (utf8::is_valid(run)) {
            next.push_back(run);
          } else {
            for (std::size_t k = 0; k < run.size(); ++k) next.emplace_back("\xEF\xBF\xBD");
          }
          run.clear();
        };
        for (std::string& t : tokens) {
          if (const int b = byte_fallback_value(t); b >= 0) {
            run += static_cast<char>(b);
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(next);
        break;
      }
      case Step::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case Step::kStrip:
        for (std::string& t : tokens) t = strip_token(t, st.strip_char, st.start, st.stop);
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Decoder::token_bytes(const std::string& token) const {
  if (join_with_spaces_) return token;
  std::string t = token;
  std::vector<PatternPiece> pieces;
  for (const auto& sp : steps_) {
    const Step& st = *sp;
    switch (st.kind) {
      case Step::kByteLevel: t = byte_level::token_string_to_bytes(t); break;
      case Step::kMetaspace: t = replace_all(t, st.replacement, " "); break;
      case Step::kReplace: {
        pieces.clear();
        st.pattern->find_matches(t, pieces);
        std::string out;
        for (const PatternPiece& p : pieces) out += p.is_match ? st.replacement : t.substr(p.start, p.end - p.start);
        t = std::move(out);
        break;
      }
      case Step::kByteFallback:
        if (const int b = byte_fallback_value(t); b >= 0) t.assign(1, static_cast<char>(b));
        break;
      case Step::kFuse:
      case Step::kStrip:
        break;
    }
  }
  return t;
}

}  // namespace ssmserve
