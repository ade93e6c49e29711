// Owns the CPU SSD chunked scan and the Mamba-2 decode state update (see ssd.h).
#include "kernels/cpu/ssd.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/small_gemm.h"
#include "kernels/cpu/vec_math.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

/// Decays exp(x) with x below this are taken as exactly 0 (e^-60 ~ 1e-26, far below fp32 resolution next to any
/// undecayed term). Besides skipping dead work, this keeps denormals (microcode assists, ~100x slower) out of
/// the FMAs: at chunk_size 256 with |A| up to 16 most far-apart token pairs decay below FLT_MIN.
constexpr float kMinLogDecay = -60.0f;

/// exp(x) for a log-decay x <= 0, flushed to 0 below kMinLogDecay.
inline float decay_exp(float x) { return x < kMinLogDecay ? 0.0f : std::exp(x); }

/// Processed dt of token row t, head h: clamp(softplus(dt_raw + dt_bias), min, max).
inline float step_dt(const SsdInputs& in, const SsdParams& p, int64_t t, int h) {
  const float d = softplus(in.dt.row(t)[h] + (p.dt_bias ? p.dt_bias[h] : 0.0f));
  return std::clamp(d, p.time_step_min, p.time_step_max);
}

void check_sizes(const SsdParams& p, const char* who) {
  SSM_CHECK(p.num_heads >= 1 && p.head_dim >= 1 && p.n_groups >= 1 && p.d_state >= 1,
            "{}: sizes must be >= 1 (num_heads {}, head_dim {}, n_groups {}, d_state {})", who, p.num_heads,
            p.head_dim, p.n_groups, p.d_state);
  SSM_CHECK(p.num_heads % p.n_groups == 0, "{}: num_heads {} is not a multiple of n_groups {}", who, p.num_heads,
            p.n_groups);
  SSM_CHECK(p.A != nullptr, "{}: A is required", who);
  for (int h = 0; h < p.num_heads; ++h)
    SSM_CHECK(p.A[h] <= 0.0f, "{}: A[{}] = {} must be <= 0 (A = -exp(A_log))", who, h, p.A[h]);
}

/// Validated chunk layout: per chunk its sequence, per sequence its first chunk.
struct ChunkPlan {
  int64_t num_tokens = 0, nchunks = 0, num_seqs = 0;
  std::vector<int32_t> first_chunk;  // [num_seqs]
};

ChunkPlan plan_chunks(const SsdChunkMetadata& m) {
  ChunkPlan c;
  c.num_seqs = static_cast<int64_t>(m.state_indices.size());
  c.nchunks = static_cast<int64_t>(m.seq_idx.size());
  SSM_CHECK(m.chunk_size >= 1, "ssd_chunk_scan_fwd: chunk_size {} < 1", m.chunk_size);
  SSM_CHECK(static_cast<int64_t>(m.query_start_loc.size()) == c.num_seqs + 1 &&
                static_cast<int64_t>(m.has_initial_states.size()) == c.num_seqs &&
                static_cast<int64_t>(m.last_chunk_indices.size()) == c.num_seqs &&
                static_cast<int64_t>(m.cu_chunk_seqlen.size()) == c.nchunks + 1,
            "ssd_chunk_scan_fwd: metadata sizes disagree (num_seqs {}, query_start_loc {}, has_initial_states {}, "
            "last_chunk_indices {}, nchunks {}, cu_chunk_seqlen {})",
            c.num_seqs, m.query_start_loc.size(), m.has_initial_states.size(), m.last_chunk_indices.size(),
            c.nchunks, m.cu_chunk_seqlen.size());
  SSM_CHECK(m.query_start_loc[0] == 0 && m.cu_chunk_seqlen[0] == 0 &&
                m.cu_chunk_seqlen[c.nchunks] == m.query_start_loc[c.num_seqs],
            "ssd_chunk_scan_fwd: query_start_loc / cu_chunk_seqlen must start at 0 and end at the same token count");
  c.num_tokens = m.query_start_loc[c.num_seqs];
  c.first_chunk.resize(static_cast<size_t>(c.num_seqs));
  int32_t next = 0;
  for (int64_t s = 0; s < c.num_seqs; ++s) {
    const int32_t last = m.last_chunk_indices[s];
    SSM_CHECK(last >= next && last < c.nchunks, "ssd_chunk_scan_fwd: last_chunk_indices[{}] = {} out of order", s,
              last);
    c.first_chunk[s] = next;
    SSM_CHECK(m.cu_chunk_seqlen[next] == m.query_start_loc[s] && m.cu_chunk_seqlen[last + 1] == m.query_start_loc[s + 1],
              "ssd_chunk_scan_fwd: chunks {}..{} do not cover sequence {}'s tokens", next, last, s);
    for (int32_t k = next; k <= last; ++k) {
      const int32_t len = m.cu_chunk_seqlen[k + 1] - m.cu_chunk_seqlen[k];
      SSM_CHECK(m.seq_idx[k] == s && len >= 1 && len <= m.chunk_size,
                "ssd_chunk_scan_fwd: chunk {} (seq_idx {}, {} tokens) is not a 1..{}-token chunk of sequence {}", k,
                m.seq_idx[k], len, m.chunk_size, s);
    }
    next = last + 1;
  }
  SSM_CHECK(next == c.nchunks, "ssd_chunk_scan_fwd: {} chunks but the sequences own {}", c.nchunks, next);
  return c;
}

template <class T>
void chunk_scan(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadata& m, const ChunkPlan& plan, float* y,
                int64_t y_stride, float* states) {
  const int H = p.num_heads, P = p.head_dim, G = p.n_groups, N = p.d_state, cs = m.chunk_size;
  const int heads_per_group = H / G;
  const int64_t PN = int64_t{P} * N, nchunks = plan.nchunks, num_tokens = plan.num_tokens;
  auto live = [&](int64_t c) { return m.state_indices[m.seq_idx[c]] != 0; };
  auto chunk_t0 = [&](int64_t c) { return int64_t{m.cu_chunk_seqlen[c]}; };
  auto chunk_t1 = [&](int64_t c) { return int64_t{m.cu_chunk_seqlen[c + 1]}; };

  // 1. Per chunk and head: processed dt and the within-chunk inclusive cumsum of dt * A. dtv, cum: [T, H].
  // Scratch lives per calling thread and is reused across calls (fresh large vectors cost page faults on
  // every layer); assign() zero-fills like a fresh vector.
  // (Bound to locals: inside the OpenMP team a thread_local name would denote each worker's own copy.)
  thread_local std::vector<float> tl_dtv, tl_cum, tl_cb;
  std::vector<float>& dtv = tl_dtv;
  std::vector<float>& cum = tl_cum;
  std::vector<float>& cb = tl_cb;
  dtv.assign(static_cast<size_t>(num_tokens * H), 0.0f);
  cum.assign(dtv.size(), 0.0f);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t c = 0; c < nchunks; ++c)
    for (int h = 0; h < H; ++h) {
      if (!live(c)) continue;
      float acc = 0.0f;
      for (int64_t t = chunk_t0(c); t < chunk_t1(c); ++t) {
        const float d = step_dt(in, p, t, h);
        acc += d * p.A[h];
        dtv[t * H + h] = d;
        cum[t * H + h] = acc;
      }
    }

  // 2. C_t · B_s for s <= t within t's chunk, per group: CB = C_chunk (L x N) · B_chunk^T (N x L) on the
  //    register-blocked kernel, in row blocks that stop at the diagonal. cb: [T, G, chunk_size] (row t, column
  //    s - t0; columns past t are scratch, never read).
  cb.assign(static_cast<size_t>(num_tokens * G * cs), 0.0f);
#pragma omp parallel
  {
    std::vector<float> bt(static_cast<size_t>(N) * cs);  // [N, L] B of the chunk, transposed
#pragma omp for collapse(2) schedule(static)
    for (int64_t c = 0; c < nchunks; ++c)
      for (int g = 0; g < G; ++g) {
        if (!live(c)) continue;
        const int64_t t0 = chunk_t0(c), L = chunk_t1(c) - t0;
        for (int64_t j = 0; j < L; ++j) {
          const float* Bs = in.B.row(t0 + j) + int64_t{g} * N;
          for (int n = 0; n < N; ++n) bt[n * L + j] = Bs[n];
        }
        constexpr int64_t kRowBlock = 48;
        for (int64_t r0 = 0; r0 < L; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, L - r0);
          small_gemm(rows, r0 + rows, N, in.C.row(t0 + r0) + int64_t{g} * N, in.C.stride, 1, bt.data(), L,
                     cb.data() + ((t0 + r0) * G + g) * cs, G * cs);
        }
      }
  }

  // 3. Each chunk's own end state from zero: sum_s exp(segsum(s, end]) dt_s x_s (outer) B_s, as the product
  //    S (P x N) = XW^T (P x L') · B (L' x N) with XW[t][i] = w_t x_t[i] over the tokens that have not decayed
  //    below kMinLogDecay. states: [nchunks, H, P, N].
#pragma omp parallel
  {
    std::vector<float> xw(static_cast<size_t>(cs) * P);  // [L', P]
#pragma omp for collapse(2) schedule(static)
    for (int64_t c = 0; c < nchunks; ++c)
      for (int h = 0; h < H; ++h) {
        if (!live(c)) continue;
        const int g = h / heads_per_group;
        float* S = states + (c * H + h) * PN;
        const int64_t t0 = chunk_t0(c), t1 = chunk_t1(c);
        float seg = 0.0f;  // sum of dt*A over (t, chunk end], summed from the end (stable, unlike cum_end - cum_t)
        int64_t tmin = t1;
        for (int64_t t = t1 - 1; t >= t0 && seg >= kMinLogDecay; --t) {  // seg only decreases
          const float w = std::exp(seg) * dtv[t * H + h];
          seg += dtv[t * H + h] * p.A[h];
          const float* xs = in.x.row(t) + int64_t{h} * P;
          float* row = xw.data() + (t - t0) * P;
          for (int i = 0; i < P; ++i) row[i] = w * xs[i];
          tmin = t;
        }
        small_gemm(P, N, t1 - tmin, xw.data() + (tmin - t0) * P, 1, P, in.B.row(tmin) + int64_t{g} * N, in.B.stride, S, N);
      }
  }

  // 4. Sequential state passing per sequence and head: S_c = exp(cum_end_c) * S_{c-1} + local_c, starting from
  //    the block's state (has_initial_states) or zeros. states[c] becomes the true state at the end of chunk c.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < plan.num_seqs; ++s)
    for (int h = 0; h < H; ++h) {
      const int32_t block = m.state_indices[s];
      if (block == 0) continue;
      const T* init = m.has_initial_states[s] ? p.ssm_states.block<T>(block) + h * PN : nullptr;
      for (int64_t c = plan.first_chunk[s]; c <= m.last_chunk_indices[s]; ++c) {
        float* S = states + (c * H + h) * PN;
        const float decay = decay_exp(cum[(chunk_t1(c) - 1) * H + h]);
        if (decay == 0.0f) continue;
        if (c > plan.first_chunk[s]) {
          const float* prev = states + ((c - 1) * H + h) * PN;
#pragma omp simd
          for (int64_t i = 0; i < PN; ++i) S[i] += decay * prev[i];
        } else if (init) {
          for (int64_t i = 0; i < PN; ++i) S[i] += decay * load_f32(init[i]);
        }
      }
    }

  // 5. Outputs per chunk and head: y_t = sum_{s<=t} (C_t·B_s) exp(segsum(s, t]) dt_s x_s   (diagonal block)
  //                                    + exp(cum_t) S_prev @ C_t + D x_t                       (inter-chunk, skip)
  //    Both sums are products on the register-blocked kernel: Y_diag (L x P) = W (L x L) · X (L x P) with the
  //    lower-triangular W[t][s] = CB[t][s] exp(segsum(s, t]) dt_s, and Y_off (L x P) = C (L x N) · S_prev^T.
#pragma omp parallel
  {
    std::vector<float> wmat(static_cast<size_t>(cs) * cs), seg(static_cast<size_t>(cs)), ydiag(static_cast<size_t>(cs) * P),
        yoff(static_cast<size_t>(cs) * P), prevT(static_cast<size_t>(PN)), dtc_h(static_cast<size_t>(cs));
#pragma omp for collapse(2) schedule(static)
    for (int64_t c = 0; c < nchunks; ++c)
      for (int h = 0; h < H; ++h) {
        if (!live(c)) continue;
        const int32_t s = m.seq_idx[c];
        const int g = h / heads_per_group;
        const int64_t t0 = chunk_t0(c), L = chunk_t1(c) - t0;
        for (int64_t j = 0; j < L; ++j) dtc_h[j] = dtv[(t0 + j) * H + h];  // dt of the chunk's tokens, head h
        // prevT: [N, P] the state before this chunk, transposed, or none (zeros).
        bool has_prev = false;
        if (c > plan.first_chunk[s]) {
          const float* prev = states + ((c - 1) * H + h) * PN;
          for (int i = 0; i < P; ++i)
            for (int n = 0; n < N; ++n) prevT[int64_t{n} * P + i] = prev[int64_t{i} * N + n];
          has_prev = true;
        } else if (m.has_initial_states[s]) {
          const T* init = p.ssm_states.block<T>(m.state_indices[s]) + h * PN;
          for (int i = 0; i < P; ++i)
            for (int n = 0; n < N; ++n) prevT[int64_t{n} * P + i] = load_f32(init[int64_t{i} * N + n]);
          has_prev = true;
        }
        // W rows. segsum(s, t] = sum of dt*A over (s, t] is carried row to row, vectorized across s:
        // seg_t[s] = seg_{t-1}[s] + a_t for s < t, seg_t[t] = 0. Every entry is a plain running sum of the
        // a's between s and t (no cum_t - cum_s cancellation, which loses ~ulp(|cum|) at large chunk_size * |A|),
        // so near-zero exponents (the terms that matter) stay exact to a few ulps. Decays below kMinLogDecay
        // are flushed to 0 (seg only decreases going back, so these are a prefix of the row).
        for (int64_t tt = 0; tt < L; ++tt) {
          const int64_t t = t0 + tt;
          const float a_t = dtv[t * H + h] * p.A[h];
          float* sg = seg.data();
#pragma omp simd
          for (int64_t j = 0; j < tt; ++j) sg[j] += a_t;
          sg[tt] = 0.0f;
          const float* cbrow = cb.data() + (t * G + g) * cs;
          const float* dtc = dtc_h.data();
          float* wrow = wmat.data() + tt * L;
#pragma omp simd
          for (int64_t j = 0; j <= tt; ++j) wrow[j] = sg[j] < kMinLogDecay ? 0.0f : cbrow[j] * dtc[j] * exp_ps(sg[j]);
          std::fill(wrow + tt + 1, wrow + L, 0.0f);
        }
        // Y_diag in row blocks that stop at the diagonal (W is zero past it).
        constexpr int64_t kRowBlock = 48;
        for (int64_t r0 = 0; r0 < L; r0 += kRowBlock) {
          const int64_t rows = std::min(kRowBlock, L - r0);
          small_gemm(rows, P, r0 + rows, wmat.data() + r0 * L, L, 1, in.x.row(t0) + int64_t{h} * P, in.x.stride,
                     ydiag.data() + r0 * P, P);
        }
        if (has_prev) small_gemm(L, P, N, in.C.row(t0) + int64_t{g} * N, in.C.stride, 1, prevT.data(), P, yoff.data(), P);
        const float Dh = p.D ? p.D[h] : 0.0f;
        for (int64_t tt = 0; tt < L; ++tt) {
          const int64_t t = t0 + tt;
          const float* xt = in.x.row(t) + int64_t{h} * P;
          float* yt = y + t * y_stride + int64_t{h} * P;
          const float* yd = ydiag.data() + tt * P;
          const float e = has_prev ? decay_exp(cum[t * H + h]) : 0.0f;
          if (e != 0.0f) {
            const float* yo = yoff.data() + tt * P;
            for (int i = 0; i < P; ++i) yt[i] = (yd[i] + e * yo[i]) + Dh * xt[i];
          } else {
            for (int i = 0; i < P; ++i) yt[i] = yd[i] + Dh * xt[i];
          }
        }
      }
  }

  // 6. Each sequence's final state (end of its last chunk) back into its block, in the pool's dtype.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < plan.num_seqs; ++s)
    for (int h = 0; h < H; ++h) {
      const int32_t block = m.state_indices[s];
      if (block == 0) continue;
      const float* S = states + (int64_t{m.last_chunk_indices[s]} * H + h) * PN;
      T* dst = p.ssm_states.block<T>(block) + h * PN;
      for (int64_t i = 0; i < PN; ++i) store_f32(dst[i], S[i]);
    }
}

constexpr int64_t kStatePrefetchBytes = 2048;

/// The decode update of token row b, head h (one token, one head's [P, N] state): reads the state of block `src`,
/// writes the new state into block `dst` (the same block: in place).
template <class T>
void state_update_head(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride, int64_t b, int h, int32_t src,
                       int32_t dst) {
  const int P = p.head_dim, N = p.d_state;
  const int heads_per_group = p.num_heads / p.n_groups;
  const int64_t PN = int64_t{P} * N;
  const int g = h / heads_per_group;
  const float dt = step_dt(in, p, b, h);
  const float dA = std::exp(dt * p.A[h]);
  const float* x = in.x.row(b) + int64_t{h} * P;
  const float* B = in.B.row(b) + int64_t{g} * N;
  const float* C = in.C.row(b) + int64_t{g} * N;
  const T* S = p.ssm_states.block<T>(src) + h * PN;
  T* Sd = p.ssm_states.block<T>(dst) + h * PN;
  float* yt = y + b * y_stride + int64_t{h} * P;
  const float Dh = p.D ? p.D[h] : 0.0f;
  for (int i = 0; i < P; ++i) {
    const T* Si = S + int64_t{i} * N;
    T* Sdi = Sd + int64_t{i} * N;
    // The state streams from memory once per token: prefetch ~2 KiB ahead (into the next head's state at the
    // end of this one; the heads of a block are contiguous). No effect on the arithmetic.
    const char* ahead = reinterpret_cast<const char*>(Si) + kStatePrefetchBytes;
    for (int64_t off = 0; off < int64_t{N} * static_cast<int64_t>(sizeof(T)); off += 64) __builtin_prefetch(ahead + off, 1, 3);
    const float dx = dt * x[i];
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int n = 0; n < N; ++n) {
      const float v = dA * load_f32(Si[n]) + dx * B[n];
      store_f32(Sdi[n], v);
      acc += v * C[n];
    }
    yt[i] = acc + Dh * x[i];
  }
}

/// Rows x heads [begin, end) of the flattened (b, h) index b * H + h; each (row, head) runs the row's tokens one
/// after another (DecodeRows).
template <class T>
void state_update_range(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride, const DecodeRows& rows,
                        int64_t begin, int64_t end) {
  const int H = p.num_heads;
  for (int64_t bh = begin; bh < end; ++bh) {
    const int64_t b = bh / H;
    const int h = static_cast<int>(bh % H);
    if (rows.is_null(b)) continue;
    for (int j = 0; j < rows.num_tokens(b); ++j)
      state_update_head<T>(in, p, y, y_stride, rows.token_row(b, j), h, rows.src_block(b, j), rows.dst_block(b, j));
  }
}

template <class T>
void state_update(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride, const DecodeRows& rows) {
  const int64_t total = rows.num_rows() * p.num_heads;
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    state_update_range<T>(in, p, y, y_stride, rows, total * t / nt, total * (t + 1) / nt);
  }
}

}  // namespace

void ssd_chunk_scan_fwd(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadata& meta, float* y,
                        int64_t y_stride, float* chunk_states) {
  check_sizes(p, "ssd_chunk_scan_fwd");
  const ChunkPlan plan = plan_chunks(meta);
  if (plan.num_tokens == 0) return;
  thread_local std::vector<float> tl_scratch;  // reused across calls, zero-filled like a fresh vector
  std::vector<float>& scratch = tl_scratch;
  float* states = chunk_states;
  if (!states) {
    scratch.assign(static_cast<size_t>(plan.nchunks * p.num_heads * p.head_dim * p.d_state), 0.0f);
    states = scratch.data();
  }
  visit_state_dtype(p.ssm_states.dtype, [&](auto tag) {
    chunk_scan<decltype(tag)>(in, p, meta, plan, y, y_stride, states);
  });
}

void ssd_state_update(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride, const DecodeRows& rows) {
  check_sizes(p, "ssd_state_update");
  visit_state_dtype(p.ssm_states.dtype, [&](auto tag) { state_update<decltype(tag)>(in, p, y, y_stride, rows); });
}

void ssd_check_params(const SsdParams& p) { check_sizes(p, "ssd_state_update_part"); }

void ssd_state_update_part(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                           const DecodeRows& rows, int part, int num_parts) {
  const int64_t total = rows.num_rows() * p.num_heads;
  visit_state_dtype(p.ssm_states.dtype, [&](auto tag) {
    state_update_range<decltype(tag)>(in, p, y, y_stride, rows, total * part / num_parts, total * (part + 1) / num_parts);
  });
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, ssd_chunk_scan_fwd, (const SsdInputs& in, const SsdParams& p, const SsdChunkMetadata& meta,
                 float* y, int64_t y_stride, float* chunk_states), (in, p, meta, y, y_stride, chunk_states))
SSM_CPU_DISPATCH(void, ssd_state_update, (const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                 const DecodeRows& rows), (in, p, y, y_stride, rows))
SSM_CPU_DISPATCH(void, ssd_check_params, (const SsdParams& p), (p))
SSM_CPU_DISPATCH(void, ssd_state_update_part, (const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                 const DecodeRows& rows, int part, int num_parts), (in, p, y, y_stride, rows, part, num_parts))
