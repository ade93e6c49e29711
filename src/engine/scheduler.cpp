// Owns the scheduler (see scheduler.h).
#include "model/batch_builder.h"
#include "engine/scheduler.h"

#include <algorithm>
#include <limits>

namespace ssmserve {

int SchedulerOutput::num_scheduled_tokens() const {
  int n = 0;
  for (const auto& s : decodes) n += s.num_tokens;
  for (const auto& s : prefills) n += s.num_tokens;
  return n;
}

Scheduler::Scheduler(SchedulerConfig cfg, BlockPool& pool, StateCache& cache, int kv_block_size, PrefixCacheConfig prefix)
    : cfg_(cfg), kv_block_size_(kv_block_size), pool_(pool), cache_(cache), prefix_(prefix), blocks_(pool, prefix.enabled()) {
  SSM_CHECK(kv_block_size >= 0, "kv_block_size must be >= 0 (got {})", kv_block_size);
  if (prefix_.enabled()) {
    const int g = prefix_.hash_granularity, bs = prefix_.block_size;
    SSM_CHECK(g >= 1 && bs >= g && bs % g == 0 && (kv_block_size == 0 || g == kv_block_size),
              "prefix caching: block size {} must be a multiple of the hash granularity {} (the KV block size {} for hybrids)", bs,
              g, kv_block_size);
  }
  SSM_CHECK(cfg.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1 (got {})", cfg.max_num_batched_tokens);
  SSM_CHECK(cfg.max_num_seqs >= 1, "max_num_seqs must be >= 1 (got {})", cfg.max_num_seqs);
}

void Scheduler::add_request(RequestState* req) {
  req->status = RequestStatus::Waiting;
  waiting_.push_back(req);
}

SchedulerOutput Scheduler::schedule() {
  try {
    return schedule_step();
  } catch (...) {
    release_step_holds();  // nothing of this step runs: its holds end now (callers may free requests next)
    throw;
  }
}

void Scheduler::abandon_step() { release_step_holds(); }

SchedulerOutput Scheduler::schedule_step() {
  if (in_step_) release_step_holds();  // the previous step ended without finish_step (an error)
  SchedulerOutput out;
  in_step_ = true;
  int budget = cfg_.max_num_batched_tokens;
  int seqs = 0;
  int score_left = scoring_budget();
  // 1. Running requests: decodes first (one token each, state present), then the next chunk of the others
  //    (unfinished prompts, or prompt + output being recomputed after a preemption).
  auto is_decode = [](const RequestState* r) { return is_decode_row(r->num_computed_tokens, r->num_tokens(), r->prompt_len()); };
  //    Indexed loops: reserve_kv may preempt (erase) requests from the back of running_.
  preempted_this_step_ = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestState* r = running_[i];
    if (budget == 0 || seqs == cfg_.max_num_seqs) break;
    if (is_decode(r)) {
      if (!reserve_kv(r, 1 + fit_drafts(r, budget), out, budget, seqs)) break;
      const int drafts = static_cast<int>(r->draft_token_ids.size());  // reserve_kv may have taken them back
      out.decodes.push_back({r, 1 + drafts, r->num_computed_tokens, drafts});
      budget -= 1 + drafts, ++seqs;
    } else {
      r->draft_token_ids.clear();
    }
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestState* r = running_[i];
    if (budget == 0 || seqs == cfg_.max_num_seqs) break;
    if (!is_decode(r)) {
      const int n = prefill_chunk(r, chunk_budget(r, budget, score_left), out.prefills.empty());
      if (n == 0) continue;  // align mode: no block boundary within the budget left; next step
      if (!reserve_kv(r, n, out, budget, seqs)) break;
      out.prefills.push_back({r, n, r->num_computed_tokens});
      budget -= n, ++seqs;
      charge_scored(r, n, score_left);
    }
  }
  // 2. Waiting requests, FCFS, each getting a zeroed state block (and, for hybrids, the KV blocks of its first
  //    chunk: admitted only when both fit). None when this step preempted someone (vLLM v1).
  //    A request scoring its prompt waits in place while the step's scoring budget is spent; those behind it go on.
  for (size_t w = 0; w < waiting_.size() && budget > 0 && seqs < cfg_.max_num_seqs && !preempted_this_step_;) {
    RequestState* r = waiting_[w];
    if (chunk_budget(r, budget, score_left) == 0) {
      ++w;
      continue;
    }
    // Prefix cache: start from the longest cached prefix (its state copied into a fresh running block, its KV blocks
    // shared; those on the host tier swapped into fresh blocks). The hit blocks are held and the host slots pinned
    // from here on so that nothing below evicts or reuses them.
    int hit_state = 0, hit_slot = -1;
    std::vector<KvHit> hit_kv;
    const int hit = r->num_computed_tokens == 0 && prefix_.enabled() ? find_cached_prefix(r, hit_state, hit_slot, hit_kv) : 0;
    if (hit_state) blocks_.acquire(hit_state);
    if (hit_slot >= 0) host_.pin(hit_slot);  // no swap-out below may reuse the slot this request reads
    int shared = 0;                           // KV blocks shared from the pool (the others need fresh blocks)
    for (const KvHit& k : hit_kv) {
      if (k.block) blocks_.acquire(k.block), ++shared;
      else host_.pin(k.slot);
    }
    const int saved_computed = r->num_computed_tokens;
    r->num_computed_tokens = hit;
    const int n = prefill_chunk(r, chunk_budget(r, budget, score_left), out.prefills.empty());
    if (n == 0 || blocks_.num_available() < 1 + kv_blocks_for(hit + n) - shared) {
      r->num_computed_tokens = saved_computed;
      blocks_.release(hit_state);
      if (hit_slot >= 0) host_.unpin(hit_slot);
      for (const KvHit& k : hit_kv) {
        if (k.block) blocks_.release(k.block);
        else host_.unpin(k.slot);
      }
      break;
    }
    const int block = blocks_.allocate();
    r->kv_blocks.clear();
    // KV blocks from the first one swapped in on are registered by finish_step (the pool's ones are kept as they are).
    r->num_kv_registered = static_cast<int>(hit_kv.size());
    for (const KvHit& k : hit_kv) {
      if (k.block) {
        r->kv_blocks.push_back(k.block);
        continue;
      }
      const int kb = blocks_.allocate();
      r->num_kv_registered = std::min(r->num_kv_registered, static_cast<int>(r->kv_blocks.size()));
      r->kv_blocks.push_back(kb);
      swap_ins_.push_back({r, {k.slot, kb}, true});  // the host tier's copy, ordered before the forward
      pinned_slots_.push_back(k.slot);               // unpinned by finish_step
    }
    while (static_cast<int>(r->kv_blocks.size()) < kv_blocks_for(hit + n)) r->kv_blocks.push_back(blocks_.allocate());
    if (hit_state) {
      out.state_copies.push_back({hit_state, block});
      held_for_step_.push_back(hit_state);  // released by finish_step, after the copy ran
    } else if (hit_slot >= 0) {
      swap_ins_.push_back({r, {hit_slot, block}});  // the host tier's copy, ordered before the forward
      pinned_slots_.push_back(hit_slot);             // unpinned by finish_step
    } else if (zero_host_states_) {
      cache_.zero_block(block);
    }
    if (r->num_cached_tokens < 0) {  // first schedule: count the lookup (a resumed preemption is not a new query)
      r->num_cached_tokens = hit;
      if (prefix_.enabled() && !r->request.params.prompt_logprobs) {
        prefix_stats_.requests += 1;
        prefix_stats_.queries += r->prompt_len();
        prefix_stats_.hits += hit;
      }
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
    r->state_block = block;
    r->status = RequestStatus::Running;
    running_.push_back(r);
    out.prefills.push_back({r, n, r->num_computed_tokens});
    budget -= n, ++seqs;
    charge_scored(r, n, score_left);
  }
  if (prefix_.mode == MambaCacheMode::All) plan_state_stores(out);
  if (!swap_ins_.empty()) {
    // Hits on host slots: copied into the running blocks (states) and KV blocks of the requests still scheduled (not
    // preempted above).
    std::vector<BlockCopy> copies;
    for (const SwapIn& s : swap_ins_) {
      const RequestState* q = s.req;
      if (q->status != RequestStatus::Running) continue;
      if (s.kv ? std::find(q->kv_blocks.begin(), q->kv_blocks.end(), s.copy.dst) == q->kv_blocks.end() : q->state_block != s.copy.dst)
        continue;
      copies.push_back(s.copy);
      ++(s.kv ? host_stats_.kv_swap_ins : host_stats_.swap_ins);
    }
    swap_ins_.clear();
    if (!copies.empty()) swapper_.swap_in(copies);
  }
  return out;
}

int Scheduler::scoring_budget() const {
  if (cfg_.max_num_scored_tokens <= 0) return std::numeric_limits<int>::max();
  int b = std::max(cfg_.max_num_scored_tokens, prefix_.chunk_alignment);
  if (prefix_.mode == MambaCacheMode::Align) b = std::max(b, prefix_.block_size);
  return b;
}

namespace {
/// Whether r's next prefill chunk scores prompt tokens (position p scores token p + 1 of the prompt).
bool scores_prompt(const RequestState* r) {
  return r->request.params.prompt_logprobs.has_value() && r->num_computed_tokens + 1 < r->prompt_len();
}
}  // namespace

int Scheduler::chunk_budget(const RequestState* r, int budget, int score_left) {
  return scores_prompt(r) ? std::min(budget, score_left) : budget;
}

void Scheduler::charge_scored(const RequestState* r, int n, int& score_left) {
  if (scores_prompt(r) && score_left != std::numeric_limits<int>::max()) score_left = std::max(0, score_left - n);
}

bool Scheduler::reset_prefix_cache() {
  if (in_step_ || has_unfinished()) return false;
  // 1. No request holds a block, so every cached block is unheld: allocating every available block takes the free
  //    ones, then evicts each cached one (its hash dropped). Meanwhile the host tier has no slots, so the eviction
  //    hook (enable_host_tier) copies nothing out.
  const int host_slots = host_.num_slots();
  host_ = HostStateTier(0);
  std::vector<int> taken;
  taken.reserve(static_cast<size_t>(blocks_.num_available()));
  for (int b = blocks_.allocate(); b != 0; b = blocks_.allocate()) taken.push_back(b);
  // 2. Released last-taken first: uncached now, they go back on the free list, whose LIFO order then hands out the
  //    blocks that were free first, as before.
  for (auto it = taken.rbegin(); it != taken.rend(); ++it) blocks_.release(*it);
  // 3. An empty host tier of the same size.
  host_ = HostStateTier(host_slots);
  return blocks_.num_cached() == 0;
}

void Scheduler::enable_host_tier(int num_slots, StateSwapper swapper) {
  SSM_CHECK(prefix_.enabled() && num_slots >= 1 && swapper.swap_out && swapper.swap_in,
            "the host tier needs prefix caching, at least one slot and both copies");
  host_ = HostStateTier(num_slots);
  swapper_ = std::move(swapper);
  blocks_.set_on_evict([this](int block, CachedKind kind, const BlockHash& hash) {
    // A state or (swap_kv_pages) a hybrid's KV page: either is one pool page, swapped whole.
    if (kind == CachedKind::Kv && !swapper_.swap_kv_pages) return;
    if (const int s = host_.lookup(kind, hash); s >= 0) return host_.touch(s);
    const int slot = host_.insert(kind, hash);
    if (slot < 0) return;  // every slot is read by this step's swap-ins
    const BlockCopy c{block, slot};
    swapper_.swap_out(std::span(&c, 1));  // before the block is handed out and written again
    ++(kind == CachedKind::Kv ? host_stats_.kv_swap_outs : host_stats_.swap_outs);
  });
}

bool Scheduler::reserve_kv(RequestState* r, int n, SchedulerOutput& out, int& budget, int& seqs) {
  int need = kv_blocks_for(r->num_computed_tokens + n) - static_cast<int>(r->kv_blocks.size());
  if (need <= 0) return true;
  while (blocks_.num_available() < need) {
    // Speculative state columns are optional: take them back (other requests' first, their verify rows shrunk to one
    // token, then r's own drafts) before preempting anyone.
    if (release_spec_blocks(r, out, budget)) continue;
    if (!r->spec_blocks.empty()) {
      release_own_spec_blocks(r);
      n = 1;
      need = kv_blocks_for(r->num_computed_tokens + n) - static_cast<int>(r->kv_blocks.size());
      if (need <= 0) return true;
      continue;
    }
    RequestState* victim = running_.back();
    if (victim == r && running_.size() == 1)
      fail("the block pool ({} blocks incl. the null block) cannot hold request \"{}\": {} tokens need {} KV blocks of {} tokens "
           "plus its state block; raise --num-state-blocks",
           pool_.num_blocks(), r->request.request_id, r->num_computed_tokens + n, kv_blocks_for(r->num_computed_tokens + n),
           kv_block_size_);
    // Unschedule the victim if it already got work this step.
    for (auto* list : {&out.decodes, &out.prefills})
      for (auto it = list->begin(); it != list->end(); ++it)
        if (it->req == victim) {
          budget += it->num_tokens, --seqs;
          list->erase(it);
          break;
        }
    preempt(victim);
    preempted_this_step_ = true;
    if (victim == r) return false;
  }
  for (int i = 0; i < need; ++i) r->kv_blocks.push_back(blocks_.allocate());
  return true;
}

bool Scheduler::release_spec_blocks(const RequestState* r, SchedulerOutput& out, int& budget) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    RequestState* q = *it;
    if (q == r || q->spec_blocks.empty()) continue;
    for (ScheduledRequest& d : out.decodes)
      if (d.req == q && d.num_draft_tokens > 0) {  // its verify row becomes a plain decode row
        budget += d.num_draft_tokens;
        d.num_tokens = 1, d.num_draft_tokens = 0;
      }
    release_own_spec_blocks(q);
    return true;
  }
  return false;
}

void Scheduler::release_own_spec_blocks(RequestState* r) {
  for (int b : r->spec_blocks) blocks_.release(b);
  r->spec_blocks.clear();
  r->draft_token_ids.clear();
}

int Scheduler::fit_drafts(RequestState* r, int budget) {
  std::vector<int32_t>& d = r->draft_token_ids;
  const int k = cfg_.num_speculative_tokens;
  if (k <= 0) {
    d.clear();
    return 0;
  }
  // Drafts past max_tokens would be verified for nothing: the request stops before them.
  const int left = r->request.params.max_tokens - static_cast<int>(r->output_token_ids.size()) - 1;
  int n = std::min({static_cast<int>(d.size()), k, budget - 1, std::max(0, left)});
  // State columns 1..n: held from the first verify row on; new ones only from blocks nobody needs (free or cached).
  while (static_cast<int>(r->spec_blocks.size()) < n && blocks_.num_available() > 0) r->spec_blocks.push_back(blocks_.allocate());
  n = std::max(0, std::min(n, static_cast<int>(r->spec_blocks.size())));
  d.resize(static_cast<size_t>(n));
  return n;
}

std::vector<RequestState*> Scheduler::decoding_requests() const {
  std::vector<RequestState*> out;
  for (RequestState* r : running_)
    if (is_decode_row(r->num_computed_tokens, r->num_tokens(), r->prompt_len())) out.push_back(r);
  return out;
}

void Scheduler::free_blocks(RequestState* req) {
  release_own_spec_blocks(req);
  blocks_.release(req->state_block);
  req->state_block = 0;
  // KV blocks are not zeroed: every slot is written before it is read. A cached one stays in the table (evictable).
  for (int b : req->kv_blocks) blocks_.release(b);
  req->kv_blocks.clear();
  req->num_kv_registered = 0;
}

void Scheduler::preempt(RequestState* req) {
  if (req->status != RequestStatus::Running) return;
  free_blocks(req);
  req->num_computed_tokens = 0;
  req->status = RequestStatus::Preempted;
  std::erase(running_, req);
  waiting_.push_front(req);
  ++num_preemptions_;
}

void Scheduler::finish_request(RequestState* req) {
  if (in_step_ && prefix_.enabled() && req->status == RequestStatus::Running) {
    // Inside a step: keep the blocks until finish_step has cached the request's boundary state and KV pages.
    finished_in_step_.push_back(req);
  } else {
    free_blocks(req);
  }
  req->status = RequestStatus::Finished;
  std::erase(running_, req);
  std::erase(waiting_, req);
}

}  // namespace ssmserve

namespace ssmserve {

int Scheduler::prefill_chunk(const RequestState* r, int budget, bool allow_unaligned) const {
  const int c = r->num_computed_tokens, len = r->num_tokens(), rem = len - c, prompt = r->prompt_len();
  int n = std::min(budget, rem);
  if (prefix_.decode_rounds_apart && rem > 1) {
    // Recomputing after a preemption: the prompt as a prefill, then each generated token as the decode row it was.
    if (c >= prompt) return std::min(n, 1);
    if (len > prompt) return n = std::min(n, prompt - c), prefill_chunk_aligned(c, prompt, n, allow_unaligned);
  }
  return prefill_chunk_aligned(c, len, n, allow_unaligned);
}

int Scheduler::prefill_chunk_aligned(int c, int len, int n, bool allow_unaligned) const {
  const int rem = len - c;
  if (const int a = prefix_.chunk_alignment; a > 1 && n < rem) {
    const int g = (c + n) / a * a;
    if (g > c) n = g - c;
    else if (!allow_unaligned) return 0;  // no grid point within the budget left: next step (the oldest goes on)
  }
  if (prefix_.mode != MambaCacheMode::Align || n <= 1) return n;
  const int bs = prefix_.block_size;
  // The chunk ends on the last block boundary it reaches (the state there is the step's end state, cached by
  // finish_step).
  if (n < rem) {
    const int b = (c + n) / bs * bs;
    return b > c ? b - c : (allow_unaligned ? n : 0);
  }
  // The final chunk stops at the last boundary before its end (the state a repeat of these tokens can use: a hit
  // leaves the last token to recompute); its tail, up to one block, runs next step (and its end state is cached too
  // when it ends on a boundary).
  const int b = (len - 1) / bs * bs;
  return b > c ? b - c : n;
}

void Scheduler::extend_hashes(RequestState* r, int tokens) const {
  const int g = prefix_.hash_granularity;
  // Blocks past the prompt of a model whose decode form rounds apart: the state depends on where decoding began.
  const int split = prefix_.decode_rounds_apart ? r->prompt_len() : std::numeric_limits<int>::max();
  const uint64_t decode_salt = prefix_.salt ^ (0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(split) + 1));
  std::vector<int32_t> ids(static_cast<size_t>(g));
  while (static_cast<int>(r->block_hashes.size() + 1) * g <= tokens) {
    const int start = static_cast<int>(r->block_hashes.size()) * g;
    for (int i = 0; i < g; ++i) ids[static_cast<size_t>(i)] = r->token_at(start + i);
    const BlockHash parent = !r->block_hashes.empty()         ? r->block_hashes.back()
                             : r->request.cache_salt.empty() ? BlockHash{}
                                                             : cache_salt_root(r->request.cache_salt);
    r->block_hashes.push_back(hash_block_tokens(parent, ids, start + g > split ? decode_salt : prefix_.salt));
  }
}

bool Scheduler::kv_cached(const RequestState* r, int j) const {
  const BlockHash& h = r->block_hashes[static_cast<size_t>(j)];
  return blocks_.lookup(CachedKind::Kv, h) != 0 || (host_.num_slots() > 0 && host_.lookup(CachedKind::Kv, h) >= 0);
}

int Scheduler::find_cached_prefix(RequestState* r, int& state_block, int& host_slot, std::vector<KvHit>& kv) {
  state_block = 0;
  host_slot = -1;
  kv.clear();
  // A request that wants prompt logprobs needs every prompt position's logits: no hit (as vLLM).
  if (r->request.params.prompt_logprobs) return 0;
  const int bs = prefix_.block_size, g = prefix_.hash_granularity;
  int k = (r->num_tokens() - 1) / bs;  // the last token is always recomputed (its logits are needed)
  if (k <= 0) return 0;
  extend_hashes(r, k * bs);
  if (kv_block_size_ > 0) {  // every KV block of the prefix must be cached (pool or host): the hit ends at the first missing one
    int m = 0;
    while (m < k * bs / g && kv_cached(r, m)) ++m;
    k = std::min(k, m * g / bs);
  }
  for (; k > 0; --k) {
    const BlockHash& h = r->block_hashes[static_cast<size_t>(k * bs / g - 1)];
    const int b = blocks_.lookup(CachedKind::State, h);
    const int slot = b == 0 && host_.num_slots() > 0 ? host_.lookup(CachedKind::State, h) : -1;  // the host tier (--swap-space)
    if (b == 0 && slot < 0) continue;
    state_block = b;
    host_slot = slot;
    if (b) blocks_.touch(b);
    else host_.touch(slot);
    for (int j = 0; j < k * bs / std::max(1, kv_block_size_) && kv_block_size_ > 0; ++j) {
      const BlockHash& kh = r->block_hashes[static_cast<size_t>(j)];
      KvHit x;
      x.block = blocks_.lookup(CachedKind::Kv, kh);
      if (x.block) blocks_.touch(x.block);
      else x.slot = host_.lookup(CachedKind::Kv, kh), host_.touch(x.slot);  // present: kv_cached above
      kv.push_back(x);
    }
    return k * bs;
  }
  return 0;
}

void Scheduler::plan_state_stores(SchedulerOutput& out) {
  const int bs = prefix_.block_size, g = prefix_.hash_granularity;
  for (ScheduledRequest& s : out.prefills) {
    RequestState* r = s.req;
    const int c = s.num_computed_before, end = c + s.num_tokens;
    // Boundaries in (c, end): the one at `end` is the step's end state, cached by finish_step.
    for (int b = (c / bs + 1) * bs; b < end; b += bs) {
      extend_hashes(r, b);
      if (blocks_.lookup(CachedKind::State, r->block_hashes[static_cast<size_t>(b / g - 1)])) continue;
      const int dst = blocks_.allocate();
      if (dst == 0) return;  // every block is held by running requests: they win over the cache
      held_for_step_.push_back(dst);  // released by finish_step: cached there when the step ran, else freed
      s.state_stores.push_back({b - c, dst});
    }
  }
}

void Scheduler::finish_step(const SchedulerOutput& out, std::span<const int> state_tokens,
                            const std::function<void(std::span<const BlockCopy>)>& copy) {
  in_step_ = false;
  if (prefix_.enabled()) {
    const int bs = prefix_.block_size, g = prefix_.hash_granularity;
    std::vector<BlockCopy> copies;
    std::vector<std::pair<BlockHash, int>> to_insert;
    size_t i = 0;
    for (const auto* list : {&out.decodes, &out.prefills})
      for (const ScheduledRequest& s : *list) {
        RequestState* r = s.req;
        const int pos = s.num_computed_before + state_tokens[i++];
        // The state (and KV) hold tokens [0, pos) only when the request's bookkeeping agrees.
        if (pos != r->num_computed_tokens || pos <= 0) continue;
        extend_hashes(r, pos);
        // "all" mode: the states the prefill stored at the boundaries inside its chunk (their blocks are held for
        // the step and become evictable cached blocks when release_step_holds drops that hold).
        for (const StateStore& st : s.state_stores)
          blocks_.insert(CachedKind::State, r->block_hashes[static_cast<size_t>((s.num_computed_before + st.offset) / g - 1)], st.block);
        if (kv_block_size_ > 0) {
          for (; r->num_kv_registered < pos / g && r->num_kv_registered < static_cast<int>(r->kv_blocks.size()); ++r->num_kv_registered)
            blocks_.insert(CachedKind::Kv, r->block_hashes[static_cast<size_t>(r->num_kv_registered)],
                           r->kv_blocks[static_cast<size_t>(r->num_kv_registered)]);
        }
        if (pos % bs != 0) continue;
        const BlockHash& h = r->block_hashes[static_cast<size_t>(pos / g - 1)];
        if (blocks_.lookup(CachedKind::State, h)) continue;
        const int src = r->state_block;
        if (src == 0) continue;
        const int dst = blocks_.allocate();
        if (dst == 0) continue;  // every block is held by running requests: skip (they win over the cache)
        copies.push_back({src, dst});
        to_insert.emplace_back(h, dst);
      }
    if (!copies.empty()) copy(copies);
    for (const auto& [h, b] : to_insert) {
      blocks_.insert(CachedKind::State, h, b);
      blocks_.release(b);  // unheld: evictable, most recently used
    }
  }
  release_step_holds();
}

void Scheduler::release_step_holds() {
  in_step_ = false;
  for (int b : held_for_step_) blocks_.release(b);
  held_for_step_.clear();
  for (int s : pinned_slots_) host_.unpin(s);
  pinned_slots_.clear();
  swap_ins_.clear();
  for (RequestState* r : finished_in_step_) free_blocks(r);
  finished_in_step_.clear();
}

}  // namespace ssmserve
