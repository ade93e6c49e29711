// Owns the CPU paged-attention kernels (see attention.h).
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/vec_math.h"

namespace ssmserve::cpu {

void reshape_and_cache(const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t T,
                       std::span<const int32_t> slot_mapping, const KvCacheView& cache, int64_t num_blocks) {
  SSM_CHECK(static_cast<int64_t>(slot_mapping.size()) == T, "reshape_and_cache: {} slots for {} tokens", slot_mapping.size(), T);
  const int64_t W = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = slot_mapping[t];
    if (s < 0) continue;
    SSM_CHECK(num_blocks == 0 || s < num_blocks * cache.block_size, "reshape_and_cache: slot {} outside the pool", s);
    const int64_t b = s / cache.block_size, off = s % cache.block_size;
    std::memcpy(cache.k(b) + off * W, k + t * k_stride, W * sizeof(float));
    std::memcpy(cache.v(b) + off * W, v + t * v_stride, W * sizeof(float));
  }
}

void paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, int num_heads, float scale,
                     const KvCacheView& cache, std::span<const int32_t> query_start_loc,
                     std::span<const int32_t> seq_lens, std::span<const int32_t> block_tables, int max_blocks) {
  const int64_t rows = static_cast<int64_t>(seq_lens.size());
  SSM_CHECK(static_cast<int64_t>(query_start_loc.size()) == rows + 1, "paged_attention: query_start_loc has {} entries for {} rows",
            query_start_loc.size(), rows);
  SSM_CHECK(static_cast<int64_t>(block_tables.size()) >= rows * max_blocks, "paged_attention: block table too small");
  SSM_CHECK(cache.num_kv_heads > 0 && num_heads % cache.num_kv_heads == 0, "paged_attention: {} heads over {} KV heads", num_heads,
            cache.num_kv_heads);
  const int D = cache.head_dim, bs = cache.block_size, group = num_heads / cache.num_kv_heads;
  const int64_t W = static_cast<int64_t>(cache.num_kv_heads) * D;
  // Token -> row, and validation (cheap, before the parallel part).
  const int64_t T = query_start_loc[rows];
  std::vector<int32_t> row_of(static_cast<size_t>(T));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = query_start_loc[r + 1] - query_start_loc[r];
    SSM_CHECK(n >= 0 && (seq_lens[r] == 0 || seq_lens[r] >= n), "paged_attention: row {} has {} new tokens but seq_len {}", r, n, seq_lens[r]);
    SSM_CHECK((seq_lens[r] + bs - 1) / bs <= max_blocks, "paged_attention: row {} needs more than {} blocks", r, max_blocks);
    for (int32_t t = query_start_loc[r]; t < query_start_loc[r + 1]; ++t) row_of[t] = static_cast<int32_t>(r);
  }
#pragma omp parallel
  {
    std::vector<float> p;  // [context] scores, then probabilities
    std::vector<float> acc(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 4)
    for (int64_t th = 0; th < T * num_heads; ++th) {
      const int64_t t = th / num_heads;
      const int h = static_cast<int>(th % num_heads), kvh = h / group;
      const int32_t r = row_of[t];
      float* o = out + t * out_stride + static_cast<int64_t>(h) * D;
      if (seq_lens[r] == 0) {
        std::fill(o, o + D, 0.0f);
        continue;
      }
      const int32_t n = query_start_loc[r + 1] - query_start_loc[r];
      const int32_t pos = seq_lens[r] - n + static_cast<int32_t>(t - query_start_loc[r]);
      const float* qt = q + t * q_stride + static_cast<int64_t>(h) * D;
      const int32_t* table = block_tables.data() + static_cast<int64_t>(r) * max_blocks;
      p.resize(static_cast<size_t>(pos + 1));
      // 1. Scores q.k * scale, keys in position order.
      float m = -INFINITY;
      for (int32_t j = 0; j <= pos; ++j) {
        const float* kj = cache.k(table[j / bs]) + static_cast<int64_t>(j % bs) * W + static_cast<int64_t>(kvh) * D;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < D; ++d) s += qt[d] * kj[d];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      // 2. Softmax numerators and their sum.
      float l = 0.0f;
#pragma omp simd reduction(+ : l)
      for (int32_t j = 0; j <= pos; ++j) {
        p[j] = exp_ps(p[j] - m);
        l += p[j];
      }
      // 3. Weighted values, then the normalization.
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t j = 0; j <= pos; ++j) {
        const float* vj = cache.v(table[j / bs]) + static_cast<int64_t>(j % bs) * W + static_cast<int64_t>(kvh) * D;
        const float pj = p[j];
#pragma omp simd
        for (int d = 0; d < D; ++d) acc[d] += pj * vj[d];
      }
      const float inv = 1.0f / l;
      for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
    }
  }
}

}  // namespace ssmserve::cpu
