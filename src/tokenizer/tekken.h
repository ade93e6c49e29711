// Owns the conversion of Mistral's tekken.json (a tiktoken-style byte-level BPE: base64 token bytes ranked by merge
// order, a split regex, special tokens first) into the tokenizer.json form the loader builds.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace ssmserve::tekken {

/// A tekken file as tokenizer.json parts plus its special tokens.
struct Converted {
  /// {"model": BPE (byte-level vocab strings -> id, merges derived from the ranks, ignore_merges), "pre_tokenizer":
  /// Split(pattern) + ByteLevel, "decoder": ByteLevel}: ids of normal tokens are rank + specials.size().
  nlohmann::json tokenizer_json;
  std::vector<std::string> specials;  ///< id -> special token string, ids [0, num_special_tokens)
  int bos_id = -1;                    ///< "<s>", or -1
};

/// Converts a parsed tekken.json as mistral_common's Tekkenizer reads it: `config.default_num_special_tokens`
/// special ids (the file's `special_tokens`, or the v7 list when absent, padded with `<SPECIAL_i>` fillers), then
/// the first `default_vocab_size - default_num_special_tokens` vocab entries (ranks 0..255 must be the single
/// bytes). Tiktoken merges the adjacent pair whose concatenation has the lowest rank, which is BPE with one merge per
/// way of splitting a token into two tokens, ordered by the token's rank. Throws Error naming the field.
Converted convert(const nlohmann::json& tekken);

/// Standard base64 (with or without padding) to bytes; throws Error on a bad character.
std::string base64_decode(const std::string& s);

}  // namespace ssmserve::tekken
