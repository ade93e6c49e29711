// Shared by the GPU micro-benchmarks: the median CUDA-event time of repeated runs of a launch sequence.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "device/cuda_check.h"

namespace ssmserve::bench {

/// Median (ms) of the CUDA-event times of `reps` runs of f on stream s (f launches there), after `warm` untimed runs.
template <class F>
double median_ms(F&& f, cudaStream_t s = nullptr, int warm = 3, int reps = 15) {
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) f();
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> t(reps);
  for (int i = 0; i < reps; ++i) {
    SSM_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    SSM_CUDA_CHECK(cudaEventRecord(b, s));
    SSM_CUDA_CHECK(cudaEventSynchronize(b));
    SSM_CUDA_CHECK(cudaEventElapsedTime(&t[i], a, b));
  }
  SSM_CUDA_CHECK(cudaEventDestroy(a));
  SSM_CUDA_CHECK(cudaEventDestroy(b));
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

}  // namespace ssmserve::bench
