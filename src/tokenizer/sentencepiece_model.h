// Owns the SentencePiece side of Tokenizer: a `tokenizer.model` protobuf loaded through libsentencepiece.
#pragma once
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve {

/// A SentencePiece model (BPE or unigram, byte fallback or not) as the `sentencepiece` Python package runs it:
/// encode() gives the ids of `SentencePieceProcessor.encode(text)`, decode() the text of `.decode(ids)`.
/// Thread-safe (the processor is const after loading).
class SentencePieceModel {
 public:
  /// Parses serialized ModelProto bytes. Throws Error (naming `source`) when libsentencepiece rejects them.
  SentencePieceModel(const std::string& serialized, const std::string& source);
  ~SentencePieceModel();

  std::vector<int> encode(std::string_view text) const;
  /// Ids outside [0, size()) must be filtered by the caller.
  std::string decode(std::span<const int> ids) const;

  int size() const;
  std::string piece(int id) const;
  int piece_to_id(std::string_view piece) const;  ///< -1 when `piece` is not in the vocabulary
  bool is_control(int id) const;
  bool is_byte(int id) const;
  int bos_id() const;  ///< -1 when the model has none

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ssmserve
