// Owns structured outputs through xgrammar (see structured_output.h). Without xgrammar in the build
// (SSMSERVE_HAVE_XGRAMMAR unset) the manager cannot be built: a constrained request gets an error saying so.
#include "engine/structured_output.h"

#include <fmt/format.h>

#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <variant>

#include "config/hf_json.h"
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

/// xgrammar's message without its log prefix ("[hh:mm:ss] path/file.cc:123: " and "Check failed: (...) is false: ").
std::string xgrammar_reason(std::string why) {
  if (!why.empty() && why[0] == '[') {
    if (const size_t close = why.find("] "); close != std::string::npos && close < 12) {
      const size_t colon = why.find(": ", close);  // after "file.cc:123"
      if (colon != std::string::npos) why = why.substr(colon + 2);
    }
  }
  if (why.rfind("Check failed:", 0) == 0)
    if (const size_t k = why.find(" is false: "); k != std::string::npos) why = why.substr(k + 11);
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  return why;
}

/// The error naming the field of p whose constraint xgrammar refused.
[[noreturn]] void fail_constraint(const StructuredOutputsParams& p, const std::string& why) {
  fail("structured_outputs.{} is not a valid or supported {}: {}", p.kind(),
       p.json || p.json_object ? "JSON schema" : p.regex ? "regular expression" : p.structural_tag ? "structural tag"
                                                                                              : "grammar",
       xgrammar_reason(why));
}

}  // namespace

struct StructuredOutputManager::Impl {
  using Task = std::packaged_task<std::unique_ptr<StructuredOutputGrammar>()>;
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  std::vector<int> eos;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;  // compilations not yet started, first in first out
  bool stop = false;

  Impl(std::vector<std::string> vocab, int vocab_size, std::vector<int> eos_ids)
      : info(vocab, xgrammar::VocabType::RAW, vocab_size, std::vector<int32_t>(eos_ids.begin(), eos_ids.end())),
        compiler(info, /*max_threads=*/2, /*cache_enabled=*/true, kStructuredOutputCacheBytes),
        eos(std::move(eos_ids)) {}

  /// A worker's loop; `self` keeps the Impl alive while it runs (the manager detaches its workers).
  static void work(std::shared_ptr<Impl> self) {
    for (;;) {
      Task t;
      {
        std::unique_lock lk(self->mu);
        self->cv.wait(lk, [&] { return self->stop || !self->queue.empty(); });
        if (self->stop) return;  // queued tasks are dropped: their futures report a broken promise
        t = std::move(self->queue.front());
        self->queue.pop_front();
      }
      t();
    }
  }

  /// The compiled constraint (xgrammar's cache first). Throws Error naming the field.
  std::unique_ptr<StructuredOutputGrammar> compile(const StructuredOutputsParams& p) {
    try {
      auto compiled = [&]() -> xgrammar::CompiledGrammar {
        const bool ws = !p.disable_any_whitespace, strict = !p.disable_additional_properties;
        if (p.json) return compiler.CompileJSONSchema(*p.json, ws, std::nullopt, std::nullopt, strict);
        if (p.json_object)  // an object, as OpenAI's json_object mode and vLLM (xgrammar's builtin grammar: any value)
          return compiler.CompileJSONSchema(R"({"type": "object"})", ws, std::nullopt, std::nullopt, strict);
        if (p.regex) return compiler.CompileRegex(*p.regex);
        if (p.choice) return compiler.CompileGrammar(choice_as_grammar(*p.choice), "root");
        if (p.grammar) return compiler.CompileGrammar(*p.grammar, "root");
        return compiler.CompileStructuralTag(*p.structural_tag);
      }();
      return std::make_unique<XgrammarGrammar>(compiled, eos);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail_constraint(p, e.what());
    }
  }
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
    impl_ = std::make_shared<Impl>(std::move(vocab), vocab_size, std::move(eos_token_ids));
  } catch (const std::exception& e) {
    fail("structured outputs: the tokenizer's vocabulary could not be prepared: {}", e.what());
  }
  for (int i = 0; i < kStructuredOutputWorkers; ++i) std::thread(&Impl::work, impl_).detach();
}

StructuredOutputManager::~StructuredOutputManager() {
  if (!impl_) return;
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();  // idle workers exit now, a busy one after its compilation (it holds the Impl)
}

bool StructuredOutputManager::available() { return true; }

namespace {

/// The JSON-schema checks xgrammar's conversion leaves to its compiler: the count keywords non-negative integers, and
/// enums of at most kMaxStructuredOutputChoices values, in schema `s` at `path` and every subschema (the subschema
/// keywords only; the maps of named subschemas walked by name). Depth is bounded before.
void check_schema_counts(const StructuredOutputsParams& p, const nlohmann::json& s, const std::string& path) {
  if (!s.is_object()) return;
  for (const char* key : {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}) {
    const auto it = s.find(key);
    if (it == s.end()) continue;
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
      fail_constraint(p, fmt::format("{}{} must be a non-negative integer (got {})", path, key, json_excerpt(*it)));
  }
  if (const auto it = s.find("enum"); it != s.end() && it->is_array() && it->size() > kMaxStructuredOutputChoices)
    fail_constraint(p, fmt::format("{}enum has {} values; at most {} are accepted", path, it->size(),
                                   kMaxStructuredOutputChoices));
  // Only the keywords whose values are subschemas (JSON Schema 2020-12 and draft 4-7): anything else may be data
  // (enum, const, default, examples, dependentRequired, extensions) that merely looks like a schema.
  static const std::unordered_set<std::string> kOne = {"items", "additionalProperties", "additionalItems", "not", "if",
                                                       "then", "else", "contains", "propertyNames", "unevaluatedItems",
                                                       "unevaluatedProperties", "contentSchema"};
  static const std::unordered_set<std::string> kList = {"anyOf", "oneOf", "allOf", "prefixItems", "items"};
  static const std::unordered_set<std::string> kNamedMaps = {"properties", "patternProperties", "$defs", "definitions",
                                                             "dependentSchemas", "dependencies"};
  for (const auto& [key, v] : s.items()) {
    if (kNamedMaps.count(key) && v.is_object()) {
      for (const auto& [name, sub] : v.items()) check_schema_counts(p, sub, path + key + "." + name + ".");
    } else if (kOne.count(key) && v.is_object()) {
      check_schema_counts(p, v, path + key + ".");
    } else if (kList.count(key) && v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) check_schema_counts(p, v[i], fmt::format("{}{}[{}].", path, key, i));
    }
  }
}

/// check_schema_counts for every JSON schema inside structural tag `t` (at `path`): the values of the "json_schema" keys
/// of its formats (json_schema, qwen_xml_parameter, ... at any nesting), plus a bound of kMaxStructuredOutputChoices
/// entries on the lists of alternatives and tags (an "or" of 100,000 strings compiles for minutes as an enum does;
/// token-id lists such as exclude_tokens compile to a bitmask and are not bounded).
void check_structural_tag_schemas(const StructuredOutputsParams& p, const nlohmann::json& t, const std::string& path) {
  static const std::unordered_set<std::string> kBoundedLists = {"elements", "tags", "triggers"};
  if (t.is_array()) {
    for (size_t i = 0; i < t.size(); ++i) check_structural_tag_schemas(p, t[i], fmt::format("{}[{}]", path, i));
    return;
  }
  if (!t.is_object()) return;
  for (const auto& [key, v] : t.items()) {
    const std::string at = path.empty() ? key : path + "." + key;
    if (v.is_array() && kBoundedLists.count(key) && v.size() > kMaxStructuredOutputChoices)
      fail_constraint(p, fmt::format("{} has {} entries; at most {} are accepted", at, v.size(), kMaxStructuredOutputChoices));
    if (key == "json_schema" && v.is_object()) check_schema_counts(p, v, at + ".");
    else check_structural_tag_schemas(p, v, at);
  }
}

/// validate_structured_outputs' work (uncached).
void validate_uncached(const StructuredOutputsParams& p) {
  p.validate();
  size_t bytes = 0;
  for (const auto* f : {&p.json, &p.regex, &p.grammar, &p.structural_tag})
    if (f->has_value()) bytes += (*f)->size();
  if (p.choice)
    for (const auto& c : *p.choice) bytes += c.size();
  SSM_CHECK(bytes <= kMaxStructuredOutputBytes, "structured_outputs.{} has {} bytes; at most {} are accepted", p.kind(),
            bytes, kMaxStructuredOutputBytes);
  for (const auto* f : {&p.json, &p.structural_tag})
    if (f->has_value()) check_json_depth(**f, fmt::format("structured_outputs.{}", p.kind()), kMaxStructuredOutputJsonDepth);
  SSM_CHECK(!p.choice || p.choice->size() <= kMaxStructuredOutputChoices,
            "structured_outputs.choice has {} choices; at most {} are accepted", p.choice ? p.choice->size() : 0,
            kMaxStructuredOutputChoices);
  if (p.json) {
    const nlohmann::json schema = nlohmann::json::parse(*p.json, nullptr, /*allow_exceptions=*/false);
    if (!schema.is_discarded()) check_schema_counts(p, schema, "");  // invalid JSON: xgrammar's message below
  }
  if (p.structural_tag) {
    const nlohmann::json tag = nlohmann::json::parse(*p.structural_tag, nullptr, /*allow_exceptions=*/false);
    if (!tag.is_discarded()) check_structural_tag_schemas(p, tag, "");
  }
  // The conversion to a grammar (fast: no token tables) finds what xgrammar would refuse.
  try {
    if (p.json)
      (void)xgrammar::Grammar::FromJSONSchema(*p.json, !p.disable_any_whitespace, std::nullopt, std::nullopt,
                                              !p.disable_additional_properties);
    else if (p.regex)
      (void)xgrammar::Grammar::FromRegex(*p.regex);
    else if (p.choice)
      (void)xgrammar::Grammar::FromEBNF(choice_as_grammar(*p.choice), "root");
    else if (p.grammar)
      (void)xgrammar::Grammar::FromEBNF(*p.grammar, "root");
    else if (p.structural_tag) {
      auto r = xgrammar::Grammar::FromStructuralTag(*p.structural_tag);
      if (auto* err = std::get_if<xgrammar::StructuralTagError>(&r))
        std::visit([&](const auto& e) { fail_constraint(p, e.what()); }, *err);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail_constraint(p, e.what());
  }
}

/// Keys of the last kValidatedCacheSize constraints that passed validation (a hash of everything validation reads).
constexpr size_t kValidatedCacheSize = 4096;
struct ValidatedCache {
  std::mutex mu;
  std::unordered_set<size_t> keys;
  std::deque<size_t> order;
};

size_t constraint_key(const StructuredOutputsParams& p) {
  std::string k = p.kind();
  for (const auto* f : {&p.json, &p.regex, &p.grammar, &p.structural_tag})
    if (f->has_value()) k += '\0', k += **f;
  if (p.choice)
    for (const auto& c : *p.choice) k += '\0', k += std::to_string(c.size()), k += ':', k += c;
  k += p.disable_any_whitespace ? "\1w" : "\1-";
  k += p.disable_additional_properties ? "\1a" : "\1-";
  return std::hash<std::string>{}(k);
}

}  // namespace

void validate_structured_outputs(const StructuredOutputsParams& p) {
  static ValidatedCache cache;
  const size_t key = constraint_key(p);
  {
    std::lock_guard lk(cache.mu);
    if (cache.keys.count(key)) return;
  }
  validate_uncached(p);
  std::lock_guard lk(cache.mu);
  if (cache.keys.insert(key).second) {
    cache.order.push_back(key);
    if (cache.order.size() > kValidatedCacheSize) cache.keys.erase(cache.order.front()), cache.order.pop_front();
  }
}

void StructuredOutputManager::validate(const StructuredOutputsParams& p) const { validate_structured_outputs(p); }

std::shared_ptr<PendingGrammar> StructuredOutputManager::compile_async(const StructuredOutputsParams& params) {
  validate(params);
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  Impl::Task task([impl = impl_.get(), p = params, cancelled]() -> std::unique_ptr<StructuredOutputGrammar> {
    if (cancelled->load()) return nullptr;  // aborted while queued: nobody takes the result
    return impl->compile(p);                // (the running worker holds the Impl)
  });
  auto pending = std::make_shared<PendingGrammar>(task.get_future(), cancelled);
  {
    std::lock_guard lk(impl_->mu);
    impl_->queue.push_back(std::move(task));
  }
  impl_->cv.notify_one();
  return pending;
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

void validate_structured_outputs(const StructuredOutputsParams&) {
  fail("structured outputs are not available in this build of ssmserve");
}

void StructuredOutputManager::validate(const StructuredOutputsParams&) const {
  fail("structured outputs are not available in this build of ssmserve");
}

std::shared_ptr<PendingGrammar> StructuredOutputManager::compile_async(const StructuredOutputsParams&) {
  fail("structured outputs are not available in this build of ssmserve");
}

#endif

}  // namespace ssmserve
