// Owns the per-step work plans of the layer kinds that need one, built on the host once per step and uploaded in one
// copy (outside any CUDA graph; the captured kernels read them from a fixed device buffer): the lightning layers'
// block / range plan over their LinearAttentionMetadata, the softmax layers' split-KV work list over the
// PagedAttentionMetadata, and both metadata arrays. Built only for the kinds the model has.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cuda/lightning.h"
#include "kernels/cuda/paged_attention.h"
#include "model/forward_batch.h"
#include "runtime/runner_common.h"

namespace ssmserve::cuda {

/// What the plans need to know of the model (0 / false: the model has no such layers).
struct StepPlanShape {
  bool linear = false;          ///< lightning layers
  int linear_block_size = 256;  ///< their intra-block length
  int linear_heads = 0;         ///< their heads (this rank)
  bool attention = false;       ///< softmax layers
  int attention_group = 1;      ///< query heads per KV head
  bool attention_tc = false;    ///< the tensor-core prefill pass (bf16 weights)
  bool attention_fixed_split = false;  ///< kKeySplit keys per split whatever the step (batch-invariant mode)
  int kv_block_size = 0;
};

struct StepPlans {
  StepPlanShape shape;
  LightningPlan lplan;
  PagedAttentionPlan aplan;
  /// Element offsets of each array in the uploaded buffer.
  size_t lin_idx = 0, lin_qsl = 0, lin_nc = 0, blocks = 0, seq_first = 0, qtiles = 0, ranges = 0, seq_first_range = 0,
         block_range = 0, block_store = 0, range_store = 0;
  size_t tables = 0, seq_lens = 0, attn_qsl = 0, slots = 0, positions = 0, tasks = 0, items = 0, tc_tiles = 0,
         tc_items = 0, tc_row_key_base = 0, tc_stage_rows = 0;

  /// Builds the plans of `batch` (decode_only: the decode work list of the attention layers) into the host array.
  /// Throws Error on malformed metadata.
  void build(const ForwardBatch& batch, bool decode_only);
  /// Copies the host array to the device on stream s (asynchronously; the host array stays valid until the next build).
  void upload(cudaStream_t s);
  /// Device pointer of the array at element offset `off`.
  const int32_t* dev(size_t off) const { return static_cast<const int32_t*>(dev_.buf.data()) + off; }
  /// The device buffer (DecodeGraphs signatures).
  const void* device_buffer() const { return dev_.buf.data(); }
  /// The LightningPlanDev of the prefill rows (decode rows first: nd of them), with the "all"-mode stores of
  /// batch.meta (state_store_*_p) when the step has any.
  LightningPlanDev lightning_prefill(int nd) const;

 private:
  std::vector<int32_t> host_;
  Scratch dev_;
};

}  // namespace ssmserve::cuda
