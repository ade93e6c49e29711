// Owns the draft-model proposer (see draft_model_proposer.h).
#include "engine/draft_model_proposer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "config/hf_json.h"
#include "core/error.h"
#include "engine/engine_config.h"
#include "engine/request.h"
#include "model/batch_builder.h"
#include "tokenizer/tokenizer.h"

namespace ssmserve {

namespace {

/// A probe text whose ids tell two tokenizers apart (letters, digits, punctuation, spaces, non-ASCII).
constexpr const char* kProbe = "The quick brown fox, 1234 jumps over the lazy dog!\n\tCaf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 end.";

bool has_tokenizer(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer.model.v3", "tokenizer.model.v1"})
    if (std::filesystem::exists(dir / f, ec)) return true;
  return false;
}

/// The model_type of the folder's config.json, "" when it has none.
std::string model_type_of(const std::filesystem::path& dir) {
  try {
    const nlohmann::json c = parse_hf_json(read_text_file(dir / "config.json"), (dir / "config.json").string());
    return c.is_object() && c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : "";
  } catch (const Error&) {
    return "";
  }
}

/// Why the draft's tokenizer (`draft`, in `dir`) gives other ids for kProbe (`draft_ids`) than the target's (`target`,
/// in `target_dir`; `target_ids`): the classes transformers loads them as when those differ (the same vocabulary split
/// into words by another pre-tokenizer, e.g. Qwen3_5Tokenizer's regex against tokenizer.json's own ByteLevel; the
/// class follows config.json's model_type, so identical tokenizer files can differ), then the first token that differs.
std::string tokenizer_difference(const std::filesystem::path& dir, const Tokenizer& draft, const std::vector<int>& draft_ids,
                                 const std::filesystem::path& target_dir, const Tokenizer& target,
                                 const std::vector<int>& target_ids) {
  auto cls = [](const Tokenizer& t, const std::filesystem::path& folder) {
    std::string notes = t.tokenizer_class().empty() ? "tokenizer.json's own pipeline" : "";
    if (const std::string type = model_type_of(folder); !type.empty())
      notes += fmt::format("{}model_type \"{}\"", notes.empty() ? "" : "; ", type);
    const std::string name = t.tokenizer_class().empty() ? "TokenizersBackend" : t.tokenizer_class();
    return notes.empty() ? name : fmt::format("{} ({})", name, notes);
  };
  const std::string why =
      target.tokenizer_class() == draft.tokenizer_class()
          ? std::string("the same text gets other token ids")
          : fmt::format("transformers loads the draft's tokenizer as {} and the target's as {}, which split text into "
                        "words differently (the class follows config.json's model_type and tokenizer_config.json's "
                        "tokenizer_class, also for identical tokenizer files)",
                        cls(draft, dir), cls(target, target_dir));
  size_t k = 0;
  while (k < target_ids.size() && k < draft_ids.size() && target_ids[k] == draft_ids[k]) ++k;
  auto piece = [k](const Tokenizer& t, const std::vector<int>& ids) {
    return k < ids.size() ? fmt::format("{:?}", t.decode(std::span<const int>(&ids[k], 1))) : std::string("nothing");
  };
  return fmt::format("--speculative-config: the draft model \"{}\" has another tokenizer than the target: {}; at token {} "
                     "of a probe text the draft has {} where the target has {}",
                     dir.string(), why, k, piece(draft, draft_ids), piece(target, target_ids));
}

}  // namespace

int64_t draft_pool_blocks(int max_seqs, int max_model_len, int kv_block_size) {
  // A committed and a scratch state per request.
  int64_t blocks = 2LL * max_seqs + 1;
  if (kv_block_size > 0) {
    // Hybrid drafts: KV pages as the target's default pool has them (llm_engine.cpp), one partly filled page per
    // request plus the pages of one request at the whole context (+ k drafted positions), not every request at the
    // whole context: that was max_seqs x context, GiBs for a tiny draft, allocated and zeroed up front.
    const int64_t ctx = max_model_len > 0 ? std::min(max_model_len, 1 << 20) : kDefaultMaxModelLenWithoutLimit;
    blocks += max_seqs + (ctx + kMaxSpeculativeTokens + kv_block_size - 1) / kv_block_size;
  }
  return blocks;
}

DraftModelProposer::DraftModelProposer(const std::filesystem::path& dir, int target_vocab,
                                       const std::filesystem::path& target_tokenizer, int max_seqs, int max_model_len)
    : target_vocab_(target_vocab) {
  std::error_code ec;
  SSM_CHECK(std::filesystem::exists(dir, ec), "--speculative-config: draft model folder \"{}\" does not exist", dir.string());
  SSM_CHECK(std::filesystem::is_directory(dir, ec), "--speculative-config: draft model \"{}\" is not a folder", dir.string());
  try {
    model_ = load_model(dir, LoadFormat::Auto, "cpu", 1);
  } catch (const Error& e) {
    fail("--speculative-config: the draft model \"{}\" does not load: {}", dir.string(), e.what());
  }
  const int dv = model_->config().vocab_size;
  SSM_CHECK(dv <= target_vocab, "--speculative-config: the draft model's vocabulary ({} tokens) is larger than the target's ({})",
            dv, target_vocab);
  // The same tokenizer: the same vocabulary size and the same ids for a probe text.
  if (has_tokenizer(dir) && !target_tokenizer.empty() && has_tokenizer(target_tokenizer)) {
    const Tokenizer a = Tokenizer::from_pretrained(target_tokenizer), b = Tokenizer::from_pretrained(dir);
    SSM_CHECK(a.vocab_size() == b.vocab_size(),
              "--speculative-config: the draft model \"{}\" has another tokenizer than the target (a vocabulary of {} tokens "
              "against {})", dir.string(), b.vocab_size(), a.vocab_size());
    const std::vector<int> ia = a.encode(kProbe), ib = b.encode(kProbe);
    if (ia != ib) throw Error(tokenizer_difference(dir, b, ib, target_tokenizer, a, ia));
  }
  int64_t blocks = draft_pool_blocks(max_seqs, max_model_len, model_->kv_block_size());
  const StateShape shape = model_->state_shape();
  const double block_bytes =
      static_cast<double>(StateCache(model_->num_state_layers(), shape, 2).bytes_per_block());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const double ram = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  if (ram > 0 && block_bytes * static_cast<double>(blocks) > 0.25 * ram) {
    blocks = static_cast<int64_t>(0.25 * ram / block_bytes);
    SSM_CHECK(blocks >= 3, "--speculative-config: the draft model's state blocks ({:.1f} MiB each) do not fit in memory",
              block_bytes / 1048576.0);
    spdlog::warn("speculative decoding: the draft model gets {} state blocks (memory); requests beyond them get no drafts", blocks);
  }
  cache_ = std::make_unique<StateCache>(model_->num_state_layers(), shape, static_cast<int>(blocks));
  for (int b = static_cast<int>(blocks) - 1; b >= 1; --b) free_.push_back(b);
  spdlog::info("speculative decoding: draft model {} ({} state blocks)", dir.string(), blocks);
}

DraftModelProposer::~DraftModelProposer() = default;

int DraftModelProposer::allocate_block() {
  if (free_.empty()) return 0;
  const int b = free_.back();
  free_.pop_back();
  return b;
}

void DraftModelProposer::release(const std::string& request_id) {
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return;
  for (int b : {it->second.committed, it->second.scratch})
    if (b) free_.push_back(b);
  for (int b : it->second.kv_blocks) free_.push_back(b);
  slots_.erase(it);
}

bool DraftModelProposer::reserve_kv(Slot& s, int tokens) {
  const int kvbs = model_->kv_block_size();
  if (kvbs <= 0) return true;
  const size_t need = static_cast<size_t>((tokens + kvbs - 1) / kvbs);
  if (need <= s.kv_blocks.size()) return true;
  if (need - s.kv_blocks.size() > free_.size()) return false;  // all or nothing: a partial table would only hold pages
  while (s.kv_blocks.size() < need) s.kv_blocks.push_back(allocate_block());
  return true;
}

std::vector<int32_t> DraftModelProposer::run(const std::vector<ScheduledSeq>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                                             const std::vector<std::vector<int32_t>>& tables) {
  BatchBuilderOptions opt;
  opt.meta.chunk_size = model_->chunk_size();
  opt.kv_block_size = model_->kv_block_size();
  opt.linear_attention = model_->has_linear_attention();
  ForwardBatch batch = build_forward_batch(seqs, tokens, tables, opt);
  for (size_t i = 0; i < seqs.size(); ++i)
    batch.logits_indices.push_back(batch.seq_first_token[i] + seqs[i].num_scheduled_tokens - 1);
  const int V = model_->config().vocab_size;
  logits_.resize(seqs.size() * static_cast<size_t>(V));
  model_->forward(batch, *cache_, logits_.data());
  std::vector<int32_t> next(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const float* row = logits_.data() + i * static_cast<size_t>(V);
    next[i] = static_cast<int32_t>(std::max_element(row, row + V) - row);  // greedy, lowest id on ties
  }
  return next;
}

void DraftModelProposer::propose(std::span<RequestState* const> reqs, int k) {
  // 1. Catch-up: each request's committed state over the tokens it added since (at least its last known token);
  //    the logits at its last token give draft 1.
  std::vector<RequestState*> live;
  std::vector<Slot*> slot_of;
  std::vector<ScheduledSeq> seqs;
  std::vector<std::vector<int32_t>> tokens, tables;
  for (RequestState* r : reqs) {
    r->draft_token_ids.clear();
    Slot& s = slots_[r->request.request_id];
    if (s.num_computed > r->num_tokens() - 1) s.num_computed = 0;  // the request's tokens changed (not expected): redo
    if (!s.committed) s.committed = allocate_block(), s.num_computed = 0;
    if (!s.scratch) s.scratch = allocate_block();
    if (!s.committed || !s.scratch) continue;  // out of blocks: no drafts for this one
    if (s.num_computed == 0) cache_->zero_block(s.committed);
    const int n = r->num_tokens() - s.num_computed;
    if (!reserve_kv(s, r->num_tokens() + k)) continue;  // out of KV pages: no drafts for this one this step
    std::vector<int32_t> t;
    for (int p = s.num_computed; p < r->num_tokens(); ++p) t.push_back(r->token_at(p));
    seqs.push_back({s.committed, s.num_computed, n, !(n == 1 && s.num_computed > 0)});
    tokens.push_back(std::move(t));
    tables.push_back(s.kv_blocks);
    live.push_back(r);
    slot_of.push_back(&s);
  }
  if (live.empty()) return;
  std::vector<int32_t> next = run(seqs, tokens, tables);
  std::vector<BlockCopy> copies;
  for (size_t i = 0; i < live.size(); ++i) {
    slot_of[i]->num_computed = live[i]->num_tokens();
    live[i]->draft_token_ids.push_back(next[i]);
    copies.push_back({slot_of[i]->committed, slot_of[i]->scratch});
  }
  // 2. Drafts 2..k on the scratch copies (the committed states stay at the known tokens).
  if (k > 1) model_->copy_state_blocks(copies, *cache_);
  for (int j = 1; j < k; ++j) {
    seqs.clear(), tokens.clear(), tables.clear();
    for (size_t i = 0; i < live.size(); ++i) {
      seqs.push_back({slot_of[i]->scratch, live[i]->num_tokens() + j - 1, 1, false});
      tokens.push_back({live[i]->draft_token_ids.back()});
      tables.push_back(slot_of[i]->kv_blocks);
    }
    next = run(seqs, tokens, tables);
    for (size_t i = 0; i < live.size(); ++i) live[i]->draft_token_ids.push_back(next[i]);
  }
  for (RequestState* r : live)
    for (int32_t& t : r->draft_token_ids) t = std::min(t, target_vocab_ - 1);
}

}  // namespace ssmserve
