// Owns the per-step scheduling decision (vLLM v1 style): a token budget per step, running requests first
// (decodes, then unfinished prefills), then waiting requests FCFS; long prompts are split across steps
// (chunked prefill); a request gets its state block at its first schedule and frees it when finished or
// preempted (preemption by recompute: the request later prefills its prompt and generated tokens again).
#pragma once
#include <deque>
#include <functional>
#include <span>
#include <vector>

#include "cache/state_cache.h"
#include "cache/block_pool.h"
#include "cache/host_state_tier.h"
#include "cache/prefix_cache.h"
#include "cache/prefix_cache_stats.h"
#include "engine/request.h"
#include "model/causal_lm.h"

namespace ssmserve {

/// Scheduler limits.
struct SchedulerConfig {
  int max_num_batched_tokens = 2048;  ///< token budget per step
  int max_num_seqs = 256;             ///< requests per step
  /// Speculative decoding (vllm-ssm-design.md §6): most draft tokens per decode row (k); 0 = off. A decode request
  /// with drafts (RequestState::draft_token_ids) is scheduled as a verify row of 1 + drafts tokens, holding k more
  /// state blocks (RequestState::spec_blocks) for the states after each verified token.
  int num_speculative_tokens = 0;
  /// Prompt tokens scored per step (requests with prompt_logprobs: each scored token costs a logits row and a top-k
  /// over the vocabulary): a scoring request's prefill chunk is cut to what is left of it, so a long prompt is scored
  /// over several steps and other requests' steps stay short. At least one prefix-cache block / chunk-grid step is
  /// allowed (see Scheduler::scoring_budget). 0 = no limit beyond max_num_batched_tokens.
  int max_num_scored_tokens = 0;
};

/// Prefix caching of states (vLLM's mamba_cache_mode, vllm-ssm-design.md §3.2-§3.4).
enum class MambaCacheMode {
  None,   ///< no prefix caching: one running state block per request
  Align,  ///< states cached at block boundaries reached at the end of a step; prefill chunks cut on boundaries
  All,    ///< states cached at every block boundary: the prefill stores those inside a chunk (ScheduledSeq::state_stores),
          ///< finish_step those a step ends on; chunks are not cut on boundaries (only on the model's chunk grid)
};

/// Resolved prefix-caching settings of one engine.
struct PrefixCacheConfig {
  MambaCacheMode mode = MambaCacheMode::None;
  /// mamba_block_size: tokens per cached state (a multiple of hash_granularity, the model's chunk length and, for
  /// hybrids, of the KV block size). Unused with mode None.
  int block_size = 0;
  /// Tokens per block of the token-chain hashes: the KV block size for hybrids (so KV pages are cached too), else
  /// block_size.
  int hash_granularity = 0;
  uint64_t salt = 0;  ///< folded into every hash (model, state dtypes)
  /// The model's one-token decode form rounds apart from its chunked prefill form (SSD, lightning attention, the gated
  /// delta rule; not Mamba-1's scan), so a state depends on which tokens ran as decode rows, not only on the tokens.
  /// Then (with or without caching) a request recomputing generated tokens after a preemption runs them as decode rows,
  /// one per step, as they were generated; and hashes of blocks past a request's prompt fold in its prompt length, so a
  /// state reached while decoding is a hit only for that request's own recompute (a new request prefills those tokens).
  bool decode_rounds_apart = false;
  /// Chunk length of the model's chunked prefill forms (1: none). A prefill chunk that does not finish a request's
  /// tokens ends on this grid (counted from the sequence start) whenever the budget reaches a grid point, with or
  /// without caching: a chunked form cut on its grid rounds exactly as uncut.
  int chunk_alignment = 1;
  bool enabled() const { return mode != MambaCacheMode::None; }
};

/// The copies of the host tier (--swap-space), done by the model (CausalLM::swap_out_state_blocks /
/// swap_in_state_blocks), each of a whole pool page (a cached state, or a hybrid's KV page): swap_out gets {device
/// block, host slot} pairs and runs before anything queued after it on the device; swap_in gets {host slot, device
/// block} pairs and is ordered before the next forward.
struct StateSwapper {
  std::function<void(std::span<const BlockCopy>)> swap_out;
  std::function<void(std::span<const BlockCopy>)> swap_in;
  /// Hybrids: evicted cached KV pages go to host slots too (EngineConfig::swap_kv_pages); false: states only.
  bool swap_kv_pages = false;
};

/// Host-tier counters (blocks).
struct HostTierStats {
  int64_t swap_outs = 0;     ///< evicted cached states copied to host slots
  int64_t swap_ins = 0;      ///< prefix hits whose state came from a host slot
  int64_t kv_swap_outs = 0;  ///< hybrids: evicted cached KV pages copied to host slots
  int64_t kv_swap_ins = 0;   ///< hybrids: KV pages of prefix hits copied back from host slots into fresh pool blocks
};

/// One request's share of a step: tokens [num_computed_tokens, num_computed_tokens + num_tokens).
struct ScheduledRequest {
  RequestState* req = nullptr;
  int num_tokens = 0;
  int num_computed_before = 0;  ///< req->num_computed_tokens when scheduled (after a prefix-cache hit)
  /// Speculative decoding: a verify row's drafts (num_tokens - 1 of req->draft_token_ids, state columns in
  /// req->spec_blocks); 0 for every other row.
  int num_draft_tokens = 0;
  /// "all" mode, prefill chunks: the block boundaries strictly inside the chunk whose states the prefill stores
  /// (ScheduledSeq::state_stores), each into a block allocated for it; registered by finish_step.
  std::vector<StateStore> state_stores;
};

/// The step's batch: decodes (1 token, state present) and prefill chunks, each in scheduling order.
struct SchedulerOutput {
  std::vector<ScheduledRequest> decodes;
  std::vector<ScheduledRequest> prefills;
  /// Prefix-cache hits: cached states copied into the hit requests' running blocks before this step's forward
  /// (CausalLM::copy_state_blocks). The sources stay held until Scheduler::finish_step.
  std::vector<BlockCopy> state_copies;
  int num_scheduled_tokens() const;
  bool empty() const { return decodes.empty() && prefills.empty(); }
};

/// Decides what runs each step. Owns the waiting queue and the running list; does not own requests.
class Scheduler {
 public:
  /// kv_block_size > 0 (hybrid models): running requests also hold KV blocks from the same pool, one per
  /// kv_block_size tokens, allocated as they grow; a request is admitted only when its state block and the KV
  /// blocks of its first chunk are free; when a running request cannot grow, the newest running request is
  /// preempted (vLLM v1), possibly itself.
  ///
  /// prefix (enabled): a request admitted from the waiting queue first looks up the longest cached prefix of its
  /// tokens (a multiple of prefix.block_size, at most its length - 1: the last token is always recomputed),
  /// with every KV block of that prefix cached too for hybrids; it then starts from a copy of the cached state
  /// (SchedulerOutput::state_copies) and shares the KV blocks. States reached at block boundaries are cached by
  /// finish_step. Align mode cuts prefill chunks on block boundaries (and a final chunk at the last boundary
  /// before its end), so a boundary state is the end state of a step.
  Scheduler(SchedulerConfig cfg, BlockPool& pool, StateCache& cache, int kv_block_size = 0, PrefixCacheConfig prefix = {});

  /// Queues a new request (FCFS).
  void add_request(RequestState* req);
  /// Picks this step's work. A prefill chunk never exceeds the remaining budget; a waiting request that
  /// finds no free block stays waiting (FCFS: nothing behind it jumps ahead).
  SchedulerOutput schedule();
  /// Releases a finished or aborted request's blocks and forgets it. Inside a step (between schedule() and
  /// finish_step()) the blocks are released by finish_step, after the request's boundary state is cached.
  void finish_request(RequestState* req);
  /// After the step's forward and the requests' updates: caches the states that reached a block boundary this
  /// step (copies running block -> a new cached block through `copy`, then registers their hashes), registers the
  /// KV blocks that became full (hybrids), releases the step's copy sources and the blocks of requests that
  /// finished in the step. `state_tokens[i]` is how many tokens scheduled request i (decodes, then prefills) folded
  /// into its state (its num_tokens, or the steps of a multi-step decode); a request's boundary state is cached only
  /// when its state holds exactly its num_computed_tokens (a multi-step burst cut short by a stop is not).
  void finish_step(const SchedulerOutput& out, std::span<const int> state_tokens,
                   const std::function<void(std::span<const BlockCopy>)>& copy);
  /// Ends a step whose forward failed (an exception between schedule() and finish_step()): releases its holds and
  /// frees the blocks of requests that finished in it, so the requests can then be aborted safely. Nothing is cached.
  void abandon_step();
  /// Preempts a running request by recompute (vLLM v1): frees its state block, resets num_computed_tokens to 0
  /// and puts it at the front of the waiting queue; when rescheduled it prefills prompt + output so far and
  /// continues exactly where it stopped. No-op for a request that is not running.
  void preempt(RequestState* req);
  /// The running request vLLM would preempt first (the most recently scheduled), or nullptr.
  RequestState* preemption_candidate() const { return running_.empty() ? nullptr : running_.back(); }
  int num_preemptions() const { return num_preemptions_; }
  /// Prefix-cache counters (tokens queried / served from the cache).
  PrefixCacheStats prefix_cache_stats() const { return prefix_stats_; }
  const PrefixCacheConfig& prefix_config() const { return prefix_; }
  /// Running requests that decode next step (their state holds every token but the last): the ones a speculative
  /// proposer drafts for, in scheduling order.
  std::vector<RequestState*> decoding_requests() const;
  /// Blocks a new request could be given now (free + cached-and-unheld), and the cached ones of them.
  int num_available_blocks() const { return blocks_.num_available(); }
  int num_cached_blocks() const { return blocks_.num_cached(); }
  /// Turns on the host tier (--swap-space): `num_slots` host slots of one pool page each; a cached block (a state,
  /// or a hybrid's KV page) evicted from the pool is copied to a slot (swapper.swap_out, at once) and a later hit on
  /// it is copied back (swapper.swap_in, at the end of schedule(), before the step's forward): a state into the
  /// request's running block, a KV page into a fresh pool block the request holds (registered in the pool again by
  /// finish_step). Hybrids: a KV block of a prefix counts as cached when it is in the pool or on the host. Needs
  /// prefix caching; num_slots >= 1 (Error otherwise).
  void enable_host_tier(int num_slots, StateSwapper swapper);
  HostTierStats host_tier_stats() const { return host_stats_; }
  /// Drops every cached prefix state and KV page, in the pool and on the host tier (vLLM's reset_prefix_cache): later
  /// requests prefill from scratch. Only while no request is waiting or running and no step is open (a running
  /// request may hold cached blocks): false, changing nothing, otherwise; true once nothing is cached. The dropped
  /// blocks return to the free list (after the blocks that were free, in their order).
  bool reset_prefix_cache();
  /// Whether a block handed to a waiting request gets its host page zeroed (default true). Device backends keep
  /// and reset their states in device memory and never read the host pages, so the engine turns it off for them.
  void set_zero_host_states(bool on) { zero_host_states_ = on; }

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }

 private:
  /// schedule()'s body (schedule() ends the step's holds when it throws).
  SchedulerOutput schedule_step();
  /// Makes r hold KV blocks for num_computed_tokens + n tokens, preempting the newest running requests (and
  /// unscheduling them from `out`) while the pool is short. False when r itself had to be preempted. Throws
  /// Error when r is the only running request and still does not fit (the pool is too small for it).
  bool reserve_kv(RequestState* r, int n, SchedulerOutput& out, int& budget, int& seqs);
  /// KV blocks a request needs to hold `tokens` tokens.
  int kv_blocks_for(int tokens) const { return kv_block_size_ > 0 ? (tokens + kv_block_size_ - 1) / kv_block_size_ : 0; }
  void free_blocks(RequestState* req);
  /// Speculative decoding: the drafts of decode request r that fit (budget - 1 tokens, state columns it holds or can
  /// get now: running requests' spec blocks come from free / evictable blocks only). Trims r->draft_token_ids.
  int fit_drafts(RequestState* r, int budget);
  /// Takes the speculative state columns back from the newest running request other than r that holds some (its
  /// verify row this step, if any, shrinks to its one token); false when none holds any.
  bool release_spec_blocks(const RequestState* r, SchedulerOutput& out, int& budget);
  /// Releases r's speculative state columns and drops its drafts.
  void release_own_spec_blocks(RequestState* r);
  /// Ends a step's holds: releases the copy sources and the blocks of requests finished in the step.
  void release_step_holds();
  /// Tokens of r's next prefill chunk within `budget` (prefix caching's align mode cuts on block boundaries); 0 when
  /// no aligned chunk fits and `allow_unaligned` is false.
  int prefill_chunk(const RequestState* r, int budget, bool allow_unaligned) const;
  /// The align-mode cut of a chunk of n tokens from c toward len (len: where this run of prefill tokens ends).
  int prefill_chunk_aligned(int c, int len, int n, bool allow_unaligned) const;
  /// Scoring budget of one step (cfg_.max_num_scored_tokens raised to one align-mode block and one chunk-grid step,
  /// so cuts stay aligned); INT_MAX when unlimited.
  int scoring_budget() const;
  /// The token budget r's next prefill chunk may use: `budget`, or less for a request scoring its prompt (the
  /// step's scoring budget left, `score_left`).
  static int chunk_budget(const RequestState* r, int budget, int score_left);
  /// Charges a scheduled chunk of n tokens of r against the step's scoring budget.
  static void charge_scored(const RequestState* r, int n, int& score_left);
  /// Extends r->block_hashes to cover every full hash block of its first `tokens` tokens.
  void extend_hashes(RequestState* r, int tokens) const;
  /// "all" mode: gives each prefill chunk of `out` a cached block for every block boundary strictly inside it whose
  /// state is not cached yet (ScheduledRequest::state_stores), after the step's admissions (running requests first).
  void plan_state_stores(SchedulerOutput& out);
  /// One KV block of a prefix hit: a cached pool block to share (block > 0), else the host slot holding its page.
  struct KvHit {
    int block = 0;
    int slot = -1;
  };
  /// The longest cached prefix of r usable now (see the constructor); fills the state block to copy (or the host
  /// slot holding the state) and, for hybrids, each KV block of the prefix (pool or host tier). 0 when none.
  int find_cached_prefix(RequestState* r, int& state_block, int& host_slot, std::vector<KvHit>& kv);
  /// Whether the KV page of hash block j of r is cached (in the pool, or on the host with the host tier on).
  bool kv_cached(const RequestState* r, int j) const;

  SchedulerConfig cfg_;
  int kv_block_size_ = 0;
  bool preempted_this_step_ = false;
  BlockPool& pool_;
  StateCache& cache_;
  PrefixCacheConfig prefix_;
  PrefixCache blocks_;                      // reference counts, cached-block table and LRU over pool_
  std::vector<int> held_for_step_;          // copy sources, released by finish_step
  std::vector<RequestState*> finished_in_step_;  // finished inside the step: blocks freed by finish_step
  bool in_step_ = false;                    // between schedule() and finish_step()
  bool zero_host_states_ = true;
  std::deque<RequestState*> waiting_;
  std::vector<RequestState*> running_;
  int num_preemptions_ = 0;
  PrefixCacheStats prefix_stats_;
  HostStateTier host_;                      // host slots of evicted states and KV pages (--swap-space); 0 slots: off
  StateSwapper swapper_;
  struct SwapIn {
    RequestState* req;
    BlockCopy copy;  // {host slot, the request's running block (a state) or one of its KV blocks}
    bool kv = false;
  };
  std::vector<SwapIn> swap_ins_;            // this step's, run at the end of schedule()
  std::vector<int> pinned_slots_;           // host slots read by this step's swap-ins, unpinned by finish_step
  HostTierStats host_stats_;
};

}  // namespace ssmserve
