// Owns tensor parallelism on GPUs (issue 9): `--device cuda --tensor-parallel-size N` loads one runner shard per
// GPU 0..N-1 (loaded concurrently, each thread with its GPU current), joined by an NCCL group, and runs them as one
// CausalLM through TensorParallelLM (one persistent thread per rank, cudaSetDevice(rank) first).
#include <cuda_runtime.h>

#include <exception>
#include <thread>

#include "core/error.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "model/tensor_parallel.h"
#include "runtime/cuda_decoder.h"
#include "runtime/cuda_mamba.h"
#include "runtime/nccl_communicator.h"

namespace ssmserve::cuda {
namespace {

using ShardLoader = std::function<std::unique_ptr<CausalLM>(const dist::TpRank&)>;

std::unique_ptr<CausalLM> load_tensor_parallel(int tp, const ShardLoader& load) {
  SSM_CHECK(tp >= 1 && tp <= kMaxTensorParallelSize, "--tensor-parallel-size must be in [1, {}] (got {})",
            kMaxTensorParallelSize, tp);
  auto group = std::make_shared<NcclGroup>(tp);
  std::vector<std::unique_ptr<CausalLM>> shards(static_cast<size_t>(tp));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        SSM_CUDA_CHECK(cudaSetDevice(r));
        shards[r] = load({r, tp, &group->communicator(r)});
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return std::make_unique<TensorParallelLM>(std::move(shards), group, [](int r) { cudaSetDevice(r); });
}

}  // namespace

std::unique_ptr<CausalLM> load_cuda_tensor_parallel(const ModelConfig& c, LoadFormat f, int tp, CudaModelOptions opt) {
  const DecoderSpec spec = architecture_spec(c);  // errors before any GPU work
  return load_tensor_parallel(tp, [&](const dist::TpRank& r) { return load_cuda_decoder(c, spec, f, opt, r); });
}

void register_cuda_tensor_parallel() {
  for (const std::string& arch : supported_architectures())
    register_device_tp_model("cuda", arch, [](const ModelConfig& c, LoadFormat f, int tp) {
      return load_cuda_tensor_parallel(c, f, tp, CudaModelOptions::for_model(c));
    });
}

}  // namespace ssmserve::cuda
