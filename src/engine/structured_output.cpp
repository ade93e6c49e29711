// Owns structured outputs through xgrammar (see structured_output.h). Without xgrammar in the build
// (SSMSERVE_HAVE_XGRAMMAR unset) the manager cannot be built: a constrained request gets an error saying so.
#include "engine/structured_output.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

#if SSMSERVE_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace ssmserve {

void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> bitmask) {
  const size_t V = logits.size();
  SSM_CHECK(bitmask.size() >= static_cast<size_t>(token_bitmask_words(static_cast<int>(V))),
            "apply_token_bitmask: {} bitmask words for {} logits (need {})", bitmask.size(), V,
            token_bitmask_words(static_cast<int>(V)));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 32 < V; ++w) {
    const uint32_t bits = static_cast<uint32_t>(bitmask[w]);
    if (bits == 0xffffffffu) continue;
    const size_t end = std::min(V, w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i)
      if (!((bits >> (i - w * 32)) & 1u)) logits[i] = kNegInf;
  }
}

std::string choice_as_grammar(std::span<const std::string> choice) {
  std::string g = "root ::= ";
  for (size_t i = 0; i < choice.size(); ++i) {
    if (i) g += " | ";
    g += '"';
    for (const char c : choice[i]) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '"' || c == '\\') g += '\\', g += c;
      else if (u < 0x20 || u == 0x7f) g += fmt::format("\\u{:04x}", u);  // fixed-width: `\x` reads any number of digits
      else g += c;
    }
    g += '"';
  }
  return g;
}

#if SSMSERVE_HAVE_XGRAMMAR

namespace {

/// A DLTensor view of one bitmask row: [words] int32 on the host.
struct BitmaskView {
  int64_t shape[1];
  DLTensor t{};
  explicit BitmaskView(std::span<int32_t> words) : shape{static_cast<int64_t>(words.size())} {
    t.data = words.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
  }
};

class XgrammarGrammar final : public StructuredOutputGrammar {
 public:
  XgrammarGrammar(const xgrammar::CompiledGrammar& g, const std::vector<int>& eos)
      : matcher_(g, eos), eos_(eos) {}

  bool fill_bitmask(std::span<int32_t> bitmask) override {
    if (matcher_.IsTerminated()) {  // e.g. ignore_eos past the end: only EOS may follow
      std::fill(bitmask.begin(), bitmask.end(), 0);
      for (const int e : eos_)
        if (e >= 0 && static_cast<size_t>(e / 32) < bitmask.size())
          bitmask[static_cast<size_t>(e / 32)] |= static_cast<int32_t>(1u << (e % 32));
      return true;
    }
    BitmaskView view(bitmask);
    return matcher_.FillNextTokenBitmask(&view.t);
  }
  bool accept_token(int token) override {
    if (matcher_.IsTerminated()) return true;
    return matcher_.AcceptToken(token);
  }
  bool is_completed() const override { return matcher_.IsCompleted(); }
  bool is_terminated() const override { return matcher_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher matcher_;
  std::vector<int> eos_;
};

}  // namespace

struct StructuredOutputManager::Impl {
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  std::vector<int> eos;
  Impl(std::vector<std::string> vocab, int vocab_size, std::vector<int> eos_ids)
      : info(vocab, xgrammar::VocabType::RAW, vocab_size, std::vector<int32_t>(eos_ids.begin(), eos_ids.end())),
        compiler(info, /*max_threads=*/2),
        eos(std::move(eos_ids)) {}
};

StructuredOutputManager::StructuredOutputManager(const Tokenizer& tok, int vocab_size, std::vector<int> eos_token_ids)
    : vocab_size_(vocab_size) {
  SSM_CHECK(vocab_size > 0, "structured outputs: vocab_size must be > 0, got {}", vocab_size);
  SSM_CHECK(!eos_token_ids.empty(), "structured outputs need the model's EOS token ids (none in config.json or "
                                    "generation_config.json): a finished text could never end");
  for (const int e : eos_token_ids)
    SSM_CHECK(e >= 0 && e < vocab_size, "structured outputs: EOS token id {} is outside the vocabulary [0, {})", e,
              vocab_size);
  // Every id's raw bytes as the decoder maps it in the middle of a text (xgrammar's RAW vocabulary); special tokens,
  // ids the tokenizer lacks and padding ids of a larger embedding are "" (xgrammar: never part of the text).
  std::vector<std::string> vocab(static_cast<size_t>(vocab_size));
  const int n = std::min(vocab_size, tok.vocab_size());
  for (int id = 0; id < n; ++id)
    if (tok.has_id(id) && !tok.is_special(id)) vocab[static_cast<size_t>(id)] = tok.token_bytes(id);
  try {
    impl_ = std::make_unique<Impl>(std::move(vocab), vocab_size, std::move(eos_token_ids));
  } catch (const std::exception& e) {
    fail("structured outputs: the tokenizer's vocabulary could not be prepared: {}", e.what());
  }
}

StructuredOutputManager::~StructuredOutputManager() = default;

bool StructuredOutputManager::available() { return true; }

std::unique_ptr<StructuredOutputGrammar> StructuredOutputManager::grammar_for(const StructuredOutputsParams& p) {
  p.validate();
  const std::string field = std::string("structured_outputs.") + p.kind();
  try {
    auto compile = [&]() -> xgrammar::CompiledGrammar {
      auto& c = impl_->compiler;
      if (p.json)
        return c.CompileJSONSchema(*p.json, /*any_whitespace=*/!p.disable_any_whitespace, std::nullopt, std::nullopt,
                                   /*strict_mode=*/!p.disable_additional_properties);
      if (p.json_object)  // an object, as OpenAI's json_object mode and vLLM (xgrammar's builtin grammar takes any value)
        return c.CompileJSONSchema(R"({"type": "object"})", !p.disable_any_whitespace, std::nullopt, std::nullopt,
                                   !p.disable_additional_properties);
      if (p.regex) return c.CompileRegex(*p.regex);
      if (p.choice) return c.CompileGrammar(choice_as_grammar(*p.choice), "root");
      if (p.grammar) return c.CompileGrammar(*p.grammar, "root");
      return c.CompileStructuralTag(*p.structural_tag);
    };
    return std::make_unique<XgrammarGrammar>(compile(), impl_->eos);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string why = e.what();
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    fail("{} is not a valid or supported {}: {}", field,
         p.json ? "JSON schema" : p.regex ? "regular expression" : p.structural_tag ? "structural tag" : "grammar", why);
  }
}

#else  // !SSMSERVE_HAVE_XGRAMMAR

struct StructuredOutputManager::Impl {};

StructuredOutputManager::StructuredOutputManager(const Tokenizer&, int vocab_size, std::vector<int>)
    : vocab_size_(vocab_size) {
  fail("structured outputs are not available in this build of ssmserve (built without xgrammar: "
       "SSMSERVE_STRUCTURED_OUTPUTS=OFF, or its archive could not be downloaded at build time)");
}

StructuredOutputManager::~StructuredOutputManager() = default;

bool StructuredOutputManager::available() { return false; }

std::unique_ptr<StructuredOutputGrammar> StructuredOutputManager::grammar_for(const StructuredOutputsParams&) {
  fail("structured outputs are not available in this build of ssmserve");
}

#endif

}  // namespace ssmserve
