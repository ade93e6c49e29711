// Owns the tests of for_each_layer_parallel (model/parallel_layers.h): every layer visited once on any thread
// count, and the error a sequential loop would raise first (the lowest failing layer's) whichever layer fails
// first in time.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "model/parallel_layers.h"

namespace ssmserve {
namespace {

TEST(ParallelLayers, LowestFailingLayersErrorOnEveryThreadCount) {
  const int saved = omp_get_max_threads();
  for (const int threads : {1, 2, 4, 7}) {
    omp_set_num_threads(threads);
    std::vector<std::atomic<int>> visits(16);
    try {
      for_each_layer_parallel(16, [&](int64_t l) {
        ++visits[static_cast<size_t>(l)];
        // The lowest failing layer fails last in time (the others throw at once).
        if (l == 3) std::this_thread::sleep_for(std::chrono::milliseconds(20)), fail("layer {} is bad", l);
        if (l == 7 || l == 15) fail("layer {} is bad", l);
        if (l == 11) throw std::bad_alloc();
      });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "layer 3 is bad") << threads << " threads";
    }
    for (int l = 0; l < 16; ++l) EXPECT_EQ(visits[static_cast<size_t>(l)].load(), 1) << "layer " << l << ", " << threads << " threads";
  }
  omp_set_num_threads(saved);
}

TEST(ParallelLayers, KeepsTheExceptionTypeAndRunsNothingForNoLayers) {
  EXPECT_THROW(for_each_layer_parallel(5, [](int64_t l) { if (l >= 2) throw std::bad_alloc(); }), std::bad_alloc);
  int calls = 0;
  for_each_layer_parallel(0, [&](int64_t) { ++calls; });
  for_each_layer_parallel(-3, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace ssmserve
