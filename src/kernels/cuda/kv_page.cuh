// Owns a device helper of the paged KV cache's page layout (cache/kv_cache.h KvCacheView): within a page, a softmax
// layer's K rows [block_size, num_kv_heads, head_dim] fp32 (at layer_offset_bytes), then its V rows.
#pragma once
#include <cstdint>

#include "cache/kv_cache.h"

namespace ssmserve::cuda::detail {

/// Floats of K (or V) per page for this layer: block_size * num_kv_heads * head_dim.
__device__ __forceinline__ int64_t kv_elems(const KvCacheView& c) {
  return static_cast<int64_t>(c.block_size) * c.num_kv_heads * c.head_dim;
}

}  // namespace ssmserve::cuda::detail
