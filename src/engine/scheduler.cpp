// Owns the scheduler (see scheduler.h).
#include "model/batch_builder.h"
#include "engine/scheduler.h"

#include <algorithm>

namespace ssmserve {

int SchedulerOutput::num_scheduled_tokens() const {
  int n = 0;
  for (const auto& s : decodes) n += s.num_tokens;
  for (const auto& s : prefills) n += s.num_tokens;
  return n;
}

Scheduler::Scheduler(SchedulerConfig cfg, BlockPool& pool, StateCache& cache, int kv_block_size)
    : cfg_(cfg), kv_block_size_(kv_block_size), pool_(pool), cache_(cache) {
  SSM_CHECK(kv_block_size >= 0, "kv_block_size must be >= 0 (got {})", kv_block_size);
  SSM_CHECK(cfg.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1 (got {})", cfg.max_num_batched_tokens);
  SSM_CHECK(cfg.max_num_seqs >= 1, "max_num_seqs must be >= 1 (got {})", cfg.max_num_seqs);
}

void Scheduler::add_request(RequestState* req) {
  req->status = RequestStatus::Waiting;
  waiting_.push_back(req);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = cfg_.max_num_batched_tokens;
  int seqs = 0;
  // 1. Running requests: decodes first (one token each, state present), then the next chunk of the others
  //    (unfinished prompts, or prompt + output being recomputed after a preemption).
  auto is_decode = [](const RequestState* r) { return is_decode_row(r->num_computed_tokens, r->num_tokens()); };
  //    Indexed loops: reserve_kv may preempt (erase) requests from the back of running_.
  preempted_this_step_ = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestState* r = running_[i];
    if (budget == 0 || seqs == cfg_.max_num_seqs) break;
    if (is_decode(r)) {
      if (!reserve_kv(r, 1, out, budget, seqs)) break;
      out.decodes.push_back({r, 1});
      --budget, ++seqs;
    }
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestState* r = running_[i];
    if (budget == 0 || seqs == cfg_.max_num_seqs) break;
    if (!is_decode(r)) {
      const int n = std::min(budget, r->num_tokens() - r->num_computed_tokens);
      if (!reserve_kv(r, n, out, budget, seqs)) break;
      out.prefills.push_back({r, n});
      budget -= n, ++seqs;
    }
  }
  // 2. Waiting requests, FCFS, each getting a zeroed state block (and, for hybrids, the KV blocks of its first
  //    chunk: admitted only when both fit). None when this step preempted someone (vLLM v1).
  while (!waiting_.empty() && budget > 0 && seqs < cfg_.max_num_seqs && !preempted_this_step_) {
    RequestState* r = waiting_.front();
    const int n_first = std::min(budget, r->num_tokens() - r->num_computed_tokens);
    if (pool_.num_free() < 1 + kv_blocks_for(n_first)) break;
    const int block = pool_.allocate();
    if (block == 0) break;
    while (static_cast<int>(r->kv_blocks.size()) < kv_blocks_for(n_first)) r->kv_blocks.push_back(pool_.allocate());
    if (zero_host_states_) cache_.zero_block(block);
    waiting_.pop_front();
    r->state_block = block;
    r->status = RequestStatus::Running;
    running_.push_back(r);
    const int n = std::min(budget, r->num_tokens() - r->num_computed_tokens);
    out.prefills.push_back({r, n});
    budget -= n, ++seqs;
  }
  return out;
}

bool Scheduler::reserve_kv(RequestState* r, int n, SchedulerOutput& out, int& budget, int& seqs) {
  const int need = kv_blocks_for(r->num_computed_tokens + n) - static_cast<int>(r->kv_blocks.size());
  if (need <= 0) return true;
  while (pool_.num_free() < need) {
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
  for (int i = 0; i < need; ++i) r->kv_blocks.push_back(pool_.allocate());
  return true;
}

void Scheduler::free_blocks(RequestState* req) {
  pool_.free(req->state_block);
  req->state_block = 0;
  for (int b : req->kv_blocks) pool_.free(b);  // KV blocks are not zeroed: every slot is written before it is read
  req->kv_blocks.clear();
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
  free_blocks(req);
  req->status = RequestStatus::Finished;
  std::erase(running_, req);
  std::erase(waiting_, req);
}

}  // namespace ssmserve
