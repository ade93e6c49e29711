// Owns what a GPU model runner needs to run as one tensor-parallel rank (issue 9; vllm-ssm-design.md §5): the
// rank's communicator (NCCL), the all-reduce after its row-parallel projections, and the vocab-parallel LM head's
// all-gather + download. The runners keep the embedding replicated on every GPU (a row lookup: no collective).
#pragma once
#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "runtime/runner_common.h"

namespace ssmserve::cuda {

/// One runner's place in its tensor-parallel group (world 1: every call is a no-op or the single-GPU path).
struct RunnerTp {
  dist::TpRank tp;
  Scratch gathered;        // [world, n_logits, per] the all-gathered logits
  std::vector<float> host; // the same on the host

  bool on() const { return tp.world > 1; }
  /// In place on the device, on the stream given to the communicator: data [count] fp32 = sum over ranks.
  void all_reduce(float* data, int64_t count) {
    if (on()) tp.comm->all_reduce_sum(data, count);
  }
  /// Logits columns this rank's LM head produces (its vocab_shard rows, padded to ceil(V / world)).
  int64_t vocab_per_rank(int64_t V) const { return (V + tp.world - 1) / tp.world; }
  /// Replaces LmFrame::download on a rank: all-gathers every rank's frame.logits [n_logits, per] (written by
  /// enqueue_head with V = vocab_per_rank(V)), copies them into logits_host [n_logits, V] when it is not null,
  /// and waits for the stream. Collective. Throws Error on a device / NCCL failure.
  void gather_logits(LmFrame& frame, int64_t n_logits, int64_t V, float* logits_host, cudaStream_t s);
  /// Sizes `gathered` for gather_logits_device (before a graph capture: the capture must not allocate).
  void reserve_gather(int64_t n_logits, int64_t V) { gathered.f32(tp.world * n_logits * vocab_per_rank(V)); }
  /// On the device, on stream s (capturable; no host synchronization): all-gathers every rank's frame.logits
  /// [n_logits, per] and rearranges them into frame.logits [n_logits, V] (its capacity is the whole vocabulary's),
  /// so the device greedy / sampling kernels see whole rows on every rank. Collective. Throws Error on a device /
  /// NCCL failure.
  void gather_logits_device(LmFrame& frame, int64_t n_logits, int64_t V, cudaStream_t s);
};

}  // namespace ssmserve::cuda
