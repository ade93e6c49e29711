// Owns the view through which the softmax-attention kernels address the paged KV cache inside the shared block
// pool (vllm-ssm-design.md §3.5). A KV block is one page of the pool: for every softmax layer, K then V for
// block_size tokens, each [block_size, num_kv_heads, head_dim] fp32. The same page can hold a linear-attention
// state block at another time; see docs/architecture.md ("One block pool for states and KV").
#pragma once
#include <cstddef>
#include <cstdint>

namespace ssmserve {

/// One softmax layer's K and V across all blocks of the pool. Block b's keys start at
/// base + b * page_bytes + layer_offset_bytes; its values follow block_size * num_kv_heads * head_dim floats later.
struct KvCacheView {
  std::byte* base = nullptr;       ///< page 0 of the pool
  int64_t page_bytes = 0;          ///< bytes between consecutive blocks
  int64_t layer_offset_bytes = 0;  ///< this layer's K within a page
  int block_size = 0;              ///< tokens per block
  int num_kv_heads = 0;
  int head_dim = 0;

  /// Floats of one of K or V per block: [block_size, num_kv_heads, head_dim].
  int64_t kv_elems() const { return static_cast<int64_t>(block_size) * num_kv_heads * head_dim; }
  /// Bytes this layer uses per page (K and V).
  int64_t layer_bytes() const { return 2 * kv_elems() * static_cast<int64_t>(sizeof(float)); }
  /// Keys of block b: [block_size, num_kv_heads, head_dim].
  float* k(int64_t b) const { return reinterpret_cast<float*>(base + b * page_bytes + layer_offset_bytes); }
  /// Values of block b: [block_size, num_kv_heads, head_dim].
  float* v(int64_t b) const { return k(b) + kv_elems(); }
};

}  // namespace ssmserve
