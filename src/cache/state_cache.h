// Owns the recurrent state pool: for every recurrent layer one byte buffer of num_blocks pages, a page holding
// that layer's conv window then its SSM state, each in its own dtype, so one block id addresses a request's
// state in every layer (vllm-ssm-design.md §1.2, §3.1). Block 0 is the null block: never handed out, kernels
// skip it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "cache/state_view.h"
#include "core/dtype.h"

namespace ssmserve {

/// Per-layer state sizes (elements per block) of one layer group, derived once from the model.
struct StateShape {
  int64_t conv_elems = 0;  ///< e.g. Mamba-1: (d_conv - 1) * d_inner, layout [d_conv-1, d_inner]
  int64_t ssm_elems = 0;   ///< e.g. Mamba-1: d_inner * d_state, layout [d_inner, d_state]
  int64_t min_page_bytes = 0;  ///< page at least this large (hybrids: a KV block shares the page, §3.5)
};

/// Activation dtype of the CPU backend: its math is fp32 (weights may be bf16, activations never are), so
/// mamba_cache_dtype "auto" resolves to fp32 here (in vLLM it is the model dtype, e.g. bf16 on GPU).
inline constexpr DType kCpuActivationDType = DType::F32;

/// Element types of the two states (vLLM's CacheConfig.mamba_cache_dtype / mamba_ssm_cache_dtype).
struct StateDtypes {
  DType conv = kCpuActivationDType;  ///< conv window: the activation dtype
  DType ssm = DType::F32;            ///< SSM state: fp32 (the accurate default; bf16 / fp16 save memory)

  /// Resolves vLLM's option strings. mamba_cache_dtype: "auto" (= kCpuActivationDType), "float32", "bfloat16",
  /// "float16". mamba_ssm_cache_dtype: the same values, "auto" meaning the conv dtype (vLLM's rule).
  /// Throws Error naming the flag (--mamba-cache-dtype / --mamba-ssm-cache-dtype) on any other value.
  static StateDtypes from_options(std::string_view mamba_cache_dtype, std::string_view mamba_ssm_cache_dtype);
};

/// The state storage of `num_layers` recurrent layers x `num_blocks` blocks. Layer l owns one buffer
/// [num_blocks, page_bytes]; page b = [conv state (conv_elems x conv dtype) | pad | ssm state (ssm_elems x ssm
/// dtype) | pad], each part starting on a 64-byte boundary (vLLM packs them back to back; the padding only keeps
/// a bf16 conv state from misaligning an fp32 SSM state and keeps blocks on separate cache lines). All blocks
/// start zeroed.
class StateCache {
 public:
  /// Throws Error when num_blocks < 2 (block 0 is the null block) or a size is negative.
  StateCache(int num_layers, StateShape shape, int num_blocks, StateDtypes dtypes = {});

  int num_blocks() const { return num_blocks_; }
  int num_layers() const { return parent_ ? parent_->num_layers() : static_cast<int>(buffers_.size()); }
  const StateShape& shape() const { return shape_; }
  const StateDtypes& dtypes() const { return dtypes_; }
  /// Layer `layer`'s conv windows: block b at [d_conv-1, channels] in dtypes().conv.
  StateView conv_state(int layer) const;
  /// Layer `layer`'s SSM states: block b at [d_inner, d_state] (Mamba-1) in dtypes().ssm.
  StateView ssm_state(int layer) const;
  /// Zeroes block `block`'s whole page in every layer (called before a freed block is handed out again).
  /// Throws Error when block is outside [0, num_blocks).
  void zero_block(int block);
  /// Copies block `src`'s page onto block `dst`'s in every layer (a shard view: only its own conv / SSM ranges), so
  /// dst holds the same states (prefix caching: a cached state into a running block, or a boundary snapshot).
  /// Throws Error when a block is outside [1, num_blocks).
  void copy_block(int src, int dst);
  /// Bytes of one layer's page (conv + ssm + alignment padding).
  int64_t page_bytes() const { return page_bytes_; }
  /// True for a tensor-parallel rank's view (shard()): its states are a slice of every page of the parent.
  bool is_shard() const { return parent_ != nullptr; }
  /// Bytes of state one block holds across all layers (num_layers x page_bytes).
  int64_t bytes_per_block() const { return page_bytes_ * num_layers(); }

  /// A non-owning view of one part of every page (tensor parallelism: rank r's model sees only its shard of each
  /// state). The view's conv state of block b starts `conv_offset` elements into this cache's conv state of b, its
  /// SSM state `ssm_offset` elements into this cache's SSM state; `shard` gives its sizes. It keeps this cache's
  /// blocks, dtypes and page stride, must not outlive this cache, and its zero_block zeroes only its own ranges.
  /// Throws Error when the shard does not fit inside this cache's conv / SSM states.
  StateCache shard(StateShape shard, int64_t conv_offset, int64_t ssm_offset) const;

 private:
  struct HugePageFree {  // frees a huge_page_alloc'ed layer buffer of `bytes` bytes
    std::size_t bytes = 0;
    void operator()(std::byte* p) const;
  };
  StateShape shape_;
  StateDtypes dtypes_;
  int num_blocks_ = 0;
  int64_t ssm_offset_ = 0;  // bytes from a page's start to its SSM state
  int64_t page_bytes_ = 0;
  std::vector<std::unique_ptr<std::byte[], HugePageFree>> buffers_;  // per layer [num_blocks, page_bytes]
  // Shard views (shard()): the cache owning the storage and the view's byte offsets into its conv / SSM states.
  const StateCache* parent_ = nullptr;
  int64_t conv_shard_bytes_ = 0, ssm_shard_bytes_ = 0;
  StateCache() = default;
};

}  // namespace ssmserve
