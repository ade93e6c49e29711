// Owns the GPU benchmark of the memory-bound row kernels of a long prefill (issues 30, 31): each kernel's old form
// (KernelTuning::prefill_row_kernels off, SSMSERVE_PREFILL_ROW_KERNELS=0) against its prefill form at one step of
// T tokens (default 32768) at configs/qwen3.5-35b-a3b's shapes: hidden 2048, 256 experts top-8 (P = 8 T pairs); Gated
// DeltaNet 16 key / 32 value heads of 128 (conv channels 8192 of in-projection rows 12352 wide, width 4); attention
// output gate over 16 heads of 256. Prints us per call (median of 7 runs of 10 calls) and GB/s over the bytes each
// kernel must move (napkin model in each line's comment; the H200's copy roofline is about 4.3 TB/s), and the
// speedup. Usage: bench_cuda_prefill_rows [T]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_event_timing.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "kernels/cuda/moe_parts.h"
#include "kernels/cuda/rms_norm.h"

using namespace ssmserve;
using cuda::DeviceBuffer;

namespace {

cudaStream_t g_stream = nullptr;  ///< every launch's stream (created in main: PDL launches on a stream of their own)

/// Time (us) of one call: the median of 7 runs of 10 calls made by f (after 3 untimed runs).
template <class F>
double us_per_call(F&& f) {
  return 100.0 * bench::median_ms([&] { for (int j = 0; j < 10; ++j) f(); }, g_stream, 3, 7);  // ms / 10 calls -> us
}

void set_rows(bool on) {
  cuda::KernelTuning t = cuda::kernel_tuning();
  t.prefill_row_kernels = on;
  cuda::set_kernel_tuning(t);
}

/// Prints the old and new form's times of f (which launches one call) over `bytes` moved per call.
template <class F>
void row(const char* name, double bytes, F&& f) {
  set_rows(false);
  const double old_us = us_per_call(f);
  set_rows(true);
  const double new_us = us_per_call(f);
  std::printf("%-34s old %9.1f us %7.0f GB/s | new %9.1f us %7.0f GB/s | %5.2fx\n", name, old_us,
              bytes / old_us / 1e3, new_us, bytes / new_us / 1e3, old_us / new_us);
}

/// A device buffer of n floats, uniform in [lo, hi) (xorshift on the host).
DeviceBuffer rand_dev(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
  for (auto& f : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    f = lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
  }
  return cuda::to_device(v);
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::gpu_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 32768;
  SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  const int E = 256, k = 8;
  const int64_t H = 2048, P = T * k;
  std::printf("prefill row kernels at T = %lld (Qwen3.5-35B-A3B shapes), old form vs prefill form\n",
              static_cast<long long>(T));

  // MoE: routing ids (distinct experts per token), then the real sort's rows.
  std::mt19937 rng(1);
  std::vector<int32_t> ids(P);
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) std::swap(perm[j], perm[j + rng() % (E - j)]);
    for (int j = 0; j < k; ++j) ids[t * k + j] = perm[j];
  }
  DeviceBuffer dids = cuda::to_device(ids), wts = rand_dev(P, 0.0f, 0.3f, 2);
  DeviceBuffer offsets((E + 1) * 4), sorted(P * 4), pair_row(P * 4);
  DeviceBuffer counts(std::max<size_t>(cuda::detail::moe_sort_counts_bytes(P, E), 4));
  auto sort = [&] {
    SSM_CUDA_CHECK(cuda::detail::moe_sort_pairs(dids.as<int32_t>(), P, E, offsets.as<int32_t>(), sorted.as<int32_t>(),
                                                pair_row.as<int32_t>(), counts.as<int32_t>(), g_stream, true));
  };
  // ids read twice, sorted + pair_row written (the rows' order differs between forms: the kernels below use
  // the last sort's, the same for both of their forms).
  row("moe sort (P pairs)", 16.0 * P, sort);
  DeviceBuffer x = rand_dev(T * H, -2.0f, 2.0f, 3), y = rand_dev(P * H, -2.0f, 2.0f, 4);
  DeviceBuffer sy = rand_dev(T * H, -1.0f, 1.0f, 5), gate = rand_dev(H, -0.1f, 0.1f, 6), out(T * H * 4);
  DeviceBuffer xg(P * H * 2);
  // x read once (the old form reads it k times in expert order, mostly from L2), xg written.
  row("moe gather (x -> xg bf16)", 4.0 * T * H + 2.0 * P * H, [&] {
    SSM_CUDA_CHECK(cuda::detail::moe_gather_rows(x.as<float>(), H, sorted.as<int32_t>(), pair_row.as<int32_t>(), T, k, H,
                                                 xg.as<__nv_bfloat16>(), g_stream));
  });
  auto combine = [&](const cuda::MoeSharedAdd* add) {
    SSM_CUDA_CHECK(cuda::detail::moe_combine(y.as<float>(), H, dids.as<int32_t>(), wts.as<float>(),
                                             pair_row.as<int32_t>(), T, k, out.as<float>(), H, add, g_stream, true));
  };
  // y [P, H] read, out written.
  row("moe combine", 4.0 * P * H + 4.0 * T * H, [&] { combine(nullptr); });
  cuda::MoeSharedAdd add;
  add.y = sy.as<float>(), add.y_stride = H, add.gate = gate.as<float>(), add.x = x.as<float>(), add.x_stride = H;
  // The runner's step: old: the combine, then sigmoid_gated_add (x, sy, out read, out written); new: the combine
  // with the gated add fused (moe_combine_per_token). Bytes: the fused form's (y, x, sy read, out written).
  row("moe combine + gated shared add", 4.0 * P * H + 12.0 * T * H, [&] {
    if (cuda::moe_combine_per_token(T)) {
      combine(&add);
    } else {
      combine(nullptr);
      SSM_CUDA_CHECK(cuda::sigmoid_gated_add(out.as<float>(), H, sy.as<float>(), H, x.as<float>(), H, gate.as<float>(), T,
                                             H, g_stream, true));
    }
  });
  x = DeviceBuffer(), y = DeviceBuffer(), xg = DeviceBuffer(), sy = DeviceBuffer();

  // Gated DeltaNet: o [T, 4096] fp32, z a slice of the in-projection rows [T, 12352], bf16 out.
  const int64_t Vd = 4096, PW = 12352, C = 8192;
  DeviceBuffer o = rand_dev(T * Vd, -2.0f, 2.0f, 7), proj = rand_dev(T * PW, -2.0f, 2.0f, 8);
  DeviceBuffer nw = rand_dev(Vd, 0.5f, 1.5f, 9), gated(T * Vd * 2);
  row("gated rms norm (bf16 out)", 8.0 * T * Vd + 2.0 * T * Vd, [&] {
    SSM_CUDA_CHECK(cuda::gated_rms_norm_pdl(o.as<float>(), Vd, proj.as<float>() + C, PW, nw.as<float>(), 1e-6f, T, Vd,
                                            128, true, gated.data(), DType::BF16, Vd, true, g_stream));
  });
  // Causal conv1d: 8192 channels of the projection rows, width 4, one sequence, fp32 out (the mixer's call).
  DeviceBuffer cw = rand_dev(C * 4, -0.5f, 0.5f, 10), states(2 * 3 * C * 4), qkv(T * C * 4);
  const std::vector<int32_t> qsl = {0, static_cast<int32_t>(T)}, sidx = {1};
  const std::vector<uint8_t> init = {1};
  DeviceBuffer dq = cuda::to_device(qsl), ds = cuda::to_device(sidx), di = cuda::to_device(init);
  states.fill_bytes(0);
  cuda::ConvParams cp;
  cp.dim = C, cp.width = 4, cp.weight = cw.as<float>(), cp.conv_states = StateView{states.data(), DType::F32, 3 * C};
  row("causal conv1d fwd (fp32 out)", 8.0 * T * C, [&] {
    SSM_CUDA_CHECK(cuda::causal_conv1d_fwd(proj.as<float>(), PW, qkv.as<float>(), C, cp, dq.as<int32_t>(), ds.as<int32_t>(),
                                           di.as<uint8_t>(), 1, T, g_stream));
  });
  // The shared expert's input cast [T, 2048] fp32 -> bf16; the attention output gate over [T, 4096] (bf16 out).
  row("cast_rows (bf16 out)", 6.0 * T * H, [&] {
    SSM_CUDA_CHECK(cuda::cast_rows(o.as<float>(), H, T, H, gated.data(), DType::BF16, H, g_stream, true));
  });
  row("sigmoid_gate (bf16 out)", 10.0 * T * Vd, [&] {
    SSM_CUDA_CHECK(cuda::sigmoid_gate(o.as<float>(), Vd, proj.as<float>(), PW, T, Vd, gated.data(), DType::BF16, Vd, g_stream,
                                      true));
  });
  SSM_CUDA_CHECK(cudaStreamDestroy(g_stream));
  return 0;
}
