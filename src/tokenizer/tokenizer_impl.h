// Owns the internal state shared by copies of a Tokenizer (id tables, BPE model, splitters); not part of the public API.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {

/// Everything a loaded tokenizer.json becomes. Built once by Tokenizer::from_file, then read-only
/// (BpeModel's cache is internally synchronized).
struct Tokenizer::Impl {
  enum Kind : std::uint8_t { kNone = 0, kNormal = 1, kSpecial = 2 };

  std::vector<std::string> token_strings;  // id -> vocabulary string ("" for gaps)
  std::vector<std::string> token_raw;      // id -> raw bytes (token_bytes)
  std::vector<std::uint8_t> kinds;         // id -> Kind
  std::unordered_map<std::string, int> vocab;  // BPE model vocabulary
  std::unordered_map<std::string, int> added;  // added token content -> id
  std::unique_ptr<BpeModel> bpe;
  std::vector<RegexSplitter> splitters;  // pre-tokenizer: each splits every piece of the one before (none: no split)
  AddedTokenMatcher raw_added;         // normalized=false: matched in the raw text
  AddedTokenMatcher normalized_added;  // normalized=true: matched after NFC
  bool nfc = false;

  /// Pre-tokens of `text` after every splitter in turn (all of `text` when there is none). `scratch` is reused.
  void pre_tokenize(std::string_view text, std::vector<std::string_view>& out,
                    std::vector<std::string_view>& scratch) const {
    out.clear();
    if (text.empty()) return;
    out.push_back(text);
    for (const RegexSplitter& s : splitters) {
      scratch.clear();
      for (std::string_view piece : out) s.split(piece, scratch);
      out.swap(scratch);
    }
  }

  bool has(int id) const {
    return id >= 0 && static_cast<std::size_t>(id) < kinds.size() && kinds[static_cast<std::size_t>(id)] != kNone;
  }
};

}  // namespace ssmserve
