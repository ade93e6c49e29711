// Owns the tensor-parallel helpers of the GPU runners (see tp_runner.h).
#include "runtime/tp_runner.h"

#include <algorithm>

#include "device/cuda_check.h"

namespace ssmserve::cuda {

void RunnerTp::gather_logits(LmFrame& frame, int64_t n_logits, int64_t V, float* logits_host, cudaStream_t s) {
  const int W = tp.world;
  const int64_t per = vocab_per_rank(V), n = n_logits * per;
  if (n > 0) {
    float* all = gathered.f32(W * n);
    tp.comm->all_gather(frame.logits.f32(n), n, all);
    if (logits_host) {
      host.resize(static_cast<size_t>(W * n));
      SSM_CUDA_CHECK(cudaMemcpyAsync(host.data(), all, W * n * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
  }
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  if (!logits_host || n == 0) return;
  for (int r = 0; r < W; ++r) {  // [W, n_logits, per] -> [n_logits, V]
    const int64_t v0 = r * per, cols = std::max<int64_t>(0, std::min(V, v0 + per) - v0);
    for (int64_t i = 0; i < n_logits; ++i)
      std::copy_n(host.data() + (r * n_logits + i) * per, cols, logits_host + i * V + v0);
  }
}

void RunnerTp::gather_logits_device(LmFrame& frame, int64_t n_logits, int64_t V, cudaStream_t s) {
  const int W = tp.world;
  const int64_t per = vocab_per_rank(V), n = n_logits * per;
  if (n == 0) return;
  float* all = gathered.f32(W * n);  // [W, n_logits, per]
  float* logits = frame.logits.f32(n_logits * V);
  tp.comm->all_gather(logits, n, all);
  for (int r = 0; r < W; ++r) {  // rank r's columns [r * per, min(V, (r + 1) * per)) of every row
    const int64_t v0 = r * per, cols = std::max<int64_t>(0, std::min(V, v0 + per) - v0);
    if (cols == 0) continue;
    SSM_CUDA_CHECK(cudaMemcpy2DAsync(logits + v0, V * sizeof(float), all + r * n, per * sizeof(float),
                                     cols * sizeof(float), n_logits, cudaMemcpyDeviceToDevice, s));
  }
}

}  // namespace ssmserve::cuda
