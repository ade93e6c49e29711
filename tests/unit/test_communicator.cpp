// The in-process communicator (threads as ranks): all_reduce_sum adds in rank order and leaves bit-identical
// results on every rank, all_gather lays the ranks' buffers out in rank order, repeated collectives of varying
// sizes don't interfere, and ranks passing different counts all get an Error (none is left waiting).
#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace ssmserve::dist {
namespace {

// Runs body(comm) on one thread per rank of a fresh group.
void on_ranks(int world, const std::function<void(Communicator&)>& body) {
  InProcessGroup group(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(group.communicator(r)); });
  for (auto& t : threads) t.join();
}

// A value whose fp32 sums depend on the order: large and tiny magnitudes by rank.
float value(int rank, int64_t i) { return (rank % 2 ? 1e7f : 1e-3f) * static_cast<float>((i * 31 + rank * 17) % 97 + 1) / 97.0f; }

TEST(InProcessCommunicator, AllReduceSumsInRankOrderOnEveryRank) {
  for (int world : {1, 2, 3, 4, 8}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1000}}) {
      std::vector<std::vector<float>> result(world);
      on_ranks(world, [&](Communicator& c) {
        EXPECT_EQ(c.world_size(), world);
        std::vector<float> buf(count);
        for (int64_t i = 0; i < count; ++i) buf[i] = value(c.rank(), i);
        c.all_reduce_sum(buf.data(), count);
        result[c.rank()] = buf;
      });
      for (int64_t i = 0; i < count; ++i) {
        float expect = value(0, i);
        for (int r = 1; r < world; ++r) expect += value(r, i);
        for (int r = 0; r < world; ++r) ASSERT_EQ(result[r][i], expect) << "world " << world << " rank " << r << " i " << i;
      }
    }
  }
}

TEST(InProcessCommunicator, AllGatherRepeatedCollectivesAndBarrier) {
  const int world = 4;
  std::vector<std::vector<float>> gathered(world);
  on_ranks(world, [&](Communicator& c) {
    for (int round = 0; round < 50; ++round) {  // sizes change every round; each round checks the previous didn't leak
      const int64_t n = 1 + (round * 7) % 13;
      std::vector<float> send(n, static_cast<float>(c.rank() * 100 + round)), recv(world * n);
      c.all_gather(send.data(), n, recv.data());
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(recv[r * n + i], static_cast<float>(r * 100 + round));
      std::vector<float> one(n, 1.0f);
      c.all_reduce_sum(one.data(), n);
      for (float v : one) ASSERT_EQ(v, static_cast<float>(world));
      c.barrier();
    }
    gathered[c.rank()] = {1.0f};
  });
  for (const auto& g : gathered) EXPECT_EQ(g.size(), 1u);
}

TEST(InProcessCommunicator, MismatchedCountsThrowOnEveryRank) {
  const int world = 3;
  std::vector<int> threw(world, 0);
  on_ranks(world, [&](Communicator& c) {
    std::vector<float> buf(8, 1.0f), recv(world * 8);
    try {
      c.all_reduce_sum(buf.data(), c.rank() == 1 ? 4 : 8);
    } catch (const Error&) {
      ++threw[c.rank()];
    }
    try {
      c.all_gather(buf.data(), c.rank() == 2 ? 2 : 8, recv.data());
    } catch (const Error&) {
      ++threw[c.rank()];
    }
    c.all_reduce_sum(buf.data(), 8);  // the group still works afterwards
    EXPECT_EQ(buf[0], 3.0f);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(threw[r], 2) << "rank " << r;
  EXPECT_THROW(InProcessGroup(0), Error);
  InProcessGroup g(2);
  EXPECT_THROW(g.communicator(2), Error);
}

}  // namespace
}  // namespace ssmserve::dist
