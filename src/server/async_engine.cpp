// Owns the engine thread and the per-request output channels (see async_engine.h).
#include "server/async_engine.h"

#include "core/env_options.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <malloc.h>
#include <future>
#include <stdexcept>
#include <utility>

#include "server/api_error.h"

namespace ssmserve::server {

void OutputChannel::set_accepted(std::string error) {
  {
    std::lock_guard lk(mu_);
    decided_ = true;
    reject_ = std::move(error);
  }
  cv_.notify_all();
  if (notify_) notify_();
}

size_t OutputChannel::push(int index, RequestOutput out) {
  size_t pending = 0;
  {
    std::lock_guard lk(mu_);
    auto it = pending_.find(index);
    if (it == pending_.end()) {
      pending_bytes_ += output_bytes(out);
      pending_.emplace(index, std::move(out));
      order_.push_back(index);
    } else {
      pending_bytes_ -= output_bytes(it->second);
      append_delta(it->second, std::move(out));
      pending_bytes_ += output_bytes(it->second);
    }
    pending = pending_bytes_;
  }
  cv_.notify_all();
  if (notify_) notify_();
  return pending;
}

void OutputChannel::fail(std::string error, int status, bool discard) {
  {
    std::lock_guard lk(mu_);
    if (!decided_) decided_ = true, reject_ = error;
    fatal_ = std::move(error);
    fatal_status_ = status;
    if (discard) {
      pending_.clear();
      order_.clear();
      pending_bytes_ = 0;
    }
  }
  cv_.notify_all();
  if (notify_) notify_();
}

std::optional<std::string> OutputChannel::wait_accepted() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return decided_; });
  return reject_.empty() ? std::nullopt : std::optional<std::string>(reject_);
}

std::optional<std::string> OutputChannel::try_accepted() {
  std::lock_guard lk(mu_);
  if (!decided_) return std::nullopt;
  return reject_;
}

size_t OutputChannel::pending_bytes() {
  std::lock_guard lk(mu_);
  return pending_bytes_;
}

bool OutputChannel::pop_all(std::vector<Item>& out, std::chrono::milliseconds timeout, std::string* failed,
                            int* failed_status) {
  std::unique_lock lk(mu_);
  if (timeout.count() > 0) cv_.wait_for(lk, timeout, [&] { return !order_.empty() || !fatal_.empty(); });
  if (order_.empty() && !fatal_.empty()) {
    if (failed) *failed = fatal_;
    if (failed_status) *failed_status = fatal_status_;
  }
  if (order_.empty()) return false;
  for (int index : order_) {
    auto it = pending_.find(index);
    out.push_back({index, std::move(it->second)});
    pending_.erase(it);
  }
  order_.clear();
  pending_bytes_ = 0;
  return true;
}

AsyncEngine::AsyncEngine(EngineConfig cfg, AsyncEngineOptions opt, Metrics& metrics)
    : cfg_(std::move(cfg)), opt_(opt), metrics_(metrics) {
  if (env_options().fault_step >= 0) fault_step_ = env_options().fault_step;
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = std::thread([this, &ready] {
    try {
      engine_ = std::make_unique<LLMEngine>(cfg_);
      engine_->set_output_kind(OutputKind::Delta);  // no per-step copies of long outputs
      max_seqs_per_request_ = opt_.max_seqs_per_request > 0 ? opt_.max_seqs_per_request
                                                             : std::max(1, engine_->config().scheduler.max_num_seqs / 4);
      model_config_ = &engine_->model_config();
      pool_token_capacity_ = engine_->pool_token_capacity();
      tokenizer_ = engine_->tokenizer();
      publish_gauges();
    } catch (...) {
      ready.set_exception(std::current_exception());
      return;
    }
    ready.set_value();
    loop();
  });
  try {
    started.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

AsyncEngine::~AsyncEngine() { shutdown(); }

std::shared_ptr<OutputChannel> AsyncEngine::submit(std::vector<Request> reqs, std::function<void()> notify) {
  auto ch = std::make_shared<OutputChannel>();
  if (notify) ch->set_notify(std::move(notify));
  // --max-num-waiting counts sequences (one engine request per prompt x n): a group that could never fit is the
  // client's error (400, naming the limit); one that fits later is told to retry (503).
  const long long num_seqs = static_cast<long long>(reqs.size());
  if (opt_.max_num_waiting > 0 && num_seqs > opt_.max_num_waiting)
    throw ApiError(400, fmt::format("the request has {} sequences (prompts x n), more than the server's limit of {} waiting "
                                    "sequences (--max-num-waiting {}); send fewer prompts or a smaller n",
                                    num_seqs, opt_.max_num_waiting, opt_.max_num_waiting));
  {
    std::lock_guard lk(mu_);
    if (stop_) throw ApiError(503, "the server is shutting down");
    const int waiting = engine_waiting_.load() + pending_count_;
    if (opt_.max_num_waiting > 0 && waiting + num_seqs > opt_.max_num_waiting)
      throw ApiError(503,
                     fmt::format("the server is overloaded: {} sequences are already waiting and this request adds {} "
                                 "(--max-num-waiting {}); retry later",
                                 waiting, num_seqs, opt_.max_num_waiting));
    pending_count_ += static_cast<int>(reqs.size());
    pending_.push_back({std::move(reqs), ch});
  }
  cv_.notify_all();
  return ch;
}

void AsyncEngine::abort(std::vector<std::string> request_ids) {
  {
    std::lock_guard lk(mu_);
    for (auto& id : request_ids) aborts_.push_back(std::move(id));
  }
  cv_.notify_all();
}

void AsyncEngine::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncEngine::loop() {
  while (true) {
    std::deque<Pending> pend;
    std::vector<std::string> aborts;
    {
      std::unique_lock lk(mu_);
      auto has_work = [&] {
        return stop_ || !pending_.empty() || !aborts_.empty() || !queue_.empty() || engine_->has_unfinished_requests();
      };
      // Idle after requests ended: give the freed output buffers back to the system (glibc keeps them in its
      // arenas otherwise, so RSS would stay at the peak of, e.g., many stalled streams).
      if (trim_due_ && !cv_.wait_for(lk, std::chrono::milliseconds(500), has_work)) {
        lk.unlock();
        malloc_trim(0);
        trim_due_ = false;
        continue;
      }
      cv_.wait(lk, has_work);
      if (stop_) break;
      pend.swap(pending_);
      aborts.swap(aborts_);
    }
    // 1. New groups join the fair queue; aborts apply to sequences in the engine and to those still queued.
    const auto now = std::chrono::steady_clock::now();
    for (auto& p : pend) {
      auto g = std::make_shared<Group>();
      g->reqs = std::move(p.reqs);
      g->channel = std::move(p.channel);
      g->arrival = now;
      queue_.push_back(std::move(g));
    }
    if (!aborts.empty()) {
      std::unordered_map<std::string, Group*> queued;  // id of a sequence not yet added -> its group
      for (const auto& g : queue_)
        for (size_t i = g->next; i < g->reqs.size(); ++i) queued.emplace(g->reqs[i].request_id, g.get());
      for (const auto& id : aborts) {
        if (auto it = queued.find(id); it != queued.end()) drop_queued(*it->second);  // a job aborts all its requests
        if (!live_.count(id)) continue;
        engine_->abort_request(id);
        finish_live(id, "abort");
      }
    }
    admit_fair();
    // 2. One engine step; route its outputs.
    if (engine_->has_unfinished_requests()) {
      std::vector<RequestOutput> outs;
      try {
        if (fault_step_ > 0 && ++num_steps_ == fault_step_) throw std::runtime_error("injected fault (SSMSERVE_FAULT_STEP)");
        outs = engine_->step();
      } catch (const std::exception& e) {
        spdlog::error("engine step failed: {}; aborting {} requests", e.what(), live_.size());
        std::vector<std::string> ids;
        for (auto& [id, l] : live_) {
          ids.push_back(id);
          drop_queued(*l.group);
          l.channel->fail(std::string("engine error: ") + e.what());
        }
        for (const auto& id : ids) engine_->abort_request(id), finish_live(id, "abort");
      }
      dispatch(outs);
      ++num_steps_since_trim_;
    }
    publish_gauges();
    if (live_.empty() && queue_.empty() && num_steps_since_trim_ > 0) trim_due_ = true, num_steps_since_trim_ = 0;
  }
  // Stopping: everything still open ends with an error.
  std::lock_guard lk(mu_);
  for (auto& p : pending_) p.channel->fail("the server is shutting down", 503);
  pending_.clear();
  for (auto& g : queue_) g->channel->fail("the server is shutting down", 503);
  for (auto& [id, l] : live_) l.channel->fail("the server is shutting down", 503);
}

int AsyncEngine::drop_queued(Group& g) {
  const int n = static_cast<int>(g.reqs.size() - std::min(g.next, g.reqs.size()));
  g.next = g.reqs.size();
  g.dropped = true;
  if (n > 0) {
    std::lock_guard lk(mu_);
    pending_count_ -= n;
  }
  return n;
}

void AsyncEngine::admit_fair() {
  // 1. Round-robin: one sequence from each group in turn, while the engine's waiting queue is short and the
  // group holds fewer than max_seqs_per_request_ sequences in the engine.
  const int queue_cap = std::max(1, cfg_.scheduler.max_num_seqs);
  const auto now = std::chrono::steady_clock::now();
  // Fair share while several requests are active: seats and not-yet-prefilled prompt tokens in the engine.
  const int active = static_cast<int>(queue_.size()) + num_draining_groups_;
  const int share = active > 1 ? std::max(1, std::min(max_seqs_per_request_, cfg_.scheduler.max_num_seqs / active))
                               : max_seqs_per_request_;
  const long long token_cap = 2LL * cfg_.scheduler.max_num_batched_tokens;
  int added_total = 0;
  bool progress = true;
  while (progress && !queue_.empty() && engine_->num_waiting_requests() < queue_cap) {
    progress = false;
    for (size_t k = 0; k < queue_.size() && engine_->num_waiting_requests() < queue_cap; ++k) {
      const std::shared_ptr<Group>& gp = queue_[(rr_ + k) % queue_.size()];
      Group& g = *gp;
      if (g.dropped || g.next >= g.reqs.size() || g.in_engine >= share) continue;
      const int prompt_len = static_cast<int>(g.reqs[g.next].prompt_token_ids.size());
      if (g.unprefilled > 0 && g.unprefilled + prompt_len > token_cap) continue;
      const size_t i = g.next++;
      const std::string id = g.reqs[i].request_id;
      {
        std::lock_guard lk(mu_);
        --pending_count_;
      }
      try {
        engine_->add_request(std::move(g.reqs[i]));
      } catch (const std::exception& e) {
        // The server validated the group, so this is rare: the whole group fails (400), its added sequences abort.
        std::vector<std::string> ids;
        for (const auto& [lid, l] : live_)
          if (l.group.get() == &g) ids.push_back(lid);
        for (const auto& a : ids) engine_->abort_request(a), finish_live(a, "abort");
        drop_queued(g);
        if (!g.accepted) g.channel->set_accepted(e.what());
        else g.channel->fail(e.what(), 400);
        continue;
      }
      ++added_total;
      ++g.in_engine;
      g.unprefilled += prompt_len;
      ++num_unfinished_;
      live_[id] = Live{g.channel, gp, static_cast<int>(i), g.arrival, now, 0, prompt_len, now, now, prompt_len};
      if (!g.accepted) g.accepted = true, g.channel->set_accepted("");
      progress = true;
    }
    rr_ = queue_.empty() ? 0 : (rr_ + 1) % queue_.size();
  }
  // (engine_waiting_ is not raised here: sequences just added are scheduled by the coming step, and counting them
  // as waiting during it would refuse requests (503) for as long as that step runs; publish_gauges recounts after.)
  if (added_total > 0)
    spdlog::debug("admit: {} added, {} groups active, share {}, engine waiting {} running {}", added_total, active, share,
                  engine_->num_waiting_requests(), engine_->num_running_requests());
  // 2. Groups with nothing left to add leave the queue (their sequences in the engine stay live).
  for (size_t q = 0; q < queue_.size();) {
    if (queue_[q]->dropped || queue_[q]->next >= queue_[q]->reqs.size()) {
      queue_[q]->in_queue = false;
      if (queue_[q]->in_engine > 0) ++num_draining_groups_;
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(q));
      if (rr_ > q) --rr_;
    } else {
      ++q;
    }
  }
  if (rr_ >= queue_.size()) rr_ = 0;
}

void AsyncEngine::dispatch(std::vector<RequestOutput>& outs) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& o : outs) {
    auto it = live_.find(o.request_id);
    if (it == live_.end()) continue;
    Live& l = it->second;
    const size_t n_new = o.delta_token_ids.size();
    to_delta(o, l.num_tokens == 0);  // channels hold (and coalesce) only what is new (a no-op on delta outputs)
    if (n_new > 0) {
      if (l.num_tokens == 0) {
        l.group->unprefilled -= std::exchange(l.prompt_len, 0);
        metrics_.observe_ttft(std::chrono::duration<double>(now - l.arrival).count());
        l.first_token = now;
        metrics_.add_prompt_tokens(o.prompt_token_ids.size());
      } else {
        metrics_.observe_itl(std::chrono::duration<double>(now - l.last_token).count());
      }
      l.last_token = now;
      l.num_tokens += n_new;
      metrics_.add_generation_tokens(n_new);
    }
    const bool finished = o.finished;
    const std::string reason = finished && !o.outputs.empty() ? std::string(finish_reason_name(o.outputs[0].finish_reason)) : "";
    const size_t pending = l.channel->push(l.index, std::move(o));
    if (finished) {
      metrics_.observe_e2e(std::chrono::duration<double>(now - l.arrival).count());
      auto secs = [](auto d) { return std::chrono::duration<double>(d).count(); };
      const auto first = l.num_tokens > 0 ? l.first_token : now;
      metrics_.observe_request({secs(l.admitted - l.arrival), secs(first - l.admitted), secs(now - first),
                                secs(now - l.admitted), static_cast<uint64_t>(l.prompt_tokens), l.num_tokens});
      finish_live(it->first, reason);
    } else if (opt_.max_pending_output_bytes > 0 && pending > opt_.max_pending_output_bytes) {
      abort_unread(l.channel, pending);
    }
  }
}

void AsyncEngine::abort_unread(std::shared_ptr<OutputChannel> ch, size_t pending) {  // by value: finish_live drops live_ copies
  std::vector<std::string> ids;
  for (const auto& [id, l] : live_)
    if (l.channel == ch) ids.push_back(id), drop_queued(*l.group);
  spdlog::warn("aborting {} requests: their client left {} bytes of output unread (--max-pending-output-bytes {})",
               ids.size(), pending, opt_.max_pending_output_bytes);
  for (const auto& id : ids) engine_->abort_request(id), finish_live(id, "abort");
  ch->fail(fmt::format("the client did not read its response: {} bytes of output were waiting, more than the server's "
                       "limit of {} (--max-pending-output-bytes); the request was aborted",
                       pending, opt_.max_pending_output_bytes),
           429, /*discard=*/true);
}

void AsyncEngine::finish_live(const std::string& id, const std::string& reason) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Group& g = *it->second.group;
  g.unprefilled -= it->second.prompt_len;
  if (--g.in_engine == 0 && !g.in_queue) --num_draining_groups_;
  live_.erase(it);
  metrics_.count_finished(reason);
  --num_unfinished_;
}

void AsyncEngine::publish_gauges() {
  EngineGauges g;
  g.num_requests_running = engine_->num_running_requests();
  engine_waiting_ = engine_->num_waiting_requests();
  {
    std::lock_guard lk(mu_);
    g.num_requests_waiting = engine_waiting_.load() + pending_count_;
  }
  g.state_blocks_total = engine_->num_state_blocks() - 1;
  g.state_blocks_used = g.state_blocks_total - engine_->num_free_blocks();
  g.num_preemptions = engine_->num_preemptions();
  const PrefixCacheStats pc = engine_->prefix_cache_stats();
  g.prefix_cache_queries = pc.queries;
  g.prefix_cache_hits = pc.hits;
  const SpecDecodeStats& sd = engine_->spec_decode_stats();
  g.spec_decode_num_drafts = sd.num_drafts;
  g.spec_decode_num_draft_tokens = sd.num_draft_tokens;
  g.spec_decode_num_accepted_tokens = sd.num_accepted_tokens;
  g.spec_decode_accepted_per_pos = sd.accepted_per_pos;
  metrics_.set_gauges(g);
}

}  // namespace ssmserve::server
