// Owns the one-shot peer-to-peer all-reduce for small messages between the GPUs of one process (tensor-parallel
// decode steps, issue 9): each rank copies its values into its staging buffer, raises its flag on every peer
// (a store over NVLink), waits for every peer's flag, then reads all ranks' staging buffers and adds them in rank
// order 0..N-1, so every rank ends with bit-identical sums. One kernel, no host work: it can be captured in CUDA
// graphs. The call counter lives on the device (incremented by the kernel), so graph replays see fresh epochs; two
// staging buffers alternate by epoch parity, and a rank cannot overwrite a buffer a peer may still read (the peer
// raised its next flag only after finishing that read). The idea is vLLM's custom all-reduce (one-shot variant),
// written for in-process ranks (plain peer pointers instead of IPC handles).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssmserve::cuda {

/// Most ranks the one-shot all-reduce supports.
inline constexpr int kP2pMaxRanks = 8;

/// One rank's view of the group (all pointers valid on this rank's GPU: peers' through peer access).
struct P2pAllReduceRank {
  int rank = 0;
  int world = 1;
  int64_t max_count = 0;                    ///< floats per staging buffer
  float* staging[kP2pMaxRanks][2] = {};     ///< rank p's two staging buffers [max_count] fp32
  uint64_t* flags[kP2pMaxRanks] = {};       ///< rank p's flags [kP2pMaxRanks]: flags[p][q] = last epoch rank q signaled
  uint64_t* epoch = nullptr;                ///< this rank's call counter (device, 1 value)
};

/// In place on this rank's GPU: data[i] = sum over ranks p (in order 0..world-1) of rank p's data[i], i < count.
/// Every rank of the group must call it with the same count, in the same order relative to its other calls.
/// data: [count] fp32 device. Returns cudaErrorInvalidValue when count > g.max_count or world outside [2, 8].
cudaError_t p2p_all_reduce_sum(const P2pAllReduceRank& g, float* data, int64_t count, cudaStream_t stream);

}  // namespace ssmserve::cuda
