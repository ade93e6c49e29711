// Owns the one-shot peer-to-peer collectives between the GPUs of one process (tensor-parallel decode steps, issue 9):
// all-reduce (sum) and all-gather of up to max_count fp32 values, one kernel each call, no host work, so they can be
// captured in CUDA graphs.
//
// Push protocol: every rank writes its values straight into each peer's receive buffer (stores over NVLink are
// posted, so they pipeline; remote loads would each wait a round trip), raises its flag on that peer, waits for
// every peer's flag on itself, then reads the peers' values from its own memory. The work is split into
// kP2pBlocks blocks by a fixed map of 4-float quads (the same on every rank for the same count, whatever the data
// pointers' alignment), and each block has its own flags, so a block waits only for the same block of its peers.
// Sums run in rank order 0..N-1 on every rank, so every rank ends with bit-identical values.
//
// Epochs: each block keeps a call counter on the device (incremented by the kernel: graph replays see fresh epochs).
// Every block takes part in every call (blocks without values only exchange flags), so the counters move in
// lockstep and a call's epoch parity picks one of two receive slots. A rank cannot overwrite a slot a peer may still
// read: it writes call k+1 only after its call k saw the peer's call-k flags, which the peer raised after finishing
// call k-1, the last call that used the slot. The idea is vLLM's custom all-reduce (one-shot variant), written for
// in-process ranks (plain peer pointers instead of IPC handles) and with pushes instead of remote reads.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssmserve::cuda {

/// Most ranks the one-shot collectives support.
inline constexpr int kP2pMaxRanks = 8;
/// Blocks of one call (each with its own flags and epoch).
inline constexpr int kP2pBlocks = 32;

/// One rank's view of the group (all pointers valid on this rank's GPU: peers' through peer access).
struct P2pAllReduceRank {
  int rank = 0;
  int world = 1;
  int64_t max_count = 0;               ///< floats per (slot, source) receive buffer; a multiple of 4
  float* recv[kP2pMaxRanks] = {};      ///< rank p's receive buffers [2 slots][world sources][max_count] fp32
  uint64_t* flags[kP2pMaxRanks] = {};  ///< rank p's flags [kP2pBlocks][kP2pMaxRanks]: last epoch block b of rank q raised
  uint64_t* epoch = nullptr;           ///< this rank's call counters [kP2pBlocks] (device)
};

/// Bytes of one rank's receive buffers, flags and epochs for a group of `world` ranks (one allocation, zeroed;
/// recv at offset 0, flags at p2p_flags_offset, epochs after the flags).
int64_t p2p_buffer_bytes(int world, int64_t max_count);
/// Byte offset of the flags in that allocation.
int64_t p2p_flags_offset(int world, int64_t max_count);

/// In place on this rank's GPU: data[i] = sum over ranks p (in order 0..world-1) of rank p's data[i], i < count.
/// Every rank of the group must call it with the same count, in the same order relative to its other calls
/// (all-reduces and all-gathers share the epochs). data: [count] fp32 device, any 4-byte alignment.
/// Returns cudaErrorInvalidValue when count > g.max_count, count < 0 or world outside [2, 8].
cudaError_t p2p_all_reduce_sum(const P2pAllReduceRank& g, float* data, int64_t count, cudaStream_t stream);

/// recv [world, count] fp32 = every rank's send [count] fp32, rank-major (NCCL's all-gather layout). send and recv
/// must not overlap. Same calling rules and errors as p2p_all_reduce_sum.
cudaError_t p2p_all_gather(const P2pAllReduceRank& g, const float* send, int64_t count, float* recv, cudaStream_t stream);

}  // namespace ssmserve::cuda
