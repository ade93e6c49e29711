// Owns the in-process tensor-parallel model wrapper (see tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <omp.h>

#include <algorithm>

#include "core/error.h"
#include "model/lm_common.h"

namespace ssmserve {
namespace {

constexpr int64_t kShardAlign = 16;  // elements: 64 bytes of fp32 state
constexpr int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

}  // namespace

TensorParallelLM::TensorParallelLM(const ModelConfig& config, LoadFormat format, int tensor_parallel_size) {
  SSM_CHECK(tensor_parallel_size >= 1 && tensor_parallel_size <= kMaxTensorParallelSize,
            "--tensor-parallel-size must be in [1, {}] (got {})", kMaxTensorParallelSize, tensor_parallel_size);
  const int tp = tensor_parallel_size;
  auto group = std::make_shared<dist::InProcessGroup>(tp);
  group_ = group;
  for (int r = 0; r < tp; ++r) shards_.push_back(load_model_shard(config, format, {r, tp, &group->communicator(r)}));
  start();
}

TensorParallelLM::TensorParallelLM(std::vector<std::unique_ptr<CausalLM>> shards, std::shared_ptr<void> group,
                                   std::function<void(int)> thread_init)
    : group_(std::move(group)), thread_init_(std::move(thread_init)), shards_(std::move(shards)) {
  SSM_CHECK(!shards_.empty() && static_cast<int>(shards_.size()) <= kMaxTensorParallelSize,
            "--tensor-parallel-size must be in [1, {}] (got {})", kMaxTensorParallelSize, shards_.size());
  start();
}

void TensorParallelLM::start() {
  const int tp = static_cast<int>(shards_.size());
  for (const auto& shard : shards_) {
    const StateShape s = shard->state_shape();
    offsets_.push_back({page_.conv_elems, page_.ssm_elems});
    page_.conv_elems += round_up(s.conv_elems, kShardAlign);
    page_.ssm_elems += round_up(s.ssm_elems, kShardAlign);
  }
  errors_.resize(tp);
  const int omp_threads = std::max(1, omp_get_max_threads() / tp);
  for (int r = 0; r < tp; ++r) threads_.emplace_back([this, r, omp_threads] { rank_loop(r, omp_threads); });
}

TensorParallelLM::~TensorParallelLM() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

std::optional<double> TensorParallelLM::device_state_budget(double gpu_memory_utilization, int64_t max_num_batched_tokens,
                                                           int64_t max_num_seqs) const {
  std::optional<double> budget;
  const double page_elems = static_cast<double>(page_.conv_elems + page_.ssm_elems);
  for (size_t r = 0; r < shards_.size(); ++r) {
    if (thread_init_) thread_init_(static_cast<int>(r));
    const auto b = shards_[r]->device_state_budget(gpu_memory_utilization, max_num_batched_tokens, max_num_seqs);
    if (!b) continue;
    const StateShape s = shards_[r]->state_shape();
    // + 32: the rank's two parts are each rounded up to a 64-byte line (at most 16 fp32 elements each).
    const double scaled = *b * page_elems / static_cast<double>(s.conv_elems + s.ssm_elems + 32);
    budget = budget ? std::min(*budget, scaled) : scaled;
  }
  if (thread_init_) thread_init_(0);
  return budget;
}

std::vector<char> TensorParallelLM::run_ranks(const ForwardBatch& batch, StateCache& cache, const RankJob& job) {
  // The checks each shard's forward makes first, done once here: a batch that fails them never reaches a rank.
  check_batch_against_cache(batch, cache, num_state_layers(), "tensor-parallel");
  SSM_CHECK(cache.shape().conv_elems >= page_.conv_elems && cache.shape().ssm_elems >= page_.ssm_elems,
            "tensor-parallel forward: the state cache's page ({} conv + {} ssm elements) is smaller than the model's ({} + {})",
            cache.shape().conv_elems, cache.shape().ssm_elems, page_.conv_elems, page_.ssm_elems);
  const int64_t V = config().vocab_size;
  for (int64_t t = 0; t < batch.num_tokens(); ++t)
    SSM_CHECK(batch.input_ids[t] >= 0 && batch.input_ids[t] < V, "token id {} is outside the vocabulary [0, {})", batch.input_ids[t], V);
  std::unique_lock<std::mutex> lock(mu_);
  views_.clear();  // (capacity kept: each rank's view keeps its address, which GPU state mirrors key on)
  views_.reserve(shards_.size());
  for (size_t r = 0; r < shards_.size(); ++r)
    views_.push_back(cache.shard(shards_[r]->state_shape(), offsets_[r].conv_elems, offsets_[r].ssm_elems));
  batch_ = &batch;
  job_ = &job;
  results_.assign(shards_.size(), 0);
  std::fill(errors_.begin(), errors_.end(), nullptr);
  pending_ = static_cast<int>(shards_.size());
  ++generation_;
  work_cv_.notify_all();
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  batch_ = nullptr;
  job_ = nullptr;
  for (const auto& e : errors_)
    if (e) std::rethrow_exception(e);
  return results_;
}

void TensorParallelLM::ensure_views(const StateCache& cache) {
  // The ranks' views as forward() builds them (same objects, so device mirrors keyed on their address stay put).
  if (views_.size() == shards_.size()) return;
  views_.clear();
  views_.reserve(shards_.size());
  for (size_t r = 0; r < shards_.size(); ++r)
    views_.push_back(cache.shard(shards_[r]->state_shape(), offsets_[r].conv_elems, offsets_[r].ssm_elems));
}

void TensorParallelLM::copy_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) {
  if (copies.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  ensure_views(cache);
  // On this thread: a CPU rank copies its part of the host pages, a device rank selects its device itself.
  for (size_t r = 0; r < shards_.size(); ++r) shards_[r]->copy_state_blocks(copies, views_[r]);
}

bool TensorParallelLM::allocate_host_state_tier(int num_slots, const StateCache& cache) {
  std::unique_lock<std::mutex> lock(mu_);
  ensure_views(cache);
  for (size_t r = 0; r < shards_.size(); ++r)
    if (!shards_[r]->allocate_host_state_tier(num_slots, views_[r])) {
      SSM_CHECK(r == 0, "--swap-space: tensor-parallel rank {} has no host tier but rank 0 has one", r);
      return false;
    }
  return true;
}

void TensorParallelLM::swap_out_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) {
  if (copies.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  ensure_views(cache);
  for (size_t r = 0; r < shards_.size(); ++r) shards_[r]->swap_out_state_blocks(copies, views_[r]);
}

void TensorParallelLM::swap_in_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) {
  if (copies.empty()) return;
  std::unique_lock<std::mutex> lock(mu_);
  ensure_views(cache);
  for (size_t r = 0; r < shards_.size(); ++r) shards_[r]->swap_in_state_blocks(copies, views_[r]);
}

void TensorParallelLM::forward(const ForwardBatch& batch, StateCache& cache, float* logits) {
  run_ranks(batch, cache, [&](int rank, CausalLM& shard, StateCache& view) {
    shard.forward(batch, view, rank == 0 ? logits : nullptr);  // rank 0's logits are complete (all-gathered)
    return true;
  });
}

bool TensorParallelLM::run_device_picks(const ForwardBatch& batch, StateCache& cache, std::vector<GreedyPick>& out,
                                        const std::function<bool(CausalLM&, StateCache&, std::vector<GreedyPick>&)>& pick) {
  if (no_device_picks_) return false;  // CPU shards: known after the first step
  rank_picks_.resize(shards_.size());
  const std::vector<char> took = run_ranks(batch, cache, [&](int rank, CausalLM& shard, StateCache& view) {
    return pick(shard, view, rank == 0 ? out : rank_picks_[rank]);
  });
  const auto n = std::count(took.begin(), took.end(), 1);
  SSM_CHECK(n == 0 || n == static_cast<int64_t>(took.size()),
            "tensor-parallel device sampling: {} of {} ranks took the step (the shards must agree)", n, took.size());
  no_device_picks_ = n == 0;
  return n > 0;
}

bool TensorParallelLM::forward_greedy(const ForwardBatch& batch, StateCache& cache, int num_top,
                                      std::vector<GreedyPick>& out) {
  return run_device_picks(batch, cache, out, [&](CausalLM& shard, StateCache& view, std::vector<GreedyPick>& picks) {
    return shard.forward_greedy(batch, view, num_top, picks);
  });
}

bool TensorParallelLM::forward_greedy_steps(const ForwardBatch& batch, StateCache& cache, int num_top, int num_steps,
                                            std::vector<GreedyPick>& out) {
  return run_device_picks(batch, cache, out, [&](CausalLM& shard, StateCache& view, std::vector<GreedyPick>& picks) {
    return shard.forward_greedy_steps(batch, view, num_top, num_steps, picks);
  });
}

bool TensorParallelLM::forward_sample(const ForwardBatch& batch, StateCache& cache, const DeviceSampleBatch& sample,
                                      std::vector<GreedyPick>& out) {
  return run_device_picks(batch, cache, out, [&](CausalLM& shard, StateCache& view, std::vector<GreedyPick>& picks) {
    return shard.forward_sample(batch, view, sample, picks);
  });
}

void TensorParallelLM::rank_loop(int rank, int omp_threads) {
  omp_set_num_threads(omp_threads);  // this thread's OpenMP team size (an ICV of the calling thread)
  if (thread_init_) thread_init_(rank);
  int64_t seen = 0;
  while (true) {
    std::unique_lock<std::mutex> lock(mu_);
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const RankJob& job = *job_;
    StateCache& view = views_[rank];
    lock.unlock();
    // Errors past the checks in run_ranks() are the same on every rank (the shards run the same code on the same
    // batch), so every rank leaves its collectives at the same point.
    bool took = false;
    try {
      took = job(rank, *shards_[rank], view);
    } catch (...) {
      errors_[rank] = std::current_exception();
    }
    lock.lock();
    results_[rank] = took ? 1 : 0;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

std::unique_ptr<CausalLM> load_model(const ModelConfig& config, LoadFormat format, int tensor_parallel_size) {
  if (tensor_parallel_size == 1) return load_model(config, format);
  return std::make_unique<TensorParallelLM>(config, format, tensor_parallel_size);
}

std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, LoadFormat format, int tensor_parallel_size) {
  return load_model(ModelConfig::load(dir), format, tensor_parallel_size);
}

}  // namespace ssmserve
