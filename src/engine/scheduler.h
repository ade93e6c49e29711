// Owns the per-step scheduling decision (vLLM v1 style): a token budget per step, running requests first
// (decodes, then unfinished prefills), then waiting requests FCFS; long prompts are split across steps
// (chunked prefill); a request gets its state block at its first schedule and frees it when finished or
// preempted (preemption by recompute: the request later prefills its prompt and generated tokens again).
#pragma once
#include <deque>
#include <vector>

#include "cache/state_cache.h"
#include "cache/block_pool.h"
#include "cache/prefix_cache_stats.h"
#include "engine/request.h"

namespace ssmserve {

/// Scheduler limits.
struct SchedulerConfig {
  int max_num_batched_tokens = 2048;  ///< token budget per step
  int max_num_seqs = 256;             ///< requests per step
};

/// One request's share of a step: tokens [num_computed_tokens, num_computed_tokens + num_tokens).
struct ScheduledRequest {
  RequestState* req = nullptr;
  int num_tokens = 0;
};

/// The step's batch: decodes (1 token, state present) and prefill chunks, each in scheduling order.
struct SchedulerOutput {
  std::vector<ScheduledRequest> decodes;
  std::vector<ScheduledRequest> prefills;
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
  Scheduler(SchedulerConfig cfg, BlockPool& pool, StateCache& cache, int kv_block_size = 0);

  /// Queues a new request (FCFS).
  void add_request(RequestState* req);
  /// Picks this step's work. A prefill chunk never exceeds the remaining budget; a waiting request that
  /// finds no free block stays waiting (FCFS: nothing behind it jumps ahead).
  SchedulerOutput schedule();
  /// Releases a finished or aborted request's block and forgets it.
  void finish_request(RequestState* req);
  /// Preempts a running request by recompute (vLLM v1): frees its state block, resets num_computed_tokens to 0
  /// and puts it at the front of the waiting queue; when rescheduled it prefills prompt + output so far and
  /// continues exactly where it stopped. No-op for a request that is not running.
  void preempt(RequestState* req);
  /// The running request vLLM would preempt first (the most recently scheduled), or nullptr.
  RequestState* preemption_candidate() const { return running_.empty() ? nullptr : running_.back(); }
  int num_preemptions() const { return num_preemptions_; }
  /// Prefix-cache counters (tokens queried / served from the cache).
  PrefixCacheStats prefix_cache_stats() const { return prefix_stats_; }
  /// Whether a block handed to a waiting request gets its host page zeroed (default true). Device backends keep
  /// and reset their states in device memory and never read the host pages, so the engine turns it off for them.
  void set_zero_host_states(bool on) { zero_host_states_ = on; }

  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }

 private:
  /// Makes r hold KV blocks for num_computed_tokens + n tokens, preempting the newest running requests (and
  /// unscheduling them from `out`) while the pool is short. False when r itself had to be preempted. Throws
  /// Error when r is the only running request and still does not fit (the pool is too small for it).
  bool reserve_kv(RequestState* r, int n, SchedulerOutput& out, int& budget, int& seqs);
  /// KV blocks a request needs to hold `tokens` tokens.
  int kv_blocks_for(int tokens) const { return kv_block_size_ > 0 ? (tokens + kv_block_size_ - 1) / kv_block_size_ : 0; }
  void free_blocks(RequestState* req);

  SchedulerConfig cfg_;
  int kv_block_size_ = 0;
  bool preempted_this_step_ = false;
  BlockPool& pool_;
  StateCache& cache_;
  bool zero_host_states_ = true;
  std::deque<RequestState*> waiting_;
  std::vector<RequestState*> running_;
  int num_preemptions_ = 0;
  PrefixCacheStats prefix_stats_;
};

}  // namespace ssmserve
