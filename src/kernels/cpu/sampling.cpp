// Owns the host sampler's vectorized reductions (see sampling.h); moved from engine/sampler.cpp unchanged, so a
// native build computes what it did.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Vectorized kernels use GCC/Clang vector extensions: kW floats per step, widened to doubles for sums. The
// tail is padded, so every element goes through the same code and the results depend only on the values.
constexpr int kW = 8;
using vf = float __attribute__((vector_size(kW * sizeof(float))));
using vi = int32_t __attribute__((vector_size(kW * sizeof(int32_t))));
using vd = double __attribute__((vector_size(kW * sizeof(double))));

inline vf splat(float x) { return vf{} + x; }

inline vf load(const float* x, int i, int n, float pad) {
  vf v;
  if (i + kW <= n) {
    std::memcpy(&v, x + i, sizeof v);
  } else {
    for (int j = 0; j < kW; ++j) v[j] = i + j < n ? x[i + j] : pad;
  }
  return v;
}

inline void store(float* out, int i, int n, vf v) {
  if (i + kW <= n) {
    std::memcpy(out + i, &v, sizeof v);
  } else {
    for (int j = 0; i + j < n; ++j) out[i + j] = v[j];
  }
}

/// Sum of the lanes in a fixed order.
inline double hsum(const vd& a) {
  double s = 0.0;
  for (int j = 0; j < kW; ++j) s += a[j];
  return s;
}

/// exp(x) for x <= ~88, lane-wise (Cephes expf: Cody-Waite reduction plus a degree-6 polynomial, ~1-2 ulp).
/// exp(0) == 1 exactly; x < -87 (including -inf) gives exactly 0.
inline vf fast_exp(vf x) {
  const vf lo = splat(-87.0f), hi = splat(88.0f), magic = splat(12582912.0f);
  vf xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const vf n = (xc * 1.44269504088896341f + magic) - magic;  // round to nearest
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  const vf scale = (vf)bits;  // bit reinterpretation (GCC/Clang vector cast)
  return x < lo ? splat(0.0f) : p * scale;
}

}  // namespace

float lane_max(const float* x, int n, int* nan_count) {
  vf acc = splat(kNegInf);
  vi nans = vi{};
  for (int i = 0; i < n; i += kW) {
    const vf v = load(x, i, n, kNegInf);
    acc = v > acc ? v : acc;
    nans -= v != v;  // true lanes are -1
  }
  float m = kNegInf;
  int count = 0;
  for (int j = 0; j < kW; ++j) {
    m = acc[j] > m ? acc[j] : m;
    count += nans[j];
  }
  if (nan_count) *nan_count = count;
  return m;
}

double sum_exp(const float* x, int n, float m, float t, float* out) {
  vd acc = vd{};
  const vf mv = splat(m), tv = splat(t);
  for (int i = 0; i < n; i += kW) {
    const vf w = fast_exp((load(x, i, n, kNegInf) - mv) / tv);
    if (out) store(out, i, n, w);
    acc += __builtin_convertvector(w, vd);
  }
  return hsum(acc);
}

double sum_range(const float* w, int lo, int hi) {
  vd acc = vd{};
  for (int i = lo; i < hi; i += kW) acc += __builtin_convertvector(load(w, i, hi, 0.0f), vd);
  return hsum(acc);
}

double mass_at_or_above(const float* l, const float* w, int n, float t) {
  vd acc = vd{};
  const vf tv = splat(t), zero = splat(0.0f);
  for (int i = 0; i < n; i += kW) {
    const vf sel = load(l, i, n, kNegInf) >= tv ? load(w, i, n, 0.0f) : zero;
    acc += __builtin_convertvector(sel, vd);
  }
  return hsum(acc);
}

void zero_below(float* w, int n, float floor) {
  const vf f = splat(floor), zero = splat(0.0f);
  for (int i = 0; i < n; i += kW) {
    const vf v = load(w, i, n, 0.0f);
    store(w, i, n, v < f ? zero : v);
  }
}

void top_k_ids(const float* l, int n, int k, std::vector<int>& heap) {
  heap.clear();
  if (k <= 0) return;
  auto before = [l](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  for (int i = 0; i < n; i += kW) {
    if (static_cast<int>(heap.size()) == k) {
      const vi above = load(l, i, n, kNegInf) > splat(l[heap.front()]);
      int any = 0;
      for (int j = 0; j < kW; ++j) any |= above[j];
      if (!any) continue;
    }
    for (int e = std::min(n, i + kW), j = i; j < e; ++j) {
      if (static_cast<int>(heap.size()) < k) {
        heap.push_back(j);
        std::push_heap(heap.begin(), heap.end(), before);  // front() = worst kept
      } else if (l[j] > l[heap.front()]) {  // later ids never win ties
        std::pop_heap(heap.begin(), heap.end(), before);
        heap.back() = j;
        std::push_heap(heap.begin(), heap.end(), before);
      }
    }
  }
  std::sort(heap.begin(), heap.end(), before);
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(float, lane_max, (const float* x, int n, int* nan_count), (x, n, nan_count))
SSM_CPU_DISPATCH(double, sum_exp, (const float* x, int n, float m, float t, float* out), (x, n, m, t, out))
SSM_CPU_DISPATCH(double, sum_range, (const float* w, int lo, int hi), (w, lo, hi))
SSM_CPU_DISPATCH(double, mass_at_or_above, (const float* l, const float* w, int n, float t), (l, w, n, t))
SSM_CPU_DISPATCH(void, zero_below, (float* w, int n, float floor), (w, n, floor))
SSM_CPU_DISPATCH(void, top_k_ids, (const float* l, int n, int k, std::vector<int>& heap), (l, n, k, heap))
