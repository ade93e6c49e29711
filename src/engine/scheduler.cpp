// Owns the scheduler (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>

namespace ssmserve {

int SchedulerOutput::num_scheduled_tokens() const {
  int n = 0;
  for (const auto& s : decodes) n += s.num_tokens;
  for (const auto& s : prefills) n += s.num_tokens;
  return n;
}

Scheduler::Scheduler(SchedulerConfig cfg, BlockPool& pool, StateCache& cache) : cfg_(cfg), pool_(pool), cache_(cache) {
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
  auto is_decode = [](const RequestState* r) { return r->num_computed_tokens > 0 && r->num_tokens() - r->num_computed_tokens == 1; };
  for (RequestState* r : running_) {
    if (budget == 0 || seqs == cfg_.max_num_seqs) break;
    if (is_decode(r)) {
      out.decodes.push_back({r, 1});
      --budget, ++seqs;
    }
  }
  for (RequestState* r : running_) {
    if (budget == 0 || seqs == cfg_.max_num_seqs) break;
    if (!is_decode(r)) {
      const int n = std::min(budget, r->num_tokens() - r->num_computed_tokens);
      out.prefills.push_back({r, n});
      budget -= n, ++seqs;
    }
  }
  // 2. Waiting requests, FCFS, each getting a zeroed state block.
  while (!waiting_.empty() && budget > 0 && seqs < cfg_.max_num_seqs) {
    RequestState* r = waiting_.front();
    const int block = pool_.allocate();
    if (block == 0) break;
    cache_.zero_block(block);
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

void Scheduler::preempt(RequestState* req) {
  if (req->status != RequestStatus::Running) return;
  pool_.free(req->state_block);
  req->state_block = 0;
  req->num_computed_tokens = 0;
  req->status = RequestStatus::Preempted;
  std::erase(running_, req);
  waiting_.push_front(req);
  ++num_preemptions_;
}

void Scheduler::finish_request(RequestState* req) {
  pool_.free(req->state_block);
  req->state_block = 0;
  req->status = RequestStatus::Finished;
  std::erase(running_, req);
  std::erase(waiting_, req);
}

}  // namespace ssmserve
