// Owns the normalizer steps of normalizer.h, each mirroring its HF `tokenizers` implementation (normalizers/*.rs).
#include "tokenizer/normalizer.h"

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_props.h"

namespace ssmserve {

using nlohmann::json;

struct Normalizer::Step {
  enum Kind { kUnicode, kLowercase, kStrip, kPrepend, kReplace } kind;
  NormalForm form = NormalForm::kNFC;
  bool left = false, right = false;  // Strip
  std::string text;                  // Prepend: the prefix; Replace: the content
  std::shared_ptr<RegexSplitter> pattern;  // Replace
};

namespace {

/// Text without leading (`left`) / trailing (`right`) Rust-whitespace characters.
std::string strip(std::string_view s, bool left, bool right) {
  std::size_t b = 0, e = s.size(), len = 0;
  if (left) {
    while (b < e && unicode_props::is_whitespace(unicode_props::decode_at(s, b, len))) b += len;
  }
  if (right) {
    while (e > b) {
      std::size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      if (!unicode_props::is_whitespace(unicode_props::decode_at(s, k, len))) break;
      e = k;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0, len = 0; i < s.size(); i += len) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      len = 1;
      out += static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b);
      continue;
    }
    unicode_props::append_lowercase(out, unicode_props::decode_at(s, i, len));
  }
  return out;
}

std::string replace(std::string_view s, const RegexSplitter& pattern, const std::string& content) {
  std::vector<PatternPiece> pieces;
  pattern.find_matches(s, pieces);
  std::string out;
  out.reserve(s.size());
  for (const PatternPiece& p : pieces) {
    if (p.is_match) {
      out += content;
    } else {
      out.append(s.substr(p.start, p.end - p.start));
    }
  }
  return out;
}

std::string string_field(const json& j, const char* key, const char* component) {
  SSM_CHECK(j.contains(key) && j.at(key).is_string(), "normalizer {} needs a string '{}' (got {})", component, key,
            json_excerpt(j));
  return j.at(key).get<std::string>();
}

}  // namespace

/// The regex of a Replace / Split pattern object {"String": s} or {"Regex": r}. `what` names the component in errors.
std::shared_ptr<RegexSplitter> parse_pattern(const json& pattern, const char* what) {
  SSM_CHECK(pattern.is_object() && pattern.size() == 1 &&
                ((pattern.contains("Regex") && pattern.at("Regex").is_string()) ||
                 (pattern.contains("String") && pattern.at("String").is_string())),
            "{} pattern must be {{\"Regex\": ...}} or {{\"String\": ...}} (got {})", what, json_excerpt(pattern));
  if (pattern.contains("Regex")) return std::make_shared<RegexSplitter>(pattern.at("Regex").get<std::string>());
  return std::make_shared<RegexSplitter>(RegexSplitter::literal(pattern.at("String").get<std::string>()));
}

void Normalizer::parse_into(const json& j, std::vector<std::shared_ptr<const Step>>& steps, int depth) {
  if (j.is_null()) return;
  SSM_CHECK(depth < 16, "normalizer Sequences nested too deeply");
  SSM_CHECK(j.is_object() && j.contains("type") && j.at("type").is_string(),
            "normalizer must be an object with a 'type' (got {})", json_excerpt(j));
  const std::string t = j.at("type").get<std::string>();
  auto step = std::make_shared<Step>();
  if (t == "Sequence") {
    const json& list = j.value("normalizers", json());
    SSM_CHECK(list.is_array(), "normalizer Sequence needs a 'normalizers' list (got {})", json_excerpt(list));
    for (const json& n : list) parse_into(n, steps, depth + 1);
    return;
  }
  if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    step->kind = Step::kUnicode;
    step->form = t == "NFC" ? NormalForm::kNFC : t == "NFD" ? NormalForm::kNFD : t == "NFKC" ? NormalForm::kNFKC
                                                                                            : NormalForm::kNFKD;
  } else if (t == "Lowercase") {
    step->kind = Step::kLowercase;
  } else if (t == "Strip") {
    step->kind = Step::kStrip;
    step->left = j.value("strip_left", true);
    step->right = j.value("strip_right", true);
  } else if (t == "Prepend") {
    step->kind = Step::kPrepend;
    step->text = string_field(j, "prepend", "Prepend");
  } else if (t == "Replace") {
    step->kind = Step::kReplace;
    step->pattern = parse_pattern(j.value("pattern", json()), "normalizer Replace");
    step->text = string_field(j, "content", "Replace");
  } else {
    fail("unsupported normalizer '{}' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, Sequence)",
         t);
  }
  steps.push_back(std::move(step));
}

Normalizer Normalizer::from_json(const json& j) {
  Normalizer n;
  parse_into(j, n.steps_, 0);
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const auto& step : steps_) {
    switch (step->kind) {
      case Step::kUnicode: s = unicode_normalize(s, step->form); break;
      case Step::kLowercase: s = lowercase(s); break;
      case Step::kStrip: s = strip(s, step->left, step->right); break;
      case Step::kPrepend:
        if (!s.empty()) s.insert(0, step->text);
        break;
      case Step::kReplace: s = replace(s, *step->pattern, step->text); break;
    }
  }
  return s;
}

}  // namespace ssmserve
