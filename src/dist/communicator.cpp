// Owns the in-process (threads as ranks) communicator backend (see communicator.h).
#include "dist/communicator.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve::dist {

/// Rank `rank` of an InProcessGroup.
class InProcessGroup::Rank final : public Communicator {
 public:
  Rank(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_.world_; }

  void all_reduce_sum(float* data, int64_t count) override {
    SSM_CHECK(count >= 0, "all_reduce_sum: negative count {}", count);
    if (g_.world_ == 1) return;
    // 1. Publish the buffer; rank 0 sizes the shared result (nobody reads it between collectives).
    if (rank_ == 0) g_.reduced_.resize(static_cast<size_t>(count));
    publish(data, count, "all_reduce_sum");
    // 2. Reduce this rank's slice of the elements, adding the ranks in order 0..N-1.
    const int64_t W = g_.world_, per = (count + W - 1) / W;
    const int64_t i0 = std::min(count, rank_ * per), i1 = std::min(count, i0 + per);
    float* out = g_.reduced_.data();
    if (i1 > i0) {
      std::copy(g_.send_[0] + i0, g_.send_[0] + i1, out + i0);
      for (int r = 1; r < W; ++r) {
        const float* src = g_.send_[r];
        for (int64_t i = i0; i < i1; ++i) out[i] += src[i];
      }
    }
    g_.barrier_.arrive_and_wait();
    // 3. Every rank copies the whole result; the last barrier keeps the result alive until all have copied.
    std::copy(out, out + count, data);
    g_.barrier_.arrive_and_wait();
  }

  void all_gather(const float* send, int64_t count, float* recv) override {
    SSM_CHECK(count >= 0, "all_gather: negative count {}", count);
    if (g_.world_ == 1) {
      std::copy(send, send + count, recv);
      return;
    }
    publish(send, count, "all_gather");
    for (int r = 0; r < g_.world_; ++r) std::copy(g_.send_[r], g_.send_[r] + count, recv + r * count);
    g_.barrier_.arrive_and_wait();  // the senders' buffers stay valid until everyone has read them
  }

  void barrier() override { g_.barrier_.arrive_and_wait(); }

 private:
  // Posts this rank's buffer and count, waits for all ranks, then checks the counts agree (every rank sees the
  // same counts, so a mismatch throws on all ranks after one more barrier, leaving none waiting).
  void publish(const float* buf, int64_t count, const char* op) {
    g_.send_[rank_] = buf;
    g_.counts_[rank_] = count;
    g_.barrier_.arrive_and_wait();
    const bool same = std::all_of(g_.counts_.begin(), g_.counts_.end(), [&](int64_t c) { return c == g_.counts_[0]; });
    if (!same) {
      const int64_t c0 = g_.counts_[0], mine = count;
      g_.barrier_.arrive_and_wait();  // everyone has read counts_ before anyone moves on
      fail("{}: ranks passed different element counts (rank 0: {}, rank {}: {})", op, c0, rank_, mine);
    }
  }

  InProcessGroup& g_;
  int rank_;
};

InProcessGroup::InProcessGroup(int world_size)
    : world_(world_size), barrier_(std::max(1, world_size)), send_(std::max(1, world_size)), counts_(std::max(1, world_size)) {
  SSM_CHECK(world_size >= 1, "InProcessGroup: world size must be >= 1 (got {})", world_size);
  for (int r = 0; r < world_size; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

InProcessGroup::~InProcessGroup() = default;

Communicator& InProcessGroup::communicator(int rank) {
  SSM_CHECK(rank >= 0 && rank < world_, "InProcessGroup: rank {} outside [0, {})", rank, world_);
  return *ranks_[rank];
}

}  // namespace ssmserve::dist
