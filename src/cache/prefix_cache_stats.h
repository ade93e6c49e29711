// Owns the prefix-cache counters the engine reports (Prometheus ssmserve:prefix_cache_queries_total /
// ssmserve:prefix_cache_hits_total, bench's hit rate; vLLM's PrefixCacheStats).
#pragma once
#include <cstdint>

namespace ssmserve {

/// Cumulative prefix-cache counters, in tokens (vLLM counts tokens too).
struct PrefixCacheStats {
  int64_t queries = 0;   ///< prompt tokens looked up (each request's prompt length, at its first schedule)
  int64_t hits = 0;      ///< of those, tokens served from the cache (num_cached_tokens summed)
  int64_t requests = 0;  ///< requests looked up
  /// hits / queries, 0 when nothing was queried.
  double hit_rate() const { return queries > 0 ? static_cast<double>(hits) / static_cast<double>(queries) : 0.0; }
};

}  // namespace ssmserve
