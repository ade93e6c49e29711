// Owns the CPU lightning-attention kernels (see lightning.h).
#include "kernels/cpu/lightning.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {

float lightning_decay(float s, double k) { return static_cast<float>(std::exp(-static_cast<double>(s) * k)); }

namespace {

/// Loads head h's state of block b into S (fp32 [D, D]), or zeros.
template <class T>
void load_state(const StateView& v, int32_t b, int h, int D, bool has_initial, float* S) {
  const int64_t n = static_cast<int64_t>(D) * D;
  if (!has_initial) {
    std::fill(S, S + n, 0.0f);
    return;
  }
  const T* src = v.block<T>(b) + h * n;
  for (int64_t i = 0; i < n; ++i) S[i] = load_f32(src[i]);
}

template <class T>
void store_state(const StateView& v, int32_t b, int h, int D, const float* S) {
  const int64_t n = static_cast<int64_t>(D) * D;
  T* dst = v.block<T>(b) + h * n;
  for (int64_t i = 0; i < n; ++i) store_f32(dst[i], S[i]);
}

/// One prefill row, one head: tokens [t0, t0 + n) at sequence positions [c, c + n).
void prefill_head(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride, int h, int D, int bs, float s,
                  int64_t t0, int64_t n, int64_t c, float* S, std::vector<float>& scratch) {
  const int64_t DD = static_cast<int64_t>(D) * D;
  scratch.resize(static_cast<size_t>(DD + 4 * bs + bs * bs));
  float* kvb = scratch.data();        // [D, D] sum_j kd_j k_j^T v_j of the block
  float* qd = kvb + DD;               // [bs] e^{-s(i+1)}
  float* kd = qd + bs;                // [bs] e^{-s(m-1-j)}
  float* dd = kd + bs;                // [bs] e^{-s k}
  float* A = dd + bs;                 // [bs, bs] (q_i . k_j) e^{-s(i-j)}
  const auto q_of = [&](int64_t t) { return qkv + t * qkv_stride + static_cast<int64_t>(h) * 3 * D; };
  for (int64_t i = 0; i < bs; ++i) dd[i] = lightning_decay(s, static_cast<double>(i));
  int64_t t = 0;
  while (t < n) {
    // Block: from sequence position c + t to the next multiple of bs (or the end of the chunk).
    const int64_t pos = c + t;
    const int64_t m = std::min<int64_t>(bs - pos % bs, n - t);
    for (int64_t i = 0; i < m; ++i) {
      qd[i] = lightning_decay(s, static_cast<double>(i + 1));
      kd[i] = lightning_decay(s, static_cast<double>(m - 1 - i));
    }
    // 1. Intra-block scores A[i][j] = (q_i . k_j) e^{-s(i-j)}, j <= i.
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = q_of(t0 + t + i);
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = q_of(t0 + t + j) + D;
        float a = 0.0f;
#pragma omp simd reduction(+ : a)
        for (int d = 0; d < D; ++d) a += qi[d] * kj[d];
        A[i * bs + j] = a * dd[i - j];
      }
    }
    // 2. Outputs: inter-block e^{-s(i+1)} q_i S, then the intra-block sum over j in order.
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = q_of(t0 + t + i);
      float* o = out + (t0 + t + i) * out_stride + static_cast<int64_t>(h) * D;
      std::fill(o, o + D, 0.0f);
      for (int d = 0; d < D; ++d) {
        const float qv = qi[d];
        const float* Sd = S + static_cast<int64_t>(d) * D;
#pragma omp simd
        for (int e = 0; e < D; ++e) o[e] += qv * Sd[e];
      }
#pragma omp simd
      for (int e = 0; e < D; ++e) o[e] *= qd[i];
      for (int64_t j = 0; j <= i; ++j) {
        const float a = A[i * bs + j];
        const float* vj = q_of(t0 + t + j) + 2 * D;
#pragma omp simd
        for (int e = 0; e < D; ++e) o[e] += a * vj[e];
      }
    }
    // 3. State: S <- e^{-s m} S + sum_j e^{-s(m-1-j)} k_j^T v_j.
    std::fill(kvb, kvb + DD, 0.0f);
    for (int64_t j = 0; j < m; ++j) {
      const float* kj = q_of(t0 + t + j) + D;
      const float* vj = kj + D;
      for (int d = 0; d < D; ++d) {
        const float kv = kd[j] * kj[d];
        float* row = kvb + static_cast<int64_t>(d) * D;
#pragma omp simd
        for (int e = 0; e < D; ++e) row[e] += kv * vj[e];
      }
    }
    const float bd = lightning_decay(s, static_cast<double>(m));
#pragma omp simd
    for (int64_t x = 0; x < DD; ++x) S[x] = bd * S[x] + kvb[x];
    t += m;
  }
}

void check_params(const LightningParams& p) {
  SSM_CHECK(p.num_heads > 0 && p.head_dim > 0 && p.block_size > 0 && p.slopes != nullptr,
            "lightning: invalid parameters (heads {}, head_dim {}, block_size {})", p.num_heads, p.head_dim, p.block_size);
}

}  // namespace

void lightning_prefill(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride, const LightningParams& p,
                       std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                       std::span<const int32_t> state_indices) {
  check_params(p);
  const int64_t rows = static_cast<int64_t>(state_indices.size());
  if (rows == 0) return;
  SSM_CHECK(static_cast<int64_t>(query_start_loc.size()) == rows + 1 && static_cast<int64_t>(num_computed.size()) == rows,
            "lightning_prefill: {} rows but query_start_loc has {} and num_computed {} entries", rows, query_start_loc.size(),
            num_computed.size());
  for (int64_t r = 0; r < rows; ++r)
    SSM_CHECK(query_start_loc[r + 1] >= query_start_loc[r] && num_computed[r] >= 0, "lightning_prefill: row {} is malformed", r);
  const int H = p.num_heads, D = p.head_dim;
  visit_state_dtype(p.states.dtype, [&](auto tag) {
    using T = decltype(tag);
#pragma omp parallel
    {
      std::vector<float> S(static_cast<size_t>(D) * D), scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t rh = 0; rh < rows * H; ++rh) {
        const int64_t r = rh / H;
        const int h = static_cast<int>(rh % H);
        const int32_t b = state_indices[r];
        const int64_t t0 = query_start_loc[r], n = query_start_loc[r + 1] - t0;
        if (b == 0) {
          for (int64_t t = t0; t < t0 + n; ++t) std::fill_n(out + t * out_stride + static_cast<int64_t>(h) * D, D, 0.0f);
          continue;
        }
        load_state<T>(p.states, b, h, D, num_computed[r] > 0, S.data());
        prefill_head(qkv, qkv_stride, out, out_stride, h, D, p.block_size, p.slopes[h], t0, n, num_computed[r], S.data(), scratch);
        store_state<T>(p.states, b, h, D, S.data());
      }
    }
  });
}

void lightning_decode(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride, const LightningParams& p,
                      const DecodeRows& rows) {
  check_params(p);
  const int64_t nrows = rows.num_rows();
  const int H = p.num_heads, D = p.head_dim;
  visit_state_dtype(p.states.dtype, [&](auto tag) {
    using T = decltype(tag);
#pragma omp parallel
    {
      std::vector<float> S(static_cast<size_t>(D) * D);
#pragma omp for schedule(static)
      for (int64_t rh = 0; rh < nrows * H; ++rh) {
        const int64_t r = rh / H;
        const int h = static_cast<int>(rh % H);
        // Token j: the state after token j - 1 (its column) -> one decay-and-add step -> column j, with the loads and
        // stores of that many plain decode steps.
        for (int j = 0; j < rows.num_tokens(r); ++j) {
          const int64_t t = rows.token_row(r, j);
          float* o = out + t * out_stride + static_cast<int64_t>(h) * D;
          std::fill(o, o + D, 0.0f);
          if (rows.is_null(r)) continue;
          const float* q = qkv + t * qkv_stride + static_cast<int64_t>(h) * 3 * D;
          const float *k = q + D, *v = q + 2 * D;
          load_state<T>(p.states, rows.src_block(r, j), h, D, true, S.data());
          const float decay = lightning_decay(p.slopes[h], 1.0);
          for (int d = 0; d < D; ++d) {
            float* Sd = S.data() + static_cast<int64_t>(d) * D;
            const float kv = k[d], qv = q[d];
#pragma omp simd
            for (int e = 0; e < D; ++e) {
              Sd[e] = decay * Sd[e] + kv * v[e];
              o[e] += qv * Sd[e];
            }
          }
          store_state<T>(p.states, rows.dst_block(r, j), h, D, S.data());
        }
      }
    }
  });
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, lightning_prefill, (const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                 const LightningParams& p, std::span<const int32_t> query_start_loc,
                 std::span<const int32_t> num_computed, std::span<const int32_t> state_indices),
                 (qkv, qkv_stride, out, out_stride, p, query_start_loc, num_computed, state_indices))
SSM_CPU_DISPATCH(void, lightning_decode, (const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride,
                 const LightningParams& p, const DecodeRows& rows), (qkv, qkv_stride, out, out_stride, p, rows))
SSM_CPU_DISPATCH(float, lightning_decay, (float s, double k), (s, k))
