// Owns the GPU runner's second branch (CudaModelOptions::moe_shared_branch): a stream whose work overlaps the main
// stream's within a step, its own GEMM handle (the skinny GEMM's cross-block workspace and cuBLASLt's workspace must
// not be shared by concurrent launches), the context its modules run with, and the fork / join events. Recorded inside
// a decode graph capture, the fork and join become graph edges: the branch is a parallel branch of the graph.
// Used by the MoE layers (the shared expert on the branch while the routed experts run on the main stream) and by a
// parallel mixer pair (CudaModelOptions::parallel_mixer_branch: Falcon-H1's attention on the branch while its Mamba-2
// mixer runs on the main stream; the runner gives that module a context copied from ctx with a scratch pool of its own).
#pragma once
#include <cuda_runtime_api.h>

#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/gemm.h"
#include "runtime/cuda_module.h"

namespace ssmserve::cuda {

struct CudaBranch {
  Stream side;
  GemmHandle gemm;
  /// The main context with stream = side and gemm = this branch's handle. PDL (CudaModelOptions::branch_pdl) for the
  /// branch's kernels after its first: the user launches the first one plainly, since it follows the fork's event
  /// wait (a plain dependency), as the Mamba-1 decode overlap's branch.
  CudaRunnerContext ctx;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;

  /// main: the runner's context (its branch pointer is not copied).
  explicit CudaBranch(const CudaRunnerContext& main) : ctx(main) {
    ctx.stream = side.get();
    ctx.gemm = &gemm;
    ctx.branch = nullptr;
    ctx.opt.pdl = main.opt.pdl && main.opt.branch_pdl;
    configure_gemm(gemm, ctx.opt);
    gemm.set_pdl(ctx.opt.pdl);
    SSM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
    SSM_CUDA_CHECK(cudaEventCreateWithFlags(&join_event, cudaEventDisableTiming));
  }
  ~CudaBranch() {
    for (cudaEvent_t e : {fork_event, join_event})
      if (e) cudaEventDestroy(e);
  }
  CudaBranch(const CudaBranch&) = delete;
  CudaBranch& operator=(const CudaBranch&) = delete;

  /// The branch waits for everything enqueued on `main` so far.
  void fork(cudaStream_t main) const {
    SSM_CUDA_CHECK(cudaEventRecord(fork_event, main));
    SSM_CUDA_CHECK(cudaStreamWaitEvent(side.get(), fork_event, 0));
  }
  /// Records the join event after everything enqueued on the branch so far and returns it, for a wait enqueued later
  /// (e.g. just before the one kernel that reads the branch's output: sparse_moe's MoeSharedAdd::ready).
  cudaEvent_t done() const {
    SSM_CUDA_CHECK(cudaEventRecord(join_event, side.get()));
    return join_event;
  }
  /// `main` waits for everything enqueued on the branch so far.
  void join(cudaStream_t main) const { SSM_CUDA_CHECK(cudaStreamWaitEvent(main, done(), 0)); }
};

}  // namespace ssmserve::cuda
