// Owns the device mirror of the engine's recurrent-state pool: per layer one device buffer indexed by the engine's
// block ids, so they address the GPU states directly. For a whole cache the buffer has the StateCache's page
// layout (conv window, then SSM state, 64-byte aligned parts; a hybrid's KV blocks live in the same pages). For a
// tensor-parallel rank's view (StateCache::is_shard) it holds only that rank's shard of every state, in compact
// pages of its own (conv shard, then SSM shard, each 64-byte aligned): each GPU stores 1/N of the states
// (issue 9, vllm-ssm-design.md §5). The host pool keeps the bookkeeping; the GPU kernels read and write only the mirror.
// StateCache::zero_block is not mirrored: a block handed out again starts with has_initial_states = 0, and
// the prefill kernels then never read its old contents.
#pragma once
#include <cstddef>
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "cache/state_cache.h"
#include "model/causal_lm.h"
#include "device/device.h"

namespace ssmserve::cuda {

class DeviceStateMirror {
 public:
  /// (Re)allocates zeroed device buffers when `cache` differs from the last one seen (layers, blocks, pages).
  /// Throws Error when the device is out of memory.
  void sync_layout(const StateCache& cache);
  /// Bytes of one block's page in the mirror for `shape`, with `dtypes`, when compact (a rank's shard).
  static int64_t compact_page_bytes(const StateShape& shape, const StateDtypes& dtypes);
  /// Copies block c.src's page onto block c.dst's in every layer, for each copy in order, on `stream` (ordered before
  /// the kernels queued after it). Call sync_layout first. Throws Error on a block outside [1, num_blocks).
  void copy_blocks(std::span<const BlockCopy> copies, cudaStream_t stream) const;
  /// The host tier (--swap-space): (re)allocates `num_slots` pinned host pages of num_layers x the device page bytes
  /// (a block's whole page in every layer, as the mirror keeps them: its states, or a hybrid's KV block, which is
  /// the page at TP 1 and lies in a shard's compact page at TP > 1), and a side stream with its events. Call
  /// sync_layout first. Throws Error when pinned memory cannot be allocated.
  void allocate_host_tier(int num_slots);
  /// Copies device block c.src's page -> host slot c.dst in every layer on `stream` (ordered after the work queued on it
  /// before, and before the work queued after: the block may be written again). Throws Error out of range.
  void swap_out(std::span<const BlockCopy> copies, cudaStream_t stream) const;
  /// Copies host slot c.src -> device block c.dst in every layer on the side stream, which first waits for `stream`'s
  /// work so far (a swap-out may have just read the block); `stream` then waits for the copies (the next forward
  /// needs them) without blocking the host. Throws Error out of range.
  void swap_in(std::span<const BlockCopy> copies, cudaStream_t stream) const;
  int num_host_slots() const { return host_slots_; }
  ~DeviceStateMirror();
  DeviceStateMirror() = default;
  DeviceStateMirror(const DeviceStateMirror&) = delete;
  DeviceStateMirror& operator=(const DeviceStateMirror&) = delete;
  /// Device views of layer `layer` (same dtype and block stride as the host views).
  StateView conv_state(int layer) const { return conv_[layer]; }
  StateView ssm_state(int layer) const { return ssm_[layer]; }
  /// The per-layer device buffers (for DecodeGraphs signatures).
  void pointers(std::vector<const void*>& out) const {
    for (const auto& b : buffers_) out.push_back(b.data());
  }

 private:
  const StateCache* cache_ = nullptr;
  int num_blocks_ = 0;
  int64_t page_bytes_ = 0;
  int64_t device_page_bytes_ = 0;  // bytes per block in the device buffers (compact for a shard)
  StateShape shape_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<StateView> conv_, ssm_;
  DeviceBuffer layer_bases_;  // [layers] device pointers of buffers_ (copy_blocks' one launch)
  // Host tier: slot s, layer l at host_ + (s * layers + l) * device_page_bytes_ (pinned).
  std::byte* host_ = nullptr;
  int host_slots_ = 0;
  cudaStream_t side_ = nullptr;
  cudaEvent_t before_ = nullptr, after_ = nullptr;  // stream -> side, side -> stream ordering
  void free_host_tier();
};

}  // namespace ssmserve::cuda
