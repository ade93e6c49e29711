// Owns structured outputs (vLLM v1's vllm/v1/structured_output: StructuredOutputManager, StructuredOutputGrammar with
// its xgrammar backend): compiling a request's constraint (SamplingParams::structured_outputs) against the tokenizer's
// vocabulary, the per-request grammar matcher, and the token bitmask that masks the logits before sampling.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace ssmserve {

class Tokenizer;

/// Int32 words of a token bitmask over `vocab_size` tokens: ceil(vocab_size / 32). Bit (id % 32) of word (id / 32)
/// set = token id allowed (xgrammar's layout).
inline int token_bitmask_words(int vocab_size) { return (vocab_size + 31) / 32; }

/// Sets logits[id] = -inf for every id whose bit in `bitmask` is clear. logits: [vocab] fp32; bitmask:
/// [token_bitmask_words(vocab)] int32. (vLLM's apply_grammar_bitmask, one row.)
void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> bitmask);

/// One request's grammar matcher (vLLM's StructuredOutputGrammar): where the output so far is in the constraint's
/// language. Not thread-safe; owned by the request's RequestState.
class StructuredOutputGrammar {
 public:
  virtual ~StructuredOutputGrammar() = default;
  /// Fills bitmask: [token_bitmask_words(vocab)] int32 with the tokens that may come next: those that keep the output a
  /// prefix of a word of the language, and the EOS ids once the output is a whole word. Once the matcher has accepted
  /// an EOS id (is_terminated) only the EOS ids. Returns false when every token is allowed (nothing to apply).
  virtual bool fill_bitmask(std::span<int32_t> bitmask) = 0;
  /// Advances past `token` (the request's newest output token). Returns false, leaving the state unchanged, when the
  /// token is not allowed here; after termination every token is ignored (returns true).
  virtual bool accept_token(int token) = 0;
  /// True once the output is a whole word of the language: only an EOS id may follow.
  virtual bool is_completed() const = 0;
  /// True once an EOS id was accepted after a whole word.
  virtual bool is_terminated() const = 0;
};

/// Largest constraint text (schema, regex, grammar, tag, all choices together) a request may carry, in bytes.
inline constexpr size_t kMaxStructuredOutputBytes = size_t{1} << 20;
/// Deepest nesting of objects / arrays a JSON schema or structural tag may have (compile time grows steeply with it:
/// ~0.1 s at 120 levels, ~9 s at 480 on this project's 2-core CI machine).
inline constexpr int kMaxStructuredOutputJsonDepth = 64;
/// Most values of one JSON-schema enum and most choices of a choice constraint (compile time grows steeply with them:
/// 10,000 compile in seconds, 100,000 took minutes of both CI cores).
inline constexpr size_t kMaxStructuredOutputChoices = 10000;

/// Workers compiling constraints (StructuredOutputManager): two, so that one slow schema does not hold every other
/// constrained request.
inline constexpr int kStructuredOutputWorkers = 2;
/// Bytes of compiled grammars xgrammar's cache keeps (vLLM's VLLM_XGRAMMAR_CACHE_MB default, 512 MiB).
inline constexpr int64_t kStructuredOutputCacheBytes = int64_t{512} << 20;

/// Checks a constraint without the vocabulary: exactly one kind (StructuredOutputsParams::validate), at most
/// kMaxStructuredOutputBytes of text, JSON nested at most kMaxStructuredOutputJsonDepth deep, at most
/// kMaxStructuredOutputChoices choices or values of one enum, a schema's length / item / property counts
/// (minLength, maxItems, ...) non-negative integers (xgrammar converts a negative one and fails only when compiling,
/// after the request was accepted), and a schema / regex /
/// grammar / tag xgrammar can convert to a grammar (fast next to compiling it: no token tables). Thread-safe: the
/// server calls it on its request threads, so that the engine's own call (StructuredOutputManager::validate) finds the
/// constraint in a cache of the last 4096 valid ones and costs a hash. Throws ssmserve::Error naming the field
/// (`structured_outputs.json`, `.regex`, `.grammar`, ...) and xgrammar's reason; a build without xgrammar throws
/// that structured outputs are not available.
void validate_structured_outputs(const StructuredOutputsParams& params);

/// A constraint being compiled on the manager's workers (vLLM compiles grammars asynchronously too, the request
/// waiting for its FSM meanwhile).
class PendingGrammar {
 public:
  /// f: the queued compilation's result; cancelled: the flag it reads before it starts.
  PendingGrammar(std::future<std::unique_ptr<StructuredOutputGrammar>> f, std::shared_ptr<std::atomic<bool>> cancelled)
      : f_(std::move(f)), cancelled_(std::move(cancelled)) {}
  /// The request no longer needs it (aborted): a compilation that has not started yet is skipped.
  void cancel() { cancelled_->store(true); }
  /// True once take() will not block.
  bool ready() const { return f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  /// Waits up to `timeout` for the compilation; true when ready.
  bool wait_for(std::chrono::milliseconds timeout) const { return f_.wait_for(timeout) == std::future_status::ready; }
  /// The matcher (blocks until compiled). Throws the compilation's ssmserve::Error. Once only.
  std::unique_ptr<StructuredOutputGrammar> take() { return f_.get(); }

 private:
  std::future<std::unique_ptr<StructuredOutputGrammar>> f_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
};

/// Compiles constraints for one model's vocabulary (vLLM's StructuredOutputManager with the xgrammar backend):
/// validate() at admission (validate_structured_outputs, cached), then compile_async() on kStructuredOutputWorkers
/// worker threads, so that a large schema (seconds to compile) never delays the engine's steps, and holds other
/// constrained requests only while it occupies a worker. Compiled grammars are cached by the constraint (xgrammar's
/// compiler cache, at most kStructuredOutputCacheBytes), so requests with the same schema share one compilation.
/// Built when the first constrained request arrives. Destroying it does not wait for a compilation in progress (its
/// worker finishes it alone and exits).
class StructuredOutputManager {
 public:
  /// tok: the model's tokenizer (kept by reference; must outlive this). vocab_size: the model's logits width (>= 1;
  /// ids the tokenizer does not have are never allowed). eos_token_ids: the ids that end a finished text.
  /// Throws ssmserve::Error when this build has no structured outputs (available() false).
  StructuredOutputManager(const Tokenizer& tok, int vocab_size, std::vector<int> eos_token_ids);
  ~StructuredOutputManager();
  /// True when this build includes xgrammar (cmake/xgrammar.cmake, SSMSERVE_STRUCTURED_OUTPUTS).
  static bool available();
  /// validate_structured_outputs(params).
  void validate(const StructuredOutputsParams& params) const;
  /// validate()s, then queues the compilation for the workers (first in, first out). The PendingGrammar gives the
  /// matcher at the start of the output, or the compilation's Error; cancel() it to skip a compilation not yet begun.
  std::shared_ptr<PendingGrammar> compile_async(const StructuredOutputsParams& params);
  int vocab_size() const { return vocab_size_; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the workers, which outlive this when a compilation is in progress
  int vocab_size_ = 0;
};

/// The EBNF grammar (xgrammar syntax, root rule `root`) whose words are exactly the strings of `choice` (vLLM's
/// choice_as_grammar): each string a quoted literal with `"` and `\` and control characters escaped.
std::string choice_as_grammar(std::span<const std::string> choice);

}  // namespace ssmserve
