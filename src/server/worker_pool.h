// Owns WorkerPool: a fixed set of threads running posted tasks in order (the HTTP transport's handler threads).
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ssmserve::server {

/// Fixed-size pool of threads. post() queues a task (dropped after stop()); stop() drops queued tasks, waits for
/// running ones and joins the threads (idempotent).
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { run(); });
  }
  ~WorkerPool() { stop(); }
  void post(std::function<void()> fn) {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
      q_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      q_.clear();
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void run() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (stop_) return;
        fn = std::move(q_.front());
        q_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ssmserve::server
