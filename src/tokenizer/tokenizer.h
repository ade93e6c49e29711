// Owns ssmserve's public tokenizer API: Hugging Face tokenizer.json byte-level BPE (GPT-NeoX-20B, GPT-2, Qwen families) and streaming detokenization.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve {

/// A byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`, reproducing `tokenizers` (Rust, 0.23)
/// exactly for the supported pipeline: normalizer NFC or none; pre-tokenizer ByteLevel (add_prefix_space=false;
/// GPT-2 regex, or none with use_regex=false), or a Sequence of Split (Isolated, not inverted; Oniguruma regex or
/// literal string) pre-tokenizers ending in ByteLevel; model BPE (no dropout, no unk, no subword prefix/suffix); post-processor ByteLevel or none (adds
/// nothing); decoder ByteLevel or none; added tokens without lstrip/rstrip/single_word.
/// Copies share the loaded tables (cheap); every method is const and thread-safe.
class Tokenizer {
 public:
  /// Loads `tokenizer_json` as transformers 5.x `AutoTokenizer.from_pretrained(folder)` builds it: the tokenizer class
  /// is chosen from the folder's config.json (`model_type`) and tokenizer_config.json (`tokenizer_class`), and
  /// Qwen2Tokenizer / Qwen3_5Tokenizer replace tokenizer.json's pipeline by their own (see transformers_class.h:
  /// e.g. a qwen3_5_moe checkpoint shipping a GPT-NeoX tokenizer.json gets the Qwen3.5 split regex). Throws Error
  /// naming the file when it cannot be read, is not valid JSON, or uses a model type or pipeline option outside the
  /// supported set above.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);

  /// Loads `tokenizer_json` as transformers' tokenizer class `tokenizer_class` would ("" or any class that keeps
  /// tokenizer.json's pipeline: exactly as the file says; "Qwen2Tokenizer" / "Qwen3_5Tokenizer": the file's vocabulary,
  /// merges and added tokens with that class's pipeline). Throws Error as from_file(tokenizer_json).
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json, std::string_view tokenizer_class);

  /// Token ids of `text`, like HF `tokenizer.encode(text, add_special_tokens=True)` (nothing is added for this
  /// pipeline). Steps: repair ill-formed UTF-8 like Python's `decode('utf-8', errors='replace')`; split out
  /// non-normalized added tokens (e.g. `<|endoftext|>`) anywhere in the raw text; NFC each remaining piece; split out
  /// normalized added tokens (e.g. runs of spaces); split the rest with the pre-tokenizer's regexes; BPE each pre-token.
  std::vector<int> encode(std::string_view text) const;

  /// Text of `ids`, like HF `decode(ids, skip_special_tokens)`: the bytes of every token (see token_bytes) are
  /// joined and decoded as UTF-8 with U+FFFD for ill-formed or incomplete sequences. Ids outside the vocabulary
  /// (negative, or padding ids of a larger embedding, e.g. 50277..50279) contribute nothing, as in HF. No
  /// clean_up_tokenization_spaces: tokenizer_config.json does not set it, and transformers >= 4.45 defaults it to
  /// false (the `tokenizers` library never applies it).
  std::string decode(std::span<const int> ids, bool skip_special_tokens = false) const;

  /// Id of a token string (added tokens first, then the BPE vocabulary, as HF), or nullopt.
  std::optional<int> token_to_id(std::string_view token) const;

  /// The vocabulary string of `id` (byte-level alphabet; added tokens: their content). Throws Error when `id` is
  /// outside [0, vocab_size()) or names no token.
  std::string id_to_token(int id) const;

  /// Number of ids including added tokens (max id + 1; 50277 for GPT-NeoX-20B).
  int vocab_size() const;

  /// True for added tokens marked special (e.g. `<|endoftext|>`); false otherwise, including out-of-range ids.
  bool is_special(int id) const;

  /// Raw bytes `id` stands for, as HF's ByteLevel decoder maps it (added tokens: their content). May be an
  /// incomplete UTF-8 fragment. Throws Error when `id` is outside [0, vocab_size()) or names no token.
  std::string token_bytes(int id) const;

  /// True when `id` names a token (0 <= id < vocab_size() and not a gap in the id space).
  bool has_id(int id) const;

  /// Opaque internal state (defined in tokenizer_impl.h, which only the tokenizer's own sources include).
  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// Streaming decoder for generated ids: push() returns only text that is complete UTF-8 (never half a character);
/// flush() returns what remains (incomplete leftovers as U+FFFD). The concatenation of all push() and flush()
/// outputs equals Tokenizer::decode of the same ids, for any ids (ill-formed bytes become U+FFFD as soon as they are
/// known to be ill-formed). Ids outside the vocabulary yield nothing. Keeps a reference to `tok`: it must outlive
/// this object.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens = false);

  /// Adds one id; returns the newly completed text (possibly empty).
  std::string push(int id);

  /// Returns the pending incomplete bytes (as U+FFFD) and resets the pending state; text() keeps everything.
  std::string flush();

  /// Everything emitted so far by push() and flush().
  const std::string& text() const { return text_; }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 character (at most 3)
  std::string text_;
};

}  // namespace ssmserve
