// Owns the NCCL backend of the communicator interface (dist/communicator.h; issue 9): one process, one thread per
// GPU, a ncclComm_t per rank from ncclCommInitAll over devices 0..N-1. libnccl is opened at run time (dlopen), so
// a build needs only nccl.h and runs on machines without NCCL until a tensor-parallel GPU model is asked for.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace ssmserve::cuda {

/// True when this build has the NCCL backend (nccl.h was found at configure time).
bool nccl_compiled();

/// Where libnccl is looked for, in order: $SSMSERVE_NCCL_LIB, the library CMake found at configure time, then
/// "libnccl.so.2" / "libnccl.so" on the loader's search path.
std::vector<std::string> nccl_library_candidates();

/// `world_size` ranks on GPUs 0..world_size-1 of this process. Collectives (Communicator API) take device pointers
/// of the rank's GPU and are enqueued on the stream given by set_stream (default: the legacy stream); fp32 sums
/// are NCCL's ncclSum (ring / tree order: identical on every rank, but not TP = 1's order). When every pair of GPUs
/// has peer access, all-reduces and all-gathers of up to 2^21 floats (8 MB: decode steps, logits) take the
/// one-shot peer-to-peer kernels instead (kernels/cuda/p2p_all_reduce.h: pushes over NVLink, rank-order sums, also
/// identical on every rank; 16 MB of receive buffers per rank per peer); SSMSERVE_TP_P2P_ALLREDUCE=0 keeps NCCL
/// for all. Each rank's
/// communicator must be driven by one thread with that rank's GPU current (cudaSetDevice(rank)).
class NcclGroup {
 public:
  /// Throws Error when NCCL is not compiled in or cannot be loaded (naming the paths tried), when fewer than
  /// world_size GPUs are visible, or when ncclCommInitAll fails (with NCCL's message).
  explicit NcclGroup(int world_size);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int world_size() const { return static_cast<int>(ranks_.size()); }
  /// Rank `rank`'s communicator (owned by the group). Throws Error outside [0, world_size).
  dist::Communicator& communicator(int rank);

 private:
  std::vector<std::unique_ptr<dist::Communicator>> ranks_;
  std::vector<void*> p2p_memory_;  ///< per rank: the one-shot all-reduce's staging buffers, flags and epoch
};

}  // namespace ssmserve::cuda
