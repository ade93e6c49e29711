// Owns the engine loop of the server: one thread owns the LLMEngine (which is single-threaded) and runs
// add/abort/step; HTTP handlers talk to it only through queues (vLLM's AsyncLLM / EngineCore split in one process).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/llm_engine.h"
#include "server/metrics.h"

namespace ssmserve::server {

/// What the engine thread hands to one HTTP request: delta outputs (to_delta) of its engine requests
/// (several for n > 1 or a list of prompts), tagged with the request's index in the submitted group. Outputs not
/// yet taken are coalesced per index (a stalled reader's pending output grows by the new tokens only), and their
/// size is tracked so the engine can abort a request whose client stopped reading. Thread-safe.
class OutputChannel {
 public:
  struct Item {
    int index = 0;
    RequestOutput output;  ///< every delta of this index since the previous take, merged (append_delta)
  };
  /// Called after every change the engine makes (accepted / rejected, an output, a failure), on the engine
  /// thread, outside the channel's lock; it must not block. Set it before the channel is submitted.
  void set_notify(std::function<void()> fn) { notify_ = std::move(fn); }

  /// Engine side: the group was added (error empty) or rejected (error = the engine's message).
  void set_accepted(std::string error);
  /// Engine side: appends a delta output of choice `index`. Returns the bytes (output_bytes) now pending.
  size_t push(int index, RequestOutput out);
  /// Engine side: the requests ended without a result: `error` answered with HTTP `status` (500 engine failure,
  /// 503 shutdown, 429 output not read). With `discard`, outputs not yet taken are dropped (their memory freed).
  void fail(std::string error, int status = 500, bool discard = false);

  /// Handler side: blocks until the group was accepted or rejected; returns the rejection message, if any.
  std::optional<std::string> wait_accepted();
  /// Handler side, non-blocking: nullopt while undecided, else the rejection message ("" when accepted).
  std::optional<std::string> try_accepted();
  /// Handler side: moves every output available now into `out` (one item per index with pending output),
  /// waiting up to `timeout` for the first one. Returns false when nothing came. `failed` (and `failed_status`)
  /// receive a fatal error once every output before it was taken.
  bool pop_all(std::vector<Item>& out, std::chrono::milliseconds timeout, std::string* failed, int* failed_status = nullptr);
  /// Bytes of output not yet taken (output_bytes).
  size_t pending_bytes();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> notify_;
  bool decided_ = false;
  std::string reject_;
  std::string fatal_;
  int fatal_status_ = 500;
  std::deque<int> order_;                          // indices with pending output, in arrival order
  std::unordered_map<int, RequestOutput> pending_;  // index -> merged deltas not yet taken
  size_t pending_bytes_ = 0;
};

/// Limits of the loop.
struct AsyncEngineOptions {
  /// Most sequences (engine requests: prompts x n) waiting, handed over but not yet running; 0 = no limit. A
  /// group that would pass it gets 503, one larger than it on its own 400.
  int max_num_waiting = 0;
  /// Most bytes (output_bytes) of one request's output the engine buffers while its client does not read; past
  /// it the request (its whole group) is aborted and its channel fails with 429. 0 = no limit.
  size_t max_pending_output_bytes = 0;
  /// Fair admission: most sequences of one request in the engine (running or in its waiting queue) at once; the
  /// rest wait in the server's queue, which feeds the engine round-robin over requests (one sequence from each in
  /// turn) while the engine's waiting queue is shorter than max_num_seqs. 0 = max(1, max_num_seqs / 4): a quarter, so
  /// that the sequences a request already runs when others arrive (they are not preempted) keep those others'
  /// steps within about 2x of their cost alone.
  /// While other requests are active (queued or in the engine), a request's share is also at most
  /// max(1, max_num_seqs / active requests), and its prompt tokens not yet prefilled in the engine at most
  /// 2 x max_num_batched_tokens (its first sequence always goes in), so a newcomer (the engine runs prefills in
  /// arrival order) waits at most about two steps behind it.
  int max_seqs_per_request = 0;
};

/// The engine thread. Constructing it builds the engine on that thread (OpenMP thread settings are per thread);
/// construction throws the engine's Error when the model cannot be loaded.
class AsyncEngine {
 public:
  AsyncEngine(EngineConfig cfg, AsyncEngineOptions opt, Metrics& metrics);
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  /// Queues a group of requests (ids must be unique; the engine thread adds them all or none). Throws ApiError
  /// 400 when the group alone exceeds max_num_waiting, 503 when it does not fit in the waiting queue now or the
  /// engine is stopping.
  /// `notify`, when given, is the channel's notify callback (OutputChannel::set_notify).
  std::shared_ptr<OutputChannel> submit(std::vector<Request> reqs, std::function<void()> notify = {});
  /// Aborts requests (finished or unknown ids are ignored); their state blocks are freed at the next iteration.
  void abort(std::vector<std::string> request_ids);
  /// Stops the loop (unfinished requests end with an error) and joins the thread. Idempotent.
  void shutdown();

  const ModelConfig& model_config() const { return *model_config_; }
  /// LLMEngine::pool_token_capacity (0: no KV blocks).
  int pool_token_capacity() const { return pool_token_capacity_; }
  const Tokenizer* tokenizer() const { return tokenizer_; }
  const EngineConfig& config() const { return cfg_; }
  /// Requests handed over and not yet finished (for graceful shutdown).
  int num_unfinished() const { return num_unfinished_.load(); }

 private:
  struct Pending {
    std::vector<Request> reqs;
    std::shared_ptr<OutputChannel> channel;
  };
  /// A submitted request (group) in the fair queue: its sequences not yet in the engine are reqs[next..].
  struct Group {
    std::vector<Request> reqs;
    std::shared_ptr<OutputChannel> channel;
    std::chrono::steady_clock::time_point arrival;
    size_t next = 0;
    int in_engine = 0;       // sequences added and not finished
    long long unprefilled = 0;  // prompt tokens of its sequences in the engine that have no output yet
    bool in_queue = true;    // in queue_ (else: active while in_engine > 0, counted in num_draining_groups_)
    bool accepted = false;   // the channel was told (at the first sequence added)
    bool dropped = false;    // aborted or failed: its remaining sequences are never added
  };
  struct Live {
    std::shared_ptr<OutputChannel> channel;
    std::shared_ptr<Group> group;
    int index = 0;
    std::chrono::steady_clock::time_point arrival, last_token;
    size_t num_tokens = 0;
    int prompt_len = 0;      // counted in its group's unprefilled until its first output
    std::chrono::steady_clock::time_point admitted, first_token;  // handed to the engine; its first token
    int prompt_tokens = 0;   // the prompt's length (for the request_prompt_tokens histogram)
  };
  void loop();
  /// Adds queued sequences to the engine, round-robin over groups (see AsyncEngineOptions::max_seqs_per_request).
  void admit_fair();
  /// Drops the sequences of `g` not yet added (they are never run); returns how many.
  int drop_queued(Group& g);
  void dispatch(std::vector<RequestOutput>& outs);
  void finish_live(const std::string& id, const std::string& reason);
  /// Aborts every live request of `ch` (a client that stopped reading) and fails the channel with 429.
  void abort_unread(std::shared_ptr<OutputChannel> ch, size_t pending);
  void publish_gauges();

  EngineConfig cfg_;
  AsyncEngineOptions opt_;
  Metrics& metrics_;
  std::unique_ptr<LLMEngine> engine_;       // touched only by the engine thread after construction
  const ModelConfig* model_config_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
  int pool_token_capacity_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<std::string> aborts_;
  bool stop_ = false;
  int pending_count_ = 0;                   // requests in pending_ (guarded by mu_)
  std::atomic<int> engine_waiting_{0};
  std::atomic<int> num_unfinished_{0};
  std::unordered_map<std::string, Live> live_;  // engine thread only
  std::deque<std::shared_ptr<Group>> queue_;      // engine thread only: groups with sequences not yet added
  size_t rr_ = 0;                                 // engine thread only: round-robin position in queue_
  int max_seqs_per_request_ = 1;
  int num_draining_groups_ = 0;                   // engine thread only: groups out of queue_ with sequences in the engine
  long long num_steps_since_trim_ = 0;            // engine thread only
  bool trim_due_ = false;                         // engine thread only: malloc_trim once idle
  // Test hook: with SSMSERVE_FAULT_STEP=N in the environment, the N-th engine step fails (an engine error).
  long long fault_step_ = 0, num_steps_ = 0;
};

}  // namespace ssmserve::server
