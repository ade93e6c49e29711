// Owns tensor parallelism on the CPU (issue 9; vllm-ssm-design.md §3.1, §5): TensorParallelLM runs one model
// shard per rank, each on its own persistent thread, talking through an in-process communicator
// (dist::InProcessGroup), and presents them to the engine as one CausalLM, so the engine, scheduler and state
// pool are the same as for one rank.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "model/causal_lm.h"

namespace ssmserve {

/// Largest --tensor-parallel-size accepted (in-process ranks are threads; more than this is never useful).
inline constexpr int kMaxTensorParallelSize = 64;

/// Loads rank tp.rank's shard of the model `config` names (the architecture's shard loader from the registry).
/// Throws Error when the architecture has no tensor-parallel loader (listing those that do), or as the loader
/// does (a size that does not divide the sharded dimensions, checkpoint defects).
std::unique_ptr<CausalLM> load_model_shard(const ModelConfig& config, LoadFormat format, const dist::TpRank& tp);

/// Architecture names with a tensor-parallel shard loader.
std::vector<std::string> tensor_parallel_architectures();

/// `tensor_parallel_size` model shards run as one CausalLM. Each rank r owns a shard model (its slices of the
/// weights, its shard of every state) and a thread with max(1, omp_get_max_threads() / tensor_parallel_size)
/// OpenMP threads of its own. The state page it reports holds every rank's shard back to back: the conv part is
/// [rank 0's conv shard | rank 1's | ...] and likewise the SSM part, each rank's shard padded to 16 elements so
/// ranks write separate cache lines; forward() hands rank r a StateCache::shard view of its part and the same
/// batch, runs all ranks at once and returns when all are done, with rank 0's logits (complete after the LM
/// head's all-gather). One forward at a time. (A CausalLM virtual added later, e.g. a hybrid's KV block size,
/// must be forwarded to shards_[0] here too, or the wrapper silently reports the default.)
class TensorParallelLM final : public CausalLM {
 public:
  /// Loads the shards of `config` (checkpoint row slices stay views into the mapped file) and starts the rank
  /// threads. Throws Error when tensor_parallel_size is outside [1, kMaxTensorParallelSize] or a shard fails to load.
  TensorParallelLM(const ModelConfig& config, LoadFormat format, int tensor_parallel_size);
  /// Runs already-loaded shards (rank r = shards[r], e.g. GPU runners talking through an NCCL group that `group`
  /// keeps alive until the shards are gone); each rank thread first calls thread_init(r) (e.g. cudaSetDevice(r)).
  /// Throws Error when shards is empty or larger than kMaxTensorParallelSize.
  TensorParallelLM(std::vector<std::unique_ptr<CausalLM>> shards, std::shared_ptr<void> group,
                   std::function<void(int)> thread_init);
  ~TensorParallelLM() override;

  const ModelConfig& config() const override { return shards_[0]->config(); }
  int num_state_layers() const override { return shards_[0]->num_state_layers(); }
  /// The sum over ranks of each rank's (padded) state shard.
  StateShape state_shape() const override { return page_; }
  int chunk_size() const override { return shards_[0]->chunk_size(); }
  int prefix_block_alignment() const override { return shards_[0]->prefix_block_alignment(); }
  bool stores_prefill_states() const override { return shards_[0]->stores_prefill_states(); }
  /// The shards' (all equal): a hybrid's (MiniMax) shard keeps the unsharded model's KV block size and reports a
  /// state region large enough for its KV heads' block, so page_ holds every rank's KV part too.
  int kv_block_size() const override { return shards_[0]->kv_block_size(); }
  bool has_linear_attention() const override { return shards_[0]->has_linear_attention(); }
  bool supports_speculative_decoding() const override { return shards_[0]->supports_speculative_decoding(); }
  /// Validates the batch against `cache` (the same checks every rank would make, so a bad batch throws here,
  /// before any rank starts a collective), then runs every rank. Throws Error on a bad batch or a rank's error.
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;
  /// Each rank copies its own part of the blocks (its shard view; device ranks in their mirrors, on their threads).
  void copy_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override;
  /// The host tier of cached states (--swap-space) on device ranks: every rank allocates `num_slots` pinned host pages
  /// of its own shard of a block (together one block's bytes per slot), and swaps its part of each copy on its
  /// device. False (nothing kept) when a rank has no host tier (CPU shards: their pool is host memory).
  bool allocate_host_state_tier(int num_slots, const StateCache& cache) override;
  void swap_out_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override;
  void swap_in_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override;
  /// Device ranks (GPU shards): every rank runs its shard's forward_greedy (the shards all-gather the logits on the
  /// device and every rank picks the same tokens); `out` gets rank 0's picks. Returns false, doing nothing, when
  /// the shards have no device sampler (CPU shards). Same checks and errors as forward; Error when the ranks
  /// disagree on having one.
  bool forward_greedy(const ForwardBatch& batch, StateCache& cache, int num_top, std::vector<GreedyPick>& out) override;
  /// forward_greedy_steps on every rank (as forward_greedy): `out` gets rank 0's picks.
  bool forward_greedy_steps(const ForwardBatch& batch, StateCache& cache, int num_top, int num_steps,
                            std::vector<GreedyPick>& out) override;
  /// forward_sample on every rank (as forward_greedy): `out` gets rank 0's picks.
  bool forward_sample(const ForwardBatch& batch, StateCache& cache, const DeviceSampleBatch& sample,
                      std::vector<GreedyPick>& out) override;
  /// Device ranks (GPU shards) keep only their shard of every state (cuda::DeviceStateMirror): the budget of the
  /// tightest rank (asked on its own device through thread_init), scaled by whole-page / rank-shard elements so
  /// the engine can divide it by the whole page's bytes. nullopt when the shards keep their states on the host.
  std::optional<double> device_state_budget(double gpu_memory_utilization, int64_t max_num_batched_tokens,
                                            int64_t max_num_seqs) const override;

  int tensor_parallel_size() const { return static_cast<int>(shards_.size()); }

 private:
  /// What a rank runs on its shard: forward, or a device pick (returns whether the shard took it).
  using RankJob = std::function<bool(int rank, CausalLM& shard, StateCache& view)>;
  /// Checks the batch, runs `job` on every rank at once and returns each rank's result. Throws a rank's error.
  std::vector<char> run_ranks(const ForwardBatch& batch, StateCache& cache, const RankJob& job);
  /// forward_greedy / forward_sample: rank 0's picks into out, the others' into scratch vectors.
  bool run_device_picks(const ForwardBatch& batch, StateCache& cache, std::vector<GreedyPick>& out,
                        const std::function<bool(CausalLM&, StateCache&, std::vector<GreedyPick>&)>& pick);
  void rank_loop(int rank, int omp_threads);
  void start();  // sizes the page and starts the rank threads

  std::shared_ptr<void> group_;  // the communicators' owner (an InProcessGroup, or the caller's)
  std::function<void(int)> thread_init_;
  std::vector<std::unique_ptr<CausalLM>> shards_;
  std::vector<StateShape> offsets_;  // per rank: where its conv / ssm shard starts in the page (elements)
  StateShape page_;
  // The running forward, handed to the rank threads under mu_ (generation_ counts forwards).
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  const ForwardBatch* batch_ = nullptr;
  std::vector<StateCache> views_;
  /// Builds views_ from `cache` unless forward() or a copy already did (call under mu_).
  void ensure_views(const StateCache& cache);
  const RankJob* job_ = nullptr;
  std::vector<char> results_;
  std::vector<std::vector<GreedyPick>> rank_picks_;  // ranks 1..N-1's device picks (discarded)
  bool no_device_picks_ = false;                     // the shards declined a device pick (CPU shards)
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace ssmserve
