// Owns the collective-communication interface tensor parallelism is written against (vllm-ssm-design.md §5:
// row-parallel projections all-reduce their partial sums, the vocab-parallel LM head all-gathers its logits)
// and its in-process backend, where the ranks are threads of one process.
//
// Backends: InProcessGroup (below; CPU, threads as ranks, deterministic) and NcclGroup (runtime/nccl_communicator.h,
// CUDA builds: one thread per GPU, a `ncclComm_t` per rank from ncclCommInitAll, the same calls on device pointers
// enqueued on a CUDA stream); the model code only ever sees `Communicator&`.
#pragma once
#include <barrier>
#include <cstdint>
#include <memory>
#include <vector>

namespace ssmserve::dist {

/// One rank's handle on a group of `world_size()` ranks. Every rank of the group must make the same sequence of
/// collective calls with the same counts (as with NCCL / MPI); each call returns once this rank's part is done.
/// Not thread-safe: one thread drives one rank's communicator.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank's index in [0, world_size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group (>= 1).
  virtual int world_size() const = 0;
  /// In place: data[i] = sum over ranks r of rank r's data[i], for i in [0, count). fp32. Every rank ends with
  /// bit-identical values. Throws Error (on every rank) when the ranks pass different counts.
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  /// recv: [world_size(), count] fp32; recv[r * count + i] = rank r's send[i]. send and recv must not overlap.
  /// Throws Error (on every rank) when the ranks pass different counts.
  virtual void all_gather(const float* send, int64_t count, float* recv) = 0;
  /// Returns once every rank has called barrier().
  virtual void barrier() = 0;
  /// Device backends (NCCL): the CUDA stream (a cudaStream_t) later collectives are enqueued on; they then take
  /// device pointers and return once enqueued, ordered with the stream's other work. The CPU backend ignores it.
  virtual void set_stream(void* cuda_stream) {}
};

/// Where one model replica sits in a tensor-parallel group: rank r of `world` ranks talking through `comm`
/// (null when world == 1: nothing to communicate). Passed to the architectures' shard loaders.
struct TpRank {
  int rank = 0;
  int world = 1;
  Communicator* comm = nullptr;
};

/// A group of `world_size` ranks inside one process, one thread per rank (the CPU backend that lets CI test the
/// sharding). Collectives meet on a std::barrier and exchange pointers to the ranks' buffers; all_reduce_sum
/// adds the ranks' values in rank order 0..N-1 (each rank reduces one slice of the elements, then every rank
/// copies the whole result), so the result is deterministic and identical on every rank, whatever the thread
/// timing. The group must outlive its communicators' use.
class InProcessGroup {
 public:
  /// Throws Error when world_size < 1.
  explicit InProcessGroup(int world_size);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int world_size() const { return world_; }
  /// The communicator of rank `rank` (owned by the group). Throws Error when rank is outside [0, world_size).
  Communicator& communicator(int rank);

 private:
  class Rank;
  friend class Rank;
  int world_;
  std::barrier<> barrier_;
  std::vector<const float*> send_;  // per rank: the buffer it contributes to the running collective
  std::vector<int64_t> counts_;     // per rank: its element count (checked equal)
  std::vector<float> reduced_;      // [count] all_reduce_sum result, written slice by slice by the ranks
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace ssmserve::dist
