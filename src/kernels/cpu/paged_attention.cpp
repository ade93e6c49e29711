// Owns the CPU paged-attention kernels (see attention.h).
#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/vec_math.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

constexpr int32_t kQueryTile = 16;  ///< tokens of one row sharing each key / value load

/// q . k over D floats (one fixed vectorized order for every caller).
inline float dot(const float* a, const float* b, int D) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

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
  // Validation (cheap, before the parallel part).
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = query_start_loc[r + 1] - query_start_loc[r];
    SSM_CHECK(n >= 0 && (seq_lens[r] == 0 || seq_lens[r] >= n), "paged_attention: row {} has {} new tokens but seq_len {}", r, n, seq_lens[r]);
    SSM_CHECK((seq_lens[r] + bs - 1) / bs <= max_blocks, "paged_attention: row {} needs more than {} blocks", r, max_blocks);
  }
  // Tasks: (row, KV head, tile of up to kQueryTile tokens). A tile's tokens and the query heads of that KV head
  // share every key / value load; each query's arithmetic (dot products, max, sum, accumulation, all in position
  // order) is the same whatever tile it lands in, so results do not depend on the batch or the chunking.
  struct Task {
    int32_t r, g, t0, t1;
  };
  std::vector<Task> tasks;
  for (int64_t r = 0; r < rows; ++r) {
    if (seq_lens[r] == 0) {
      for (int32_t t = query_start_loc[r]; t < query_start_loc[r + 1]; ++t)
        std::fill(out + t * out_stride, out + t * out_stride + static_cast<int64_t>(num_heads) * D, 0.0f);
      continue;
    }
    for (int32_t t0 = query_start_loc[r]; t0 < query_start_loc[r + 1]; t0 += kQueryTile)
      for (int g = 0; g < cache.num_kv_heads; ++g)
        tasks.push_back({static_cast<int32_t>(r), g, t0, std::min<int32_t>(t0 + kQueryTile, query_start_loc[r + 1])});
  }
#pragma omp parallel
  {
    std::vector<float> p, acc, mx, sum;
#pragma omp for schedule(dynamic, 1)
    for (size_t k = 0; k < tasks.size(); ++k) {
      const Task& task = tasks[k];
      const int32_t r = task.r, n = query_start_loc[r + 1] - query_start_loc[r];
      const int32_t pos0 = seq_lens[r] - n + (task.t0 - query_start_loc[r]);  // position of the tile's first token
      const int32_t nt = task.t1 - task.t0, nq = nt * group, len = pos0 + nt;     // keys [0, len)
      const int32_t* table = block_tables.data() + static_cast<int64_t>(r) * max_blocks;
      p.resize(static_cast<size_t>(nq) * len), acc.assign(static_cast<size_t>(nq) * D, 0.0f), mx.assign(nq, -INFINITY), sum.assign(nq, 0.0f);
      auto qptr = [&](int32_t i, int hh) { return q + (task.t0 + i) * q_stride + static_cast<int64_t>(task.g * group + hh) * D; };
      // 1. Scores q.k * scale, keys in position order; query (i, hh) sees keys [0, pos0 + i].
      for (int32_t j = 0; j < len; ++j) {
        const float* kj = cache.k(table[j / bs]) + static_cast<int64_t>(j % bs) * W + static_cast<int64_t>(task.g) * D;
        for (int32_t i = std::max(0, j - pos0); i < nt; ++i)
          for (int hh = 0; hh < group; ++hh) {
            const int32_t qi = i * group + hh;
            const float s = dot(qptr(i, hh), kj, D) * scale;
            p[static_cast<size_t>(qi) * len + j] = s;
            mx[qi] = std::max(mx[qi], s);
          }
      }
      // 2. Softmax numerators and their sums.
      for (int32_t qi = 0; qi < nq; ++qi) {
        float* pq = p.data() + static_cast<size_t>(qi) * len;
        const int32_t last = pos0 + qi / group;
        const float m = mx[qi];
        float l = 0.0f;
#pragma omp simd reduction(+ : l)
        for (int32_t j = 0; j <= last; ++j) {
          pq[j] = exp_ps(pq[j] - m);
          l += pq[j];
        }
        sum[qi] = l;
      }
      // 3. Weighted values in position order, then the normalization.
      for (int32_t j = 0; j < len; ++j) {
        const float* vj = cache.v(table[j / bs]) + static_cast<int64_t>(j % bs) * W + static_cast<int64_t>(task.g) * D;
        for (int32_t qi = std::max(0, j - pos0) * group; qi < nq; ++qi) {
          const float pj = p[static_cast<size_t>(qi) * len + j];
          float* a = acc.data() + static_cast<size_t>(qi) * D;
#pragma omp simd
          for (int d = 0; d < D; ++d) a[d] += pj * vj[d];
        }
      }
      for (int32_t qi = 0; qi < nq; ++qi) {
        const int32_t i = qi / group, hh = qi % group;
        float* o = out + (task.t0 + i) * out_stride + static_cast<int64_t>(task.g * group + hh) * D;
        const float inv = 1.0f / sum[qi];
        for (int d = 0; d < D; ++d) o[d] = acc[static_cast<size_t>(qi) * D + d] * inv;
      }
    }
  }
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, reshape_and_cache, (const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                 int64_t T, std::span<const int32_t> slot_mapping, const KvCacheView& cache, int64_t num_blocks),
                 (k, k_stride, v, v_stride, T, slot_mapping, cache, num_blocks))
SSM_CPU_DISPATCH(void, paged_attention, (const float* q, int64_t q_stride, float* out, int64_t out_stride,
                 int num_heads, float scale, const KvCacheView& cache, std::span<const int32_t> query_start_loc,
                 std::span<const int32_t> seq_lens, std::span<const int32_t> block_tables, int max_blocks),
                 (q, q_stride, out, out_stride, num_heads, scale, cache, query_start_loc, seq_lens, block_tables,
                 max_blocks))
