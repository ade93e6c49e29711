// Owns the internal state shared by copies of a Tokenizer (id tables, pipeline components, BPE model or SentencePiece
// processor); not part of the public API.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer_chain.h"
#include "tokenizer/sentencepiece_model.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {

/// Everything a loaded tokenizer.json (or SentencePiece model) becomes. Built once by the loaders, then read-only
/// (BpeModel's cache is internally synchronized).
struct Tokenizer::Impl {
  enum Kind : std::uint8_t { kNone = 0, kNormal = 1, kSpecial = 2 };

  std::vector<std::string> token_strings;   // id -> vocabulary string / added token content ("" for gaps)
  std::vector<std::string> decode_strings;  // id -> string handed to the decoder (normalized added tokens: normalized)
  std::vector<std::string> token_raw;       // id -> token_bytes
  std::vector<std::uint8_t> kinds;          // id -> Kind
  std::vector<std::uint8_t> fallback_byte;  // id -> 1 for `<0xHH>` tokens the decoder's ByteFallback reads
  std::unordered_map<std::string, int> vocab;  // model vocabulary
  std::unordered_map<std::string, int> added;  // added token content -> id
  std::unique_ptr<BpeModel> bpe;
  Normalizer normalizer;
  PreTokenizerChain pre_tokenizer;
  Decoder decoder;
  bool byte_level_decoder = false;     // decode = concatenated token_raw, repaired (Decoder::is_byte_level)
  AddedTokenMatcher raw_added;         // normalized=false: matched in the raw text
  AddedTokenMatcher normalized_added;  // normalized=true: matched after normalization
  std::vector<int> prefix_ids, suffix_ids;  // post-processor: ids around the sequence when special tokens are added
  std::shared_ptr<const SentencePieceModel> spm;  // set for tokenizer.model files; the fields above are then unused
  std::string tokenizer_class;  // the transformers class a tokenizer.json was loaded as ("": its own pipeline)

  bool has(int id) const {
    return id >= 0 && static_cast<std::size_t>(id) < kinds.size() && kinds[static_cast<std::size_t>(id)] != kNone;
  }
};

}  // namespace ssmserve
