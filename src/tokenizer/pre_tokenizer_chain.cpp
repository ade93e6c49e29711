// Owns the pre-tokenizer steps of pre_tokenizer_chain.h, each mirroring its HF `tokenizers` implementation
// (pre_tokenizers/*.rs) and NormalizedString::split's delimiter behaviours.
#include "tokenizer/pre_tokenizer_chain.h"

#include <algorithm>

#include "config/hf_json.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_props.h"
#include "tokenizer/utf8.h"

namespace ssmserve {

using nlohmann::json;

struct PreTokenizerChain::Step {
  enum Kind { kByteLevel, kSplit, kMetaspace, kDigits, kPunctuation, kWhitespaceSplit } kind;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  std::shared_ptr<RegexSplitter> pattern;            // Split (ByteLevel with use_regex: the GPT-2 pattern)
  SplitBehavior behavior = SplitBehavior::kIsolated;  // Split, Punctuation
  bool invert = false;                               // Split
  std::string replacement;                           // Metaspace: the replacement character as UTF-8
  char32_t replacement_cp = 0;
  enum Scheme { kAlways, kFirst, kNever } scheme = kAlways;  // Metaspace
  bool split = true;                                 // Metaspace
  bool individual_digits = false;                    // Digits
};

namespace {

SplitBehavior parse_behavior(const json& j, const char* component) {
  const json& b = j.value("behavior", json("Isolated"));
  SSM_CHECK(b.is_string(), "pre_tokenizer {} behavior must be a string (got {})", component, json_excerpt(b));
  const std::string s = b.get<std::string>();
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  fail("unsupported pre_tokenizer {} behavior '{}'", component, text_excerpt(s));
}

bool bool_field(const json& j, const char* key, bool def, const char* component) {
  if (!j.contains(key) || j.at(key).is_null()) return def;
  SSM_CHECK(j.at(key).is_boolean(), "pre_tokenizer {} field '{}' must be true or false (got {})", component, key,
            json_excerpt(j.at(key)));
  return j.at(key).get<bool>();
}

/// HF's `Pattern for Fn(char) -> bool`: every character for which `pred` holds is a match of its own.
template <class Pred>
void char_matches(std::string_view s, Pred pred, std::vector<PatternPiece>& out) {
  if (s.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  std::size_t last = 0, len = 0;
  for (std::size_t i = 0; i < s.size(); i += len) {
    if (pred(unicode_props::decode_at(s, i, len))) {
      if (last < i) out.push_back({last, i, false});
      out.push_back({i, i + len, true});
      last = i + len;
    }
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

/// NormalizedString::split's fold of the pattern pieces under `b`, then its slicing with empty slices dropped
/// (PreTokenizedString::split drops them). `first`: the split piece starts the input.
void split_by(const std::string& s, bool first, std::vector<PatternPiece>& pieces, SplitBehavior b,
              std::vector<PreToken>& out) {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  ranges.reserve(pieces.size());
  bool prev = false;
  switch (b) {
    case SplitBehavior::kIsolated:
      for (const auto& p : pieces) ranges.emplace_back(p.start, p.end);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& p : pieces)
        if (!p.is_match) ranges.emplace_back(p.start, p.end);
      break;
    case SplitBehavior::kContiguous:
      for (const auto& p : pieces) {
        if (p.is_match == prev && !ranges.empty()) {
          ranges.back().second = p.end;
        } else {
          ranges.emplace_back(p.start, p.end);
        }
        prev = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& p : pieces) {
        if (p.is_match && !prev && !ranges.empty()) {
          ranges.back().second = p.end;
        } else {
          ranges.emplace_back(p.start, p.end);
        }
        prev = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->is_match && !prev && !ranges.empty()) {
          ranges.back().first = it->start;
        } else {
          ranges.emplace_back(it->start, it->end);
        }
        prev = it->is_match;
      }
      std::reverse(ranges.begin(), ranges.end());
      break;
  }
  for (const auto& [a, e] : ranges)
    if (e > a) out.push_back({s.substr(a, e - a), first && a == 0});
}

/// `s` with every byte replaced by its byte-level alphabet character.
std::string to_byte_alphabet(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out += byte_level::byte_to_string(static_cast<unsigned char>(c));
  return out;
}

const std::shared_ptr<RegexSplitter>& gpt2_splitter() {
  static const auto re = std::make_shared<RegexSplitter>(gpt2_split_pattern());
  return re;
}

}  // namespace

void PreTokenizerChain::parse_into(const json& j, std::vector<std::shared_ptr<const Step>>& steps, int depth) {
  if (j.is_null()) return;
  SSM_CHECK(depth < 16, "pre_tokenizer Sequences nested too deeply");
  SSM_CHECK(j.is_object() && j.contains("type") && j.at("type").is_string(),
            "pre_tokenizer must be an object with a 'type' (got {})", json_excerpt(j));
  const std::string t = j.at("type").get<std::string>();
  if (t == "Sequence") {
    const json& list = j.value("pretokenizers", json());
    SSM_CHECK(list.is_array(), "pre_tokenizer Sequence needs a 'pretokenizers' list (got {})", json_excerpt(list));
    for (const json& p : list) parse_into(p, steps, depth + 1);
    return;
  }
  auto step = std::make_shared<Step>();
  if (t == "ByteLevel") {
    step->kind = Step::kByteLevel;
    step->add_prefix_space = bool_field(j, "add_prefix_space", true, "ByteLevel");
    step->use_regex = bool_field(j, "use_regex", true, "ByteLevel");
    if (step->use_regex) step->pattern = gpt2_splitter();
  } else if (t == "Split") {
    step->kind = Step::kSplit;
    step->pattern = parse_pattern(j.value("pattern", json()), "pre_tokenizer Split");
    step->behavior = parse_behavior(j, "Split");
    step->invert = bool_field(j, "invert", false, "Split");
  } else if (t == "Metaspace") {
    step->kind = Step::kMetaspace;
    const json& r = j.value("replacement", json("\xE2\x96\x81"));
    SSM_CHECK(r.is_string(), "pre_tokenizer Metaspace replacement must be a string (got {})", json_excerpt(r));
    step->replacement = r.get<std::string>();
    std::size_t len = 0;
    SSM_CHECK(!step->replacement.empty() && utf8::is_valid(step->replacement) &&
                  (step->replacement_cp = unicode_props::decode_at(step->replacement, 0, len), len) ==
                      step->replacement.size(),
              "pre_tokenizer Metaspace replacement must be one character (got {})", json_excerpt(r));
    const std::string scheme = j.value("prepend_scheme", std::string(bool_field(j, "add_prefix_space", true, "Metaspace")
                                                                         ? "always" : "never"));
    if (scheme == "always") {
      step->scheme = Step::kAlways;
    } else if (scheme == "first") {
      step->scheme = Step::kFirst;
    } else if (scheme == "never") {
      step->scheme = Step::kNever;
    } else {
      fail("unsupported pre_tokenizer Metaspace prepend_scheme '{}'", text_excerpt(scheme));
    }
    step->split = bool_field(j, "split", true, "Metaspace");
  } else if (t == "Digits") {
    step->kind = Step::kDigits;
    step->individual_digits = bool_field(j, "individual_digits", false, "Digits");
  } else if (t == "Punctuation") {
    step->kind = Step::kPunctuation;
    step->behavior = parse_behavior(j, "Punctuation");
  } else if (t == "WhitespaceSplit") {
    step->kind = Step::kWhitespaceSplit;
  } else {
    fail("unsupported pre_tokenizer '{}' (supported: ByteLevel, Split, Metaspace, Digits, Punctuation, "
         "WhitespaceSplit, Sequence)", t);
  }
  steps.push_back(std::move(step));
}

PreTokenizerChain PreTokenizerChain::from_json(const json& j) {
  PreTokenizerChain c;
  parse_into(j, c.steps_, 0);
  c.raw_bytes_out_ = !c.steps_.empty() && c.steps_.back()->kind == Step::kByteLevel;
  c.splits_only_ = c.raw_bytes_out_ && !c.steps_.back()->add_prefix_space;
  for (std::size_t i = 0; i + 1 < c.steps_.size(); ++i) {
    const Step& st = *c.steps_[i];
    c.splits_only_ = c.splits_only_ && st.kind == Step::kSplit && st.behavior == SplitBehavior::kIsolated && !st.invert;
  }
  return c;
}

void PreTokenizerChain::run_views(std::string_view text, std::vector<std::string_view>& out,
                                  std::vector<std::string_view>& scratch) const {
  out.clear();
  if (text.empty()) return;
  out.push_back(text);
  for (const auto& sp : steps_) {
    if (sp->pattern == nullptr) continue;  // ByteLevel without its regex: no cut
    scratch.clear();
    for (std::string_view piece : out) sp->pattern->split(piece, scratch);
    out.swap(scratch);
  }
}

void PreTokenizerChain::run(std::string_view text, bool first, std::vector<PreToken>& out) const {
  if (text.empty()) return;
  std::vector<PreToken> cur, next;
  cur.push_back({std::string(text), first});
  std::vector<PatternPiece> pieces;
  for (std::size_t si = 0; si < steps_.size(); ++si) {
    const Step& st = *steps_[si];
    const bool last = si + 1 == steps_.size();
    next.clear();
    for (PreToken& p : cur) {
      pieces.clear();
      switch (st.kind) {
        case Step::kByteLevel: {
          if (st.add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text = ' ' + p.text;
          const std::size_t from = next.size();
          if (st.use_regex) {
            st.pattern->find_matches(p.text, pieces);
            split_by(p.text, p.first, pieces, SplitBehavior::kIsolated, next);
          } else if (!p.text.empty()) {
            next.push_back(std::move(p));
          }
          if (!last)
            for (std::size_t k = from; k < next.size(); ++k) next[k].text = to_byte_alphabet(next[k].text);
          break;
        }
        case Step::kSplit:
          st.pattern->find_matches(p.text, pieces);
          if (st.invert)
            for (auto& m : pieces) m.is_match = !m.is_match;
          split_by(p.text, p.first, pieces, st.behavior, next);
          break;
        case Step::kMetaspace: {
          std::string s;
          s.reserve(p.text.size() + 3);
          for (char c : p.text) {
            if (c == ' ') {
              s += st.replacement;
            } else {
              s += c;
            }
          }
          const bool starts = s.compare(0, st.replacement.size(), st.replacement) == 0;
          if (!starts && (st.scheme == Step::kAlways || (st.scheme == Step::kFirst && p.first))) s = st.replacement + s;
          if (st.split) {
            char_matches(s, [&](char32_t c) { return c == st.replacement_cp; }, pieces);
            split_by(s, p.first, pieces, SplitBehavior::kMergedWithNext, next);
          } else if (!s.empty()) {
            next.push_back({std::move(s), p.first});
          }
          break;
        }
        case Step::kDigits:
          char_matches(p.text, unicode_props::is_numeric, pieces);
          split_by(p.text, p.first, pieces, st.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                   next);
          break;
        case Step::kPunctuation:
          char_matches(p.text, unicode_props::is_punctuation, pieces);
          split_by(p.text, p.first, pieces, st.behavior, next);
          break;
        case Step::kWhitespaceSplit:
          char_matches(p.text, unicode_props::is_whitespace, pieces);
          split_by(p.text, p.first, pieces, SplitBehavior::kRemoved, next);
          break;
      }
    }
    cur.swap(next);
  }
  for (PreToken& p : cur) out.push_back(std::move(p));
}

}  // namespace ssmserve
