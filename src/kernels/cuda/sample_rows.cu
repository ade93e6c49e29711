// Owns full device sampling (see sampling.h sample_rows): logit modifications, greedy / temperature / top-k / top-p /
// min-p with a host-drawn uniform, raw logprobs; engine/sampler.cpp is the reference, mirrored step by step.
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/top_logprobs.cuh"

#include <cfloat>
#include <climits>
#include <cstdint>
#include <cstdlib>

namespace ssmserve::cuda {
namespace {

constexpr int kT = 1024;         // threads per row
constexpr int kWarps = kT / 32;
constexpr int kCap = kDeviceSampleCapacity;
constexpr int kNumThr = 12;      // candidate thresholds m - d * T, d = 2^(j - 4), j = 0 .. 11 (1/16 ... 128)
constexpr int kNB = 2048;        // buckets of the large-candidate-set path (values in [t, m], linear in m - x)
constexpr size_t kSmemBytes =
    static_cast<size_t>(kCap) * (sizeof(uint64_t) + sizeof(double)) + static_cast<size_t>(kNB) * (sizeof(int) + sizeof(double));
constexpr uint64_t kNoKey = ~0ull;         // no crossing
constexpr uint64_t kTooMany = ~0ull - 1;   // a bucket exceeds the on-chip capacity

/// engine/sampler.cpp's fast_exp (Cephes expf) with the same operations in the same order, each rounded
/// separately (no contraction), so device and host weights agree bit for bit with a non-contracting host build.
__device__ __forceinline__ float fast_exp(float x) {
  const float lo = -87.0f, hi = 88.0f, magic = 12582912.0f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, 1.44269504088896341f), magic), magic);
  float r = __fsub_rn(xc, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  const float scale = __int_as_float((static_cast<int>(n) + 127) << 23);
  return x < lo ? 0.0f : __fmul_rn(p, scale);
}

/// Sampling weight of processed logit x: fast_exp((x - m) / T) as the CPU's sum_exp.
__device__ __forceinline__ float weight(float x, float m, float T) { return fast_exp(__fdiv_rn(__fsub_rn(x, m), T)); }

/// engine/sampler.cpp's desc_key: ascending order = (x desc, id asc); -0 == +0.
__device__ __forceinline__ uint64_t desc_key(float x, int id) {
  uint32_t b = __float_as_uint(__fadd_rn(x, 0.0f));
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(~b) << 32) | static_cast<uint32_t>(id);
}
__device__ __forceinline__ float key_value(uint64_t k) {
  const uint32_t b = ~static_cast<uint32_t>(k >> 32);
  return __uint_as_float((b & 0x80000000u) ? (b & 0x7fffffffu) : ~b);
}
__device__ __forceinline__ int key_id(uint64_t k) { return static_cast<int>(static_cast<uint32_t>(k)); }

using detail::logit_before;

/// Block-wide shared scratch of the reductions.
struct Red {
  float v[kWarps];
  int i[kWarps];
  double d[kWarps];
  int count[kWarps][kNumThr];
  double mass[kWarps][kNumThr];
  int result;
  int counter;
  unsigned long long key;
};

/// Best (value desc, id asc) over the block; every thread gets it.
__device__ void block_best(float& v, int& id, Red& s) { detail::block_best<kT>(v, id, s.v, s.i); }

/// Sum over the block in a fixed order; every thread gets it.
__device__ double block_sum(double x, Red& s) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) s.d[warp] = x;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < kWarps; ++w) t += s.d[w];
  return t;
}

/// vLLM's rank of a raw logit x in its row: 1 + the number of raw[0, V) strictly greater (ties share a rank). Every
/// thread of the block calls it and gets the rank.
__device__ int32_t raw_rank(const float* raw, int V, float x, Red& s) {
  int above = 0;
  for (int i = threadIdx.x; i < V; i += kT) above += raw[i] > x ? 1 : 0;
  return 1 + static_cast<int32_t>(block_sum(static_cast<double>(above), s));  // exact: integers < 2^53
}

/// Exclusive prefix of x over thread order; *total gets the sum. Every thread gets its own prefix.
__device__ double block_exclusive_scan(double x, double* total, Red& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double incl = x;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();
  if (lane == 31) s.d[warp] = incl;
  __syncthreads();
  double before_warp = 0.0, t = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) before_warp = t;
    t += s.d[w];
  }
  *total = t;
  return before_warp + incl - x;
}

/// Minimum (or, with take_max, maximum) of per-thread candidates; INT_MAX / INT_MIN when none. Every thread gets it.
__device__ int block_min(int x, Red& s, bool take_max = false) {
  __syncthreads();
  if (threadIdx.x == 0) s.result = take_max ? INT_MIN : INT_MAX;
  __syncthreads();
  if (take_max ? x != INT_MIN : x != INT_MAX) take_max ? atomicMax(&s.result, x) : atomicMin(&s.result, x);
  __syncthreads();
  return s.result;
}

/// Minimum (take_max: maximum) 64-bit key over the block; kNoKey (take_max: 0) when none. Every thread gets it.
__device__ uint64_t block_min_key(uint64_t x, bool valid, Red& s, bool take_max = false) {
  __syncthreads();
  if (threadIdx.x == 0) s.key = take_max ? 0ull : kNoKey;
  __syncthreads();
  if (valid) take_max ? atomicMax(&s.key, static_cast<unsigned long long>(x)) : atomicMin(&s.key, static_cast<unsigned long long>(x));
  __syncthreads();
  return s.key;
}

/// Collects desc_key(l[i], i) of every i with pred(l[i], i) into keys (at most kCap of them, the caller's guarantee)
/// and sorts them ascending (bitonic, padded to a power of two with ~0). Returns their count.
template <class Pred>
__device__ int gather_sort(const float* l, int V, Pred pred, uint64_t* keys, Red& s) {
  __syncthreads();
  if (threadIdx.x == 0) s.counter = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += kT) {
    const float x = l[i];
    if (pred(x, i)) keys[atomicAdd(&s.counter, 1)] = desc_key(x, i);
  }
  __syncthreads();
  const int count = s.counter;
  int P2 = 1;
  while (P2 < count) P2 <<= 1;
  for (int i = count + threadIdx.x; i < P2; i += kT) keys[i] = ~0ull;
  __syncthreads();
  for (int kk = 2; kk <= P2; kk <<= 1) {
    for (int j = kk >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < P2; i += kT) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = keys[i], b = keys[ixj];
          if ((a > b) == ((i & kk) == 0)) keys[i] = b, keys[ixj] = a;
        }
      }
      __syncthreads();
    }
  }
  return count;
}

/// The draw over the whole vocabulary in id order (no top-k / top-p): min-p drops w < float(min_p) (w_max = 1),
/// then the first id whose cumulative weight exceeds u * total.
__device__ int pick_id_order(const float* l, int V, float m, float T, const SampleRowParams& P, Red& s) {
  const bool use_min_p = P.min_p > 0.0;
  const float floor_p = static_cast<float>(P.min_p);
  auto wt = [&](int i) {
    const float w = weight(l[i], m, T);
    return use_min_p && w < floor_p ? 0.0f : w;
  };
  const int per = (V + kT - 1) / kT;
  const int lo = min(V, static_cast<int>(threadIdx.x) * per), hi = min(V, lo + per);
  double part = 0.0;
  int last_pos = INT_MIN;
  for (int i = lo; i < hi; ++i) {
    const float w = wt(i);
    part += w;
    if (w > 0.0f) last_pos = i;
  }
  double total = 0.0;
  const double excl = block_exclusive_scan(part, &total, s);
  const double target = P.uniform * total;
  const int owner = block_min(excl + part > target && part > 0.0 ? static_cast<int>(threadIdx.x) : INT_MAX, s);
  if (owner == INT_MAX) {  // rounding at the very end: the last positive weight
    const int last = block_min(last_pos, s, true);
    return last == INT_MIN ? -1 : last;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) == owner) {
    double cum = excl;
    int pick = last_pos;
    for (int i = lo; i < hi; ++i) {
      const float w = wt(i);
      if (w <= 0.0f) continue;
      cum += w;
      if (cum > target) {
        pick = i;
        break;
      }
    }
    s.result = pick;
  }
  __syncthreads();
  return s.result;
}

/// Large candidate sets (more than kCap values in [t, m]): the (logit desc, id asc) order is cut into kNB buckets
/// linear in m - x (bucket order = key order, ties share a bucket). A histogram of counts and masses (fixed point,
/// only to locate buckets) finds the bucket holding each boundary (top-k, top-p, the draw); only that bucket is
/// gathered and sorted on chip, its base mass recomputed exactly in double. Same semantics as pick_sorted; kept
/// sets are key ranges [0, ub). Returns kPickOnHost when a needed bucket holds more than kCap values.
__device__ int pick_bucketed(const float* l, int V, float m, int mi, float T, float t, double total,
                             const SampleRowParams& P, Red& s, uint64_t* keys, double* cum, int* hcnt, double* hmass) {
  const int k = P.top_k;
  const bool use_k = k < V;
  if (!(__fsub_rn(m, t) > 0.0f)) return kPickOnHost;  // no resolution left between t and m
  const float scale = __fdiv_rn(static_cast<float>(kNB), __fsub_rn(m, t));
  auto bucket = [&](float x) { return min(static_cast<int>(__fmul_rn(__fsub_rn(m, x), scale)), kNB - 1); };
  auto* hfix = reinterpret_cast<unsigned long long*>(hmass);
  const int shift = 62 - (32 - __clz(V));  // V * 2^shift < 2^62: the fixed-point masses cannot overflow
  const double fx_scale = ldexp(1.0, shift);
  // 1. Histogram of the candidates x >= t.
  for (int b = threadIdx.x; b < kNB; b += kT) hcnt[b] = 0, hfix[b] = 0ull;
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += kT) {
    const float x = l[i];
    if (x >= t) {
      const int b = bucket(x);
      atomicAdd(&hcnt[b], 1);
      atomicAdd(&hfix[b], __double2ull_rn(static_cast<double>(weight(x, m, T)) * fx_scale));
    }
  }
  __syncthreads();
  // 2. Inclusive prefixes over the buckets (in place; masses converted to double).
  {
    constexpr int per = kNB / kT;
    const int b0 = threadIdx.x * per;
    double pc = 0.0, pm = 0.0, vc[per], vm[per];
    for (int q = 0; q < per; ++q) vc[q] = hcnt[b0 + q], vm[q] = static_cast<double>(hfix[b0 + q]) / fx_scale, pc += vc[q], pm += vm[q];
    double tc = 0.0, tm = 0.0;
    double ec = block_exclusive_scan(pc, &tc, s);
    double em = block_exclusive_scan(pm, &tm, s);
    __syncthreads();
    for (int q = 0; q < per; ++q) hcnt[b0 + q] = static_cast<int>(ec += vc[q]), hmass[b0 + q] = (em += vm[q]);
    __syncthreads();
  }
  // The key at which the cumulative count (by_mass: mass) over the key order first reaches target (count, and
  // mass when !strict: >=; mass when strict: >). kNoKey: no crossing; kTooMany: its bucket exceeds kCap.
  auto locate = [&](bool by_mass, double target, bool strict) -> uint64_t {
    int first = INT_MAX;
    for (int b = threadIdx.x; b < kNB; b += kT) {
      const double v = by_mass ? hmass[b] : static_cast<double>(hcnt[b]);
      if (strict ? v > target : v >= target) first = min(first, b);
    }
    const int b = block_min(first, s);
    if (b == INT_MAX) return kNoKey;
    if (hcnt[b] - (b > 0 ? hcnt[b - 1] : 0) > kCap) return kTooMany;
    double base = b > 0 ? static_cast<double>(hcnt[b - 1]) : 0.0;
    if (by_mass) {  // exact base: the mass of the buckets before b
      double part = 0.0;
      for (int i = threadIdx.x; i < V; i += kT) {
        const float x = l[i];
        if (x >= t && bucket(x) < b) part += weight(x, m, T);
      }
      base = block_sum(part, s);
    }
    const int cnt = gather_sort(l, V, [&](float x, int) { return x >= t && bucket(x) == b; }, keys, s);
    const int per = (cnt + kT - 1) / kT;
    const int lo = min(cnt, static_cast<int>(threadIdx.x) * per), hi = min(cnt, lo + per);
    double part = 0.0;
    for (int j = lo; j < hi; ++j) part += by_mass ? static_cast<double>(weight(key_value(keys[j]), m, T)) : 1.0;
    double tot = 0.0;
    double c = base + block_exclusive_scan(part, &tot, s);
    for (int j = lo; j < hi; ++j) cum[j] = (c += by_mass ? static_cast<double>(weight(key_value(keys[j]), m, T)) : 1.0);
    __syncthreads();
    int j0 = INT_MAX;
    for (int j = threadIdx.x; j < cnt; j += kT)
      if (strict ? cum[j] > target : cum[j] >= target) j0 = min(j0, j);
    j0 = block_min(j0, s);
    return keys[j0 == INT_MAX ? cnt - 1 : j0];  // none: rounding at the bucket's end
  };
  // Mass of the candidates with key < ub (double, exact up to summation order).
  auto mass_below = [&](uint64_t ub) {
    double part = 0.0;
    for (int i = threadIdx.x; i < V; i += kT) {
      const float x = l[i];
      if (x >= t && desc_key(x, i) < ub) part += weight(x, m, T);
    }
    return block_sum(part, s);
  };
  uint64_t ub = kNoKey;  // kept: keys < ub
  if (use_k) {
    const uint64_t kth = locate(false, static_cast<double>(k), false);
    if (kth == kTooMany || kth == kNoKey) return kPickOnHost;
    ub = kth + 1;
  }
  if (P.top_p < 1.0) {
    const double need = use_k ? P.top_p * mass_below(ub) : P.top_p * total;
    const uint64_t c = locate(true, need, false);
    if (c == kTooMany) return kPickOnHost;
    if (c != kNoKey && c + 1 < ub) ub = c + 1;
  }
  if (P.min_p > 0.0) {
    const double floor_p = P.min_p * static_cast<double>(weight(m, m, T));
    const uint64_t kmax = desc_key(m, mi);
    uint64_t d = kNoKey;
    for (int i = threadIdx.x; i < V; i += kT) {
      const float x = l[i];
      if (!(x >= t)) continue;
      const uint64_t key = desc_key(x, i);
      if (key > kmax && key < ub && static_cast<double>(weight(x, m, T)) < floor_p && key < d) d = key;
    }
    d = block_min_key(d, d != kNoKey, s);
    if (d != kNoKey) ub = d;
  }
  const double target = P.uniform * mass_below(ub);
  uint64_t c = locate(true, target, true);
  if (c == kTooMany) return kPickOnHost;
  if (c == kNoKey || c >= ub) {  // rounding at the very end: the last positive weight below ub
    uint64_t last = 0;
    bool any = false;
    for (int i = threadIdx.x; i < V; i += kT) {
      const float x = l[i];
      if (!(x >= t)) continue;
      const uint64_t key = desc_key(x, i);
      if (key < ub && weight(x, m, T) > 0.0f && (!any || key > last)) last = key, any = true;
    }
    c = block_min_key(last, any, s, true);
    if (c == 0 && !__syncthreads_or(any)) return -1;
  }
  return key_id(c);
}

/// Top-k / top-p / min-p over the (logit desc, id asc) order, on at most kCap candidates {l >= m - d T} sorted on
/// chip; larger candidate sets go to pick_bucketed (when `buckets`), else to the host (kPickOnHost).
__device__ int pick_sorted(const float* l, int V, float m, int mi, float T, double total, const SampleRowParams& P,
                           Red& s, uint64_t* keys, double* cum, int* hcnt, double* hmass, bool buckets) {
  const int k = P.top_k;
  const bool use_k = k < V;
  const double need_p = P.top_p * total;  // top-p alone: the nucleus mass over the whole vocabulary
  // 1. Counts and masses above each threshold; the smallest set that holds the answer.
  float thr[kNumThr];
  for (int j = 0; j < kNumThr; ++j) thr[j] = __fsub_rn(m, __fmul_rn(ldexpf(1.0f, j - 4), T));
  int cnt[kNumThr];
  double mass[kNumThr];
  for (int j = 0; j < kNumThr; ++j) cnt[j] = 0, mass[j] = 0.0;
  for (int i = threadIdx.x; i < V; i += kT) {
    const float x = l[i];
    if (!(x >= thr[kNumThr - 1])) continue;
    const float w = use_k ? 0.0f : weight(x, m, T);
#pragma unroll
    for (int j = 0; j < kNumThr; ++j)
      if (x >= thr[j]) ++cnt[j], mass[j] += w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kNumThr; ++j) {
    for (int o = 16; o > 0; o >>= 1) {
      cnt[j] += __shfl_xor_sync(0xffffffffu, cnt[j], o);
      mass[j] += __shfl_xor_sync(0xffffffffu, mass[j], o);
    }
  }
  __syncthreads();
  if (lane == 0)
    for (int j = 0; j < kNumThr; ++j) s.count[warp][j] = cnt[j], s.mass[warp][j] = mass[j];
  __syncthreads();
  int jreq = -1, creq = 0;
  for (int j = 0; j < kNumThr && jreq < 0; ++j) {
    int c = 0;
    double ms = 0.0;
    for (int w = 0; w < kWarps; ++w) c += s.count[w][j], ms += s.mass[w][j];
    if (use_k ? c >= k : ms >= need_p) jreq = j, creq = c;
  }
  bool all = false;
  float t_sel = 0.0f;
  if (jreq >= 0 && creq <= kCap) {
    t_sel = thr[jreq];
  } else if (V <= kCap) {
    all = true;
  } else if (jreq >= 0 && buckets) {
    return pick_bucketed(l, V, m, mi, T, thr[jreq], total, P, s, keys, cum, hcnt, hmass);
  } else {
    return kPickOnHost;
  }
  // 2. Collect and sort the candidates (keys ascending = logit desc, id asc).
  const int count = gather_sort(l, V, [&](float x, int) { return all || x >= t_sel; }, keys, s);
  // 3. Inclusive prefix masses of the first K0 candidates (top-k: k; top-p alone: all of them).
  const int K0 = use_k ? k : count;
  auto cw = [&](int j) { return weight(key_value(keys[j]), m, T); };
  const int per = (K0 + kT - 1) / kT;
  const int lo = min(K0, static_cast<int>(threadIdx.x) * per), hi = min(K0, lo + per);
  double part = 0.0;
  for (int j = lo; j < hi; ++j) part += cw(j);
  double tot0 = 0.0;
  double c = block_exclusive_scan(part, &tot0, s);
  for (int j = lo; j < hi; ++j) cum[j] = (c += cw(j));
  __syncthreads();
  // 4. top-p: the smallest prefix with mass >= top_p * (top-k mass, or the full mass).
  int K1 = K0;
  if (P.top_p < 1.0) {
    const double need = use_k ? P.top_p * cum[K0 - 1] : need_p;
    int first = INT_MAX;
    for (int j = threadIdx.x; j < K0; j += kT)
      if (cum[j] >= need) first = min(first, j);
    first = block_min(first, s);
    if (first != INT_MAX) K1 = first + 1;
  }
  // 5. min-p: stop at the first candidate below min_p * w_max.
  int K2 = K1;
  if (P.min_p > 0.0) {
    const double floor_p = P.min_p * static_cast<double>(cw(0));
    int first = INT_MAX;
    for (int j = 1 + threadIdx.x; j < K1; j += kT)
      if (static_cast<double>(cw(j)) < floor_p) first = min(first, j);
    first = block_min(first, s);
    if (first != INT_MAX) K2 = first;
  }
  // 6. The draw: the first candidate whose cumulative mass exceeds u * (mass of the kept prefix).
  const double target = P.uniform * cum[K2 - 1];
  int first = INT_MAX, last = INT_MIN;
  for (int j = threadIdx.x; j < K2; j += kT) {
    if (cum[j] > target) first = min(first, j);
    if (cw(j) > 0.0f) last = max(last, j);
  }
  first = block_min(first, s);
  if (first == INT_MAX) first = block_min(last, s, true);
  if (first == INT_MIN) return -1;
  return key_id(keys[first]);
}

__global__ void __launch_bounds__(kT) sample_rows_kernel(const float* __restrict__ logits, int64_t ld, int V,
                                                         const SampleRowParams* __restrict__ rows,
                                                         const LogitMod* __restrict__ mods, float* __restrict__ work,
                                                         GreedyRow* __restrict__ out, bool buckets) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Red s;
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem);
  double* cum = reinterpret_cast<double*>(smem + static_cast<size_t>(kCap) * sizeof(uint64_t));
  double* hmass = reinterpret_cast<double*>(smem + static_cast<size_t>(kCap) * (sizeof(uint64_t) + sizeof(double)));
  int* hcnt = reinterpret_cast<int*>(hmass + kNB);
  const int row = blockIdx.x;
  const SampleRowParams P = rows[row];
  const float* raw = logits + static_cast<int64_t>(row) * ld;
  GreedyRow& r = out[row];
  // 1. Raw row: validity, max, log-sum-exp (float exp, double sum) and the top logprobs.
  float bv = -INFINITY;
  int bi = INT_MAX;
  bool bad = false;
  for (int i = threadIdx.x; i < V; i += kT) {
    const float x = raw[i];
    if (isnan(x) || x == INFINITY) bad = true;
    else if (logit_before(x, i, bv, bi)) bv = x, bi = i;
  }
  bad = __syncthreads_or(bad);
  block_best(bv, bi, s);
  if (bad || bv == -INFINITY) {
    if (threadIdx.x == 0) r.token = -1, r.logprob = NAN;
    return;
  }
  double acc = 0.0;
  for (int i = threadIdx.x; i < V; i += kT) acc += static_cast<double>(fast_exp(__fsub_rn(raw[i], bv)));
  const double lse = static_cast<double>(bv) + log(block_sum(acc, s));
  const int num_top = min(max(P.num_top, 0), min(V, kMaxDeviceTopLogprobs));
  detail::top_logprobs<kT>(raw, V, bv, bi, lse, num_top, s.v, s.i, r);
  if (P.score_token >= 0 && P.score_token < V) {  // prompt scoring: the next prompt token's logprob and rank
    const float t = raw[P.score_token];
    const int32_t rank = raw_rank(raw, V, t, s);
    if (threadIdx.x == 0) {
      r.score_logprob = static_cast<float>(static_cast<double>(t) - lse);
      r.score_rank = rank;
    }
  }
  // 2. Processed row: logit_bias, min_tokens masks and penalties applied to a copy (sample_token steps 0-2).
  const float* l = raw;
  float m = bv;
  int mi = bi;
  if (P.mods_count > 0 && work != nullptr) {
    float* w = work + static_cast<int64_t>(row) * V;
    for (int i = threadIdx.x; i < V; i += kT) w[i] = raw[i];
    __syncthreads();
    const float rp = P.repetition_penalty, fp = P.frequency_penalty, pp = P.presence_penalty;
    for (int j = threadIdx.x; j < P.mods_count; j += kT) {
      const LogitMod md = mods[P.mods_begin + j];
      if (md.id < 0 || md.id >= V) continue;
      float x = w[md.id];
      if (md.flags & kLogitModBias) x = __fadd_rn(x, md.bias);
      if (md.flags & kLogitModMask) x = -INFINITY;
      if (md.flags & kLogitModSeen) {  // finite stays finite, -inf stays -inf (apply_logit_mods' clamp)
        if (x > 0.0f) x = fminf(__fdiv_rn(x, rp), FLT_MAX);
        else if (x != -INFINITY) x = fmaxf(__fmul_rn(x, rp), -FLT_MAX);
      }
      if (md.count > 0) {
        x = __fsub_rn(x, __fmul_rn(fp, static_cast<float>(md.count)));
        x = __fsub_rn(x, pp);
      }
      w[md.id] = x;
    }
    __syncthreads();
    l = w;
    m = -INFINITY, mi = INT_MAX;
    for (int i = threadIdx.x; i < V; i += kT) {
      const float x = l[i];
      if (logit_before(x, i, m, mi)) m = x, mi = i;
    }
    block_best(m, mi, s);
  }
  if (m == -INFINITY || isnan(m) || m == INFINITY) {
    if (threadIdx.x == 0) r.token = -1, r.logprob = NAN;
    return;
  }
  // 3. The pick.
  int token = mi;
  if (P.temperature > 0.0f) {
    const float T = P.temperature;
    if (P.top_k >= V && !(P.top_p < 1.0)) {
      token = pick_id_order(l, V, m, T, P, s);
    } else {
      double part = 0.0;
      for (int i = threadIdx.x; i < V; i += kT) part += static_cast<double>(weight(l[i], m, T));
      const double total = block_sum(part, s);
      token = pick_sorted(l, V, m, mi, T, total, P, s, keys, cum, hcnt, hmass, buckets);
    }
  }
  // 4. The picked token's raw rank (vLLM's Logprob.rank), for rows with logprobs. `token` is the block's (every
  //    pick returns one value to all threads).
  const int32_t rank = P.rank_sampled && token >= 0 ? raw_rank(raw, V, raw[token], s) : 0;
  if (threadIdx.x == 0) {
    r.token = token;
    r.logprob = token >= 0 ? static_cast<float>(static_cast<double>(raw[token]) - lse) : NAN;
    r.sampled_rank = rank;
  }
}

}  // namespace

cudaError_t sample_rows(const float* logits, int64_t ld, int n, int64_t V, const SampleRowParams* rows,
                        const LogitMod* mods, float* work, GreedyRow* out, cudaStream_t stream) {
  if (n < 0 || V < 1 || V > INT_MAX || ld < V || (n > 0 && (!logits || !rows || !out))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  static std::atomic<uint64_t> opted_in{0};  // per device (tensor-parallel ranks sample on every GPU)
  if (const cudaError_t e = detail::opt_in_dynamic_smem(sample_rows_kernel, kSmemBytes, opted_in); e != cudaSuccess)
    return e;
  const bool buckets = kernel_tuning().sample_buckets;  // off: large candidate sets go to the host sampler
  sample_rows_kernel<<<dim3(static_cast<unsigned>(n)), dim3(kT), kSmemBytes, stream>>>(logits, ld, static_cast<int>(V),
                                                                                     rows, mods, work, out, buckets);
  return cudaGetLastError();
}

}  // namespace ssmserve::cuda
