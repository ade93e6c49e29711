// Owns softmax attention over the paged KV cache on the CPU (vLLM's reshape_and_cache + paged attention, causal,
// GQA): one code path for prefill and decode rows, so a token's output does not depend on how its sequence was
// split into steps or which rows share the batch.
#pragma once
#include <cstdint>
#include <span>

#include "cache/kv_cache.h"

namespace ssmserve::cpu {

/// Writes each token's K and V into its cache slot. k: [T, num_kv_heads * head_dim] fp32 with row stride
/// k_stride; v likewise; slot_mapping: [T], slot = block * block_size + offset, -1 = skip (padded rows).
/// Throws Error on a slot outside [-1, num_blocks * block_size) (num_blocks = 0 skips the bound check).
void reshape_and_cache(const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t T,
                       std::span<const int32_t> slot_mapping, const KvCacheView& cache, int64_t num_blocks);

/// Causal softmax attention of every token against its sequence's cached keys and values.
///   q: [T, num_heads * head_dim] fp32 (row stride q_stride); out: [T, num_heads * head_dim] (stride out_stride).
///   Row r owns tokens [query_start_loc[r], query_start_loc[r+1]) and has seq_lens[r] tokens of context in the
///   cache *including* its new ones (already written by reshape_and_cache), so its i-th token sits at position
///   seq_lens[r] - n + i and attends to positions [0, that]. block_tables: [num_rows, max_blocks] block ids.
///   A row with seq_lens 0 (padding) gets zeros. Query head h reads KV head h / (num_heads / num_kv_heads).
///   softmax(q k^T * scale) v with the max subtracted, keys summed in position order (fixed: batch-invariant).
/// Throws Error on inconsistent sizes (seq_len < query length, a block table too short).
void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, int num_heads, float scale,
                     const KvCacheView& cache, std::span<const int32_t> query_start_loc,
                     std::span<const int32_t> seq_lens, std::span<const int32_t> block_tables, int max_blocks);

}  // namespace ssmserve::cpu
