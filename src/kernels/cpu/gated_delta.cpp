// Owns the gated delta rule on the CPU: the chunked (WY / UT transform) prefill, the one-token decode update and the
// double-precision reference recurrence (math in gated_delta.h).
#include "kernels/cpu/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

void check_params(const GatedDeltaParams& p) {
  SSM_CHECK(p.num_k_heads > 0 && p.num_v_heads > 0 && p.num_v_heads % p.num_k_heads == 0,
            "gated delta rule: num_v_heads {} must be a positive multiple of num_k_heads {}", p.num_v_heads, p.num_k_heads);
  SSM_CHECK(p.head_k_dim > 0 && p.head_v_dim > 0 && p.chunk_size > 0, "gated delta rule: head dims and chunk_size must be positive");
}

/// The token's rows of value head h: q / k of its key head, v, g, beta.
struct TokenView {
  const GatedDeltaInputs& in;
  const GatedDeltaParams& p;
  int group;  // value heads per key head
  const float* q(int64_t t, int h) const { return in.q + t * in.q_stride + static_cast<int64_t>(h / group) * p.head_k_dim; }
  const float* k(int64_t t, int h) const { return in.k + t * in.k_stride + static_cast<int64_t>(h / group) * p.head_k_dim; }
  const float* v(int64_t t, int h) const { return in.v + t * in.v_stride + static_cast<int64_t>(h) * p.head_v_dim; }
  float g(int64_t t, int h) const { return in.g[t * in.g_stride + h]; }
  float beta(int64_t t, int h) const { return in.beta[t * in.beta_stride + h]; }
};

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

/// Loads head h's state [Dk, Dv] of block b as fp32 (zeros when !read).
template <class T>
void load_state(const GatedDeltaParams& p, int64_t b, int h, bool read, float* S) {
  const int64_t n = static_cast<int64_t>(p.head_k_dim) * p.head_v_dim;
  if (!read) {
    std::fill(S, S + n, 0.0f);
    return;
  }
  const T* src = p.states.block<T>(b) + h * n;
  for (int64_t i = 0; i < n; ++i) S[i] = load_f32(src[i]);
}

template <class T>
void store_state(const GatedDeltaParams& p, int64_t b, int h, const float* S) {
  const int64_t n = static_cast<int64_t>(p.head_k_dim) * p.head_v_dim;
  T* dst = p.states.block<T>(b) + h * n;
  for (int64_t i = 0; i < n; ++i) store_f32(dst[i], S[i]);
}

/// One chunk of m tokens starting at packed row t0 on value head h: updates S [Dk, Dv] and writes o rows.
/// w: scratch of at least m * (m + Dk + 2 Dv + 2) + Dv floats.
void chunk_step(const TokenView& tv, int h, int64_t t0, int m, float* S, float* out, int64_t out_stride, std::vector<float>& w,
                std::vector<double>& c) {
  const int Dk = tv.p.head_k_dim, Dv = tv.p.head_v_dim;
  w.resize(static_cast<size_t>(m) * (m + Dk + 2 * Dv + 2) + Dv);
  float* A = w.data();             // [m, m] strictly lower: beta_i (k_i . k_j) e^{c_i - c_j}
  float* U = A + m * m;            // [m, Dv] -> V~
  float* W = U + m * Dv;           // [m, Dk]
  float* ec = W + m * Dk;          // [m] e^{c_i}
  float* beta = ec + m;            // [m]
  float* row = beta + m;           // [Dv] scratch
  c.resize(static_cast<size_t>(m));
  double acc = 0.0;
  for (int i = 0; i < m; ++i) {
    acc += tv.g(t0 + i, h);
    c[i] = acc;
    ec[i] = static_cast<float>(std::exp(acc));
    beta[i] = tv.beta(t0 + i, h);
  }
  // UT system and its forward substitution: (I + A) U = diag(beta) V, (I + A) W = diag(beta e^c) K.
  for (int i = 0; i < m; ++i) {
    const float* ki = tv.k(t0 + i, h);
    for (int j = 0; j < i; ++j) A[i * m + j] = beta[i] * dot(ki, tv.k(t0 + j, h), Dk) * static_cast<float>(std::exp(c[i] - c[j]));
    float* Ui = U + static_cast<int64_t>(i) * Dv;
    float* Wi = W + static_cast<int64_t>(i) * Dk;
    const float* vi = tv.v(t0 + i, h);
    const float bk = beta[i] * ec[i];
    for (int d = 0; d < Dv; ++d) Ui[d] = beta[i] * vi[d];
    for (int d = 0; d < Dk; ++d) Wi[d] = bk * ki[d];
    for (int j = 0; j < i; ++j) {
      const float a = A[i * m + j];
      const float* Uj = U + static_cast<int64_t>(j) * Dv;
      const float* Wj = W + static_cast<int64_t>(j) * Dk;
      for (int d = 0; d < Dv; ++d) Ui[d] = std::fma(-a, Uj[d], Ui[d]);
      for (int d = 0; d < Dk; ++d) Wi[d] = std::fma(-a, Wj[d], Wi[d]);
    }
  }
  // V~ = U - W S (in place in U).
  for (int i = 0; i < m; ++i) {
    float* Ui = U + static_cast<int64_t>(i) * Dv;
    const float* Wi = W + static_cast<int64_t>(i) * Dk;
    for (int d = 0; d < Dk; ++d) {
      const float wd = -Wi[d];
      const float* Sd = S + static_cast<int64_t>(d) * Dv;
      for (int e = 0; e < Dv; ++e) Ui[e] = std::fma(wd, Sd[e], Ui[e]);
    }
  }
  // o_i = e^{c_i} S^T q_i + sum_{j <= i} (q_i . k_j) e^{c_i - c_j} v~_j (S is still the carried-in state).
  for (int i = 0; i < m; ++i) {
    const float* qi = tv.q(t0 + i, h);
    std::fill(row, row + Dv, 0.0f);
    for (int d = 0; d < Dk; ++d) {
      const float qd = qi[d];
      const float* Sd = S + static_cast<int64_t>(d) * Dv;
      for (int e = 0; e < Dv; ++e) row[e] = std::fma(qd, Sd[e], row[e]);
    }
    float* o = out + (t0 + i) * out_stride + static_cast<int64_t>(h) * Dv;
    for (int e = 0; e < Dv; ++e) o[e] = ec[i] * row[e];
    for (int j = 0; j <= i; ++j) {
      const float a = dot(qi, tv.k(t0 + j, h), Dk) * static_cast<float>(std::exp(c[i] - c[j]));
      const float* Uj = U + static_cast<int64_t>(j) * Dv;
      for (int e = 0; e < Dv; ++e) o[e] = std::fma(a, Uj[e], o[e]);
    }
  }
  // S <- e^{c_m} S + sum_j e^{c_m - c_j} k_j v~_j^T.
  const float em = ec[m - 1];
  for (int64_t i = 0; i < static_cast<int64_t>(Dk) * Dv; ++i) S[i] *= em;
  for (int j = 0; j < m; ++j) {
    const float dj = static_cast<float>(std::exp(c[m - 1] - c[j]));
    const float* kj = tv.k(t0 + j, h);
    const float* Uj = U + static_cast<int64_t>(j) * Dv;
    for (int d = 0; d < Dk; ++d) {
      const float kd = dj * kj[d];
      float* Sd = S + static_cast<int64_t>(d) * Dv;
      for (int e = 0; e < Dv; ++e) Sd[e] = std::fma(kd, Uj[e], Sd[e]);
    }
  }
}

}  // namespace

void gated_delta_prefill(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                         std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                         std::span<const int32_t> state_indices) {
  check_params(p);
  const int64_t R = static_cast<int64_t>(state_indices.size());
  SSM_CHECK(query_start_loc.size() == state_indices.size() + 1 && num_computed.size() == state_indices.size(),
            "gated_delta_prefill: query_start_loc must have one more entry than state_indices and num_computed");
  const TokenView tv{in, p, p.num_v_heads / p.num_k_heads};
  const int Hv = p.num_v_heads, Dk = p.head_k_dim, Dv = p.head_v_dim;
  visit_state_dtype(p.states.dtype, [&](auto tag) {
    using T = decltype(tag);
#pragma omp parallel
    {
      std::vector<float> S(static_cast<size_t>(Dk) * Dv), w;
      std::vector<double> c;
#pragma omp for collapse(2) schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        for (int h = 0; h < Hv; ++h) {
          const int64_t t_begin = query_start_loc[r], t_end = query_start_loc[r + 1];
          const int64_t b = state_indices[r];
          if (b == 0) {  // null block: outputs zero, no state touched
            for (int64_t t = t_begin; t < t_end; ++t) std::fill_n(out + t * out_stride + int64_t{h} * Dv, Dv, 0.0f);
            continue;
          }
          load_state<T>(p, b, h, num_computed[r] > 0, S.data());
          int64_t pos = num_computed[r];  // sequence position of token t_begin
          for (int64_t t = t_begin; t < t_end;) {
            const int m = static_cast<int>(std::min<int64_t>(p.chunk_size - pos % p.chunk_size, t_end - t));
            chunk_step(tv, h, t, m, S.data(), out, out_stride, w, c);
            t += m, pos += m;
          }
          if (t_end > t_begin || num_computed[r] == 0) store_state<T>(p, b, h, S.data());
        }
      }
    }
  });
}

void gated_delta_decode(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                        const DecodeRows& rows) {
  check_params(p);
  const TokenView tv{in, p, p.num_v_heads / p.num_k_heads};
  const int64_t R = rows.num_rows();
  const int Hv = p.num_v_heads, Dk = p.head_k_dim, Dv = p.head_v_dim;
  visit_state_dtype(p.states.dtype, [&](auto tag) {
    using T = decltype(tag);
#pragma omp parallel
    {
      std::vector<float> S(static_cast<size_t>(Dk) * Dv), kv(static_cast<size_t>(Dv));
#pragma omp for collapse(2) schedule(static)
      for (int64_t r = 0; r < R; ++r) {
        for (int h = 0; h < Hv; ++h) {
          // Token j: the state after token j - 1 (its column) -> one delta-rule step -> column j, with the loads and
          // stores of that many plain decode steps.
          for (int j = 0; j < rows.num_tokens(r); ++j) {
            const int64_t t = rows.token_row(r, j);
            float* o = out + t * out_stride + int64_t{h} * Dv;
            if (rows.is_null(r)) {
              std::fill_n(o, Dv, 0.0f);
              continue;
            }
            load_state<T>(p, rows.src_block(r, j), h, true, S.data());
            const float e = static_cast<float>(std::exp(static_cast<double>(tv.g(t, h))));
            const float* q = tv.q(t, h);
            const float* k = tv.k(t, h);
            const float* v = tv.v(t, h);
            const float beta = tv.beta(t, h);
            // S' = e S; kv = S'^T k; delta = beta (v - kv); S = S' + k delta^T; o = S^T q.
            std::fill(kv.begin(), kv.end(), 0.0f);
            for (int d = 0; d < Dk; ++d) {
              float* Sd = S.data() + int64_t{d} * Dv;
              for (int c = 0; c < Dv; ++c) {
                Sd[c] *= e;
                kv[c] = std::fma(Sd[c], k[d], kv[c]);
              }
            }
            for (int c = 0; c < Dv; ++c) kv[c] = beta * (v[c] - kv[c]);  // delta
            std::fill_n(o, Dv, 0.0f);
            for (int d = 0; d < Dk; ++d) {
              float* Sd = S.data() + int64_t{d} * Dv;
              for (int c = 0; c < Dv; ++c) {
                Sd[c] = std::fma(k[d], kv[c], Sd[c]);
                o[c] = std::fma(Sd[c], q[d], o[c]);
              }
            }
            store_state<T>(p, rows.dst_block(r, j), h, S.data());
          }
        }
      }
    }
  });
}

void gated_delta_reference(const GatedDeltaInputs& in, const GatedDeltaParams& p, int64_t T, double* state, double* out) {
  check_params(p);
  const TokenView tv{in, p, p.num_v_heads / p.num_k_heads};
  const int Hv = p.num_v_heads, Dk = p.head_k_dim, Dv = p.head_v_dim;
  std::vector<double> kv(static_cast<size_t>(Dv));
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < Hv; ++h) {
      double* S = state + static_cast<int64_t>(h) * Dk * Dv;
      const double e = std::exp(static_cast<double>(tv.g(t, h))), beta = tv.beta(t, h);
      const float* q = tv.q(t, h);
      const float* k = tv.k(t, h);
      const float* v = tv.v(t, h);
      std::fill(kv.begin(), kv.end(), 0.0);
      for (int d = 0; d < Dk; ++d)
        for (int c = 0; c < Dv; ++c) {
          S[d * Dv + c] *= e;
          kv[c] += S[d * Dv + c] * k[d];
        }
      for (int c = 0; c < Dv; ++c) kv[c] = beta * (v[c] - kv[c]);
      double* o = out + (t * Hv + h) * Dv;
      for (int c = 0; c < Dv; ++c) o[c] = 0.0;
      for (int d = 0; d < Dk; ++d)
        for (int c = 0; c < Dv; ++c) {
          S[d * Dv + c] += k[d] * kv[c];
          o[c] += S[d * Dv + c] * q[d];
        }
    }
  }
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, gated_delta_prefill, (const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                 int64_t out_stride, std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                 std::span<const int32_t> state_indices),
                 (in, p, out, out_stride, query_start_loc, num_computed, state_indices))
SSM_CPU_DISPATCH(void, gated_delta_decode, (const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out,
                 int64_t out_stride, const DecodeRows& rows), (in, p, out, out_stride, rows))
SSM_CPU_DISPATCH(void, gated_delta_reference, (const GatedDeltaInputs& in, const GatedDeltaParams& p, int64_t T,
                 double* state, double* out), (in, p, T, state, out))
