// Owns tokenizer.json's `decoder`: the supported HF decoders as a chain applied to the token strings of decoded ids.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ssmserve {

/// A tokenizer.json decoder as HF `tokenizers` runs it (decode_chain of each step, then the strings joined): ByteLevel,
/// Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence of these. Without a decoder, tokens are joined with
/// spaces (as HF). Immutable after parsing; decode() is thread-safe.
class Decoder {
 public:
  /// Parses the `decoder` value (null: join with " "). Throws Error naming the component for an unsupported type
  /// (e.g. "unsupported decoder 'WordPiece'") or a bad field.
  static Decoder from_json(const nlohmann::json& j);

  /// True when the decoder is exactly ByteLevel: decoding is then the concatenation of each token's bytes
  /// (byte_level::token_string_to_bytes) read as UTF-8 with U+FFFD repair, which allows per-token streaming.
  bool is_byte_level() const;

  /// True when a ByteFallback step is in the chain: a run of `<0xHH>` tokens decodes as a whole (one U+FFFD per
  /// byte when the run is not UTF-8), so a streaming decoder must wait for the run to end.
  bool has_byte_fallback() const;

  /// True when `token` is a `<0xHH>` token this decoder's ByteFallback step turns into a byte.
  bool is_fallback_byte(const std::string& token) const;

  /// The text of `tokens` (vocabulary strings of the ids being decoded, in order).
  std::string decode(std::vector<std::string> tokens) const;

  /// The bytes `token` stands for in the middle of a decoded text: ByteLevel maps back to raw bytes, ByteFallback
  /// `<0xHH>` tokens give that byte, Metaspace / Replace apply; Strip and the first-token rules do not.
  std::string token_bytes(const std::string& token) const;

 private:
  struct Step;
  std::vector<std::shared_ptr<const Step>> steps_;
  bool join_with_spaces_ = false;
  static void parse_into(const nlohmann::json& j, std::vector<std::shared_ptr<const Step>>& steps, int depth);
};

}  // namespace ssmserve
