// Owns ssmserve's public tokenizer API: Hugging Face tokenizer.json BPE pipelines and SentencePiece models of the
// supported checkpoint families, and streaming detokenization.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ssmserve {

/// A tokenizer loaded from a Hugging Face `tokenizer.json`, reproducing `tokenizers` (Rust, 0.23) exactly for the
/// components the supported checkpoints use: normalizers NFC / NFD / NFKC / NFKD / Lowercase / Strip / Prepend /
/// Replace / Sequence; pre-tokenizers ByteLevel (with or without its regex, add_prefix_space) / Split (any regex or
/// string, every behaviour, invert) / Metaspace (prepend_scheme, split) / Digits / Punctuation / WhitespaceSplit /
/// Sequence; model BPE (byte_fallback, ignore_merges, unk_token + fuse_unk, continuing_subword_prefix,
/// end_of_word_suffix; dropout refused); post-processors TemplateProcessing / ByteLevel / Bert / Roberta / Sequence;
/// decoders ByteLevel / Metaspace / Replace / ByteFallback / Fuse / Strip / Sequence; added tokens with lstrip / rstrip
/// / single_word / normalized / special. Any other component is an Error naming it. Or from a SentencePiece
/// `tokenizer.model` (libsentencepiece). Copies share the loaded tables (cheap); every method is const and thread-safe.
class Tokenizer {
 public:
  /// Loads `tokenizer_json` as transformers 5.x `AutoTokenizer.from_pretrained(folder)` builds it: the tokenizer class
  /// is chosen from the folder's config.json (`model_type`) and tokenizer_config.json (`tokenizer_class`), the classes
  /// that rebuild the pipeline from tokenizer.json's vocabulary and merges do so (Qwen2Tokenizer / Qwen3_5Tokenizer:
  /// their split regex; LlamaTokenizer: Metaspace + byte fallback; GPT2Tokenizer / GPTNeoXTokenizer: ByteLevel with
  /// the GPT-2 regex; see transformers_class.h), and special tokens tokenizer_config.json names but tokenizer.json
  /// lacks are added. Throws Error naming the file when it cannot be read, is not valid JSON, or uses a component
  /// outside the supported set above.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);

  /// Loads `tokenizer_json` as transformers' tokenizer class `tokenizer_class` would ("" or any class that keeps
  /// tokenizer.json's pipeline: exactly as the file says; a rebuilding class: the file's vocabulary, merges and added
  /// tokens with that class's pipeline), with the special tokens of the folder's tokenizer_config.json. Throws Error
  /// as from_file(tokenizer_json).
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json, std::string_view tokenizer_class);

  /// Loads a SentencePiece model file (`tokenizer.model`, protobuf) through libsentencepiece: encode() gives the ids of
  /// the `sentencepiece` package's encode(text), plus the model's BOS first when special tokens are added (as
  /// transformers' Llama-style classes do); decode() is its decode(ids). Throws Error naming the file when it cannot
  /// be read or is not a valid model (truncated, lying lengths, ...).
  static Tokenizer from_sentencepiece(const std::filesystem::path& model_file);

  /// Loads Mistral's `tekken.json` (tiktoken-style byte-level BPE; tekken::convert): encode() gives the ids of
  /// mistral_common's Tekkenizer.encode(text, bos=add_special_tokens, eos=False) (special-token strings in the text are
  /// plain text); decode() skips or keeps its special tokens. Throws Error naming the file and the field.
  static Tokenizer from_tekken(const std::filesystem::path& tekken_json);

  /// The tokenizer of a checkpoint folder: tokenizer.json (from_file) when present, else tekken.json (from_tekken),
  /// else a SentencePiece tokenizer.model / tokenizer.model.v3 / tokenizer.model.v1 (from_sentencepiece). Throws Error
  /// naming the folder when it has none.
  static Tokenizer from_pretrained(const std::filesystem::path& folder);

  /// Token ids of `text`, like HF `tokenizer.encode(text, add_special_tokens=add_special_tokens)`. Steps: repair
  /// ill-formed UTF-8 like Python's `decode('utf-8', errors='replace')`; split out non-normalized added tokens
  /// anywhere in the raw text; normalize each remaining piece; split out normalized added tokens; pre-tokenize the
  /// rest; BPE each word; then, with `add_special_tokens`, the post-processor's tokens around the sequence (e.g. BOS).
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;

  /// Text of `ids`, like HF `decode(ids, skip_special_tokens)`: the token strings of the ids go through the decoder
  /// (byte-level: the bytes of every token, see token_bytes, joined and decoded as UTF-8 with U+FFFD for ill-formed or
  /// incomplete sequences). Ids outside the vocabulary
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

  /// The transformers tokenizer class a tokenizer.json was loaded as (from_pretrained / from_file): a class whose
  /// __init__ rebuilds the pipeline ("Qwen3_5Tokenizer", "GPTNeoXTokenizer", "LlamaTokenizer", ...), or "" for
  /// tokenizer.json's own pipeline (transformers' TokenizersBackend) and for SentencePiece and tekken files.
  const std::string& tokenizer_class() const;

  /// True for added tokens marked special (e.g. `<|endoftext|>`); false otherwise, including out-of-range ids.
  bool is_special(int id) const;

  /// Raw bytes `id` stands for in the middle of a text, as the decoder maps it (ByteLevel: its bytes; `<0xHH>`
  /// byte-fallback tokens: that byte; Metaspace / Replace applied). May be an incomplete UTF-8 fragment. Throws Error when `id` is outside [0, vocab_size()) or names no token.
  std::string token_bytes(int id) const;

  /// True when `id` names a token (0 <= id < vocab_size() and not a gap in the id space).
  bool has_id(int id) const;

  /// Opaque internal state (defined in tokenizer_impl.h, which only the tokenizer's own sources include).
  struct Impl;

 private:
  friend class IncrementalDetokenizer;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// Streaming decoder for generated ids: push() returns only text that is complete UTF-8 (never half a character);
/// flush() returns what remains (incomplete leftovers as U+FFFD). The concatenation of all push() and flush()
/// outputs equals Tokenizer::decode of the same ids (ill-formed bytes become U+FFFD as soon as they are known to be
/// ill-formed). Ids outside the vocabulary yield nothing. Byte-level decoders stream token bytes; other decoders
/// (Metaspace, ByteFallback, Strip, SentencePiece) stream as `tokenizers`' DecodeStream does: the new text is
/// decode(window) minus decode(window without the new ids), held back while it ends in U+FFFD. Keeps a reference to `tok`: it must outlive
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
  // Generic decoders: ids since the last emitted context, their first prefix_index_ already emitted as prefix_.
  std::vector<int> window_;
  std::size_t prefix_index_ = 0;
  std::string prefix_;
};

}  // namespace ssmserve
