// Owns the prefill attention benchmark of the GPU paged attention's tensor-core pass (issues 30 / 31): one sequence
// of L = 2048, 8192, 32768 new tokens (a prompt from scratch, causal) over the fp32 paged KV cache at four model
// shapes: 32 q / 8 kv heads of 128, Falcon-H1-7B's 12 / 2 of 128, Qwen3.5-9B's 16 / 4 of 256, Qwen3.5-35B-A3B's 16 / 2
// of 256. Times
// cuda::paged_attention through the plan the runner builds (PagedAttentionPlan::build with kTcMinTokens: every tile
// on the tensor cores, key chunks split over blocks while the workspace slots last) with CUDA events: median of 5
// after a warm-up. TFLOP/s counts causal FLOPs, 4 * L^2 / 2 * head_dim * q_heads. Each case also checks 4 query
// tokens (all heads) against an fp64 host reference (max relative error over those rows; bf16 operands give ~1e-3).
// Usage: bench_cuda_prefill_attention [block_size (default 16)] [max L (default 32768)] [kernels (default tc)]. Needs a
// GPU. kernels: a comma list of tc (the tiles converting the fp32 keys themselves, no staging), staged (the keys
// staged as bf16 once per call, mma.sync tiles), wg (staged, the lockstep warpgroup tiles: the runner's default at
// head_dim 128 / 256), ws / ws2 (staged, the warp-specialized warpgroup tiles, SSMSERVE_ATTN_TC_WS=1 / 2), or all.
// The staged kinds' times include the staging kernel (as the runner runs them); their 4-row errors likewise.
//
// Decode mode (issue 31: the split-KV pass's reads of the fp32 paged KV cache at long contexts):
// bench_cuda_prefill_attention decode [block_size (default 16)] [max context (default 131072)]: one decode row (batch
// 1) over contexts 2k, 8k, 32k, 128k at Qwen3.5-9B's 16 q / 4 kv heads of 256 and Falcon-H1-7B's 12 / 2 of 128,
// through PagedAttentionPlan::decode as the runner builds it (and its fixed 512-key splits, batch-invariant mode),
// with the decode kernel (KernelTuning::attn_decode_kernel, the default) and the tiled kernel
// (SSMSERVE_ATTN_DECODE_KERNEL=0's path); the default plan also sized for 512 and 1024 items
// (SSMSERVE_ATTN_FILL_ITEMS). Per case: median of 5 samples after a warm-up sample, each sample 20 calls
// back to back rotating over up to 8 disjoint copies of the context's pages (so short contexts are not served from
// the L2); effective bandwidth = the context's K and V bytes (seq_len x kv heads x head_dim x 8) / time; the result's
// relative error against an fp64 host reference (both kernels).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cache/kv_cache.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/paged_attention.h"

namespace {
using namespace ssmserve;
using cuda::DeviceBuffer;

struct Shape {
  const char* name;
  int heads, kv_heads, D;
};

/// Uniform values in [lo, hi) from a 32-bit LCG (fast enough for the 256 MB caches).
void fill(std::vector<float>& v, uint32_t seed, float lo, float hi) {
  uint32_t x = seed;
  for (auto& e : v) x = x * 1664525u + 1013904223u, e = lo + (hi - lo) * static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

/// Causal attention of query token i (all heads) in fp64 over the host copy of the cache (pages 1..: block b of the
/// sequence is page b + 1): out [heads * D].
void reference_row(const Shape& sh, int bs, const std::vector<float>& cache, int64_t page_floats, const std::vector<float>& q,
                   int i, std::vector<double>& out) {
  const int D = sh.D, group = sh.heads / sh.kv_heads;
  const int64_t W = int64_t{sh.kv_heads} * D, kv = int64_t{bs} * W;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(i + 1);
  out.assign(static_cast<size_t>(sh.heads) * D, 0.0);
  for (int h = 0; h < sh.heads; ++h) {
    const int g = h / group;
    const float* qh = q.data() + (int64_t{i} * sh.heads + h) * D;
    double mx = -INFINITY;
    for (int j = 0; j <= i; ++j) {
      const float* k = cache.data() + (j / bs + 1) * page_floats + (j % bs) * W + int64_t{g} * D;
      double d = 0;
      for (int c = 0; c < D; ++c) d += double(qh[c]) * k[c];
      s[j] = d * scale, mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j <= i; ++j) s[j] = std::exp(s[j] - mx), sum += s[j];
    for (int j = 0; j <= i; ++j) {
      const float* v = cache.data() + (j / bs + 1) * page_floats + kv + (j % bs) * W + int64_t{g} * D;
      for (int c = 0; c < D; ++c) out[int64_t{h} * D + c] += s[j] / sum * v[c];
    }
  }
}

/// Decode attention of one query (q [heads * D], position ctx - 1) over pages table[0..] in fp64: out [heads * D].
void reference_decode(const Shape& sh, int bs, const std::vector<float>& cache, int64_t page_floats, const float* q,
                      const std::vector<int32_t>& table, int ctx, std::vector<double>& out) {
  const int D = sh.D, group = sh.heads / sh.kv_heads;
  const int64_t W = int64_t{sh.kv_heads} * D, kv = int64_t{bs} * W;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(ctx);
  out.assign(static_cast<size_t>(sh.heads) * D, 0.0);
  for (int h = 0; h < sh.heads; ++h) {
    const int g = h / group;
    const float* qh = q + int64_t{h} * D;
    double mx = -INFINITY;
    for (int j = 0; j < ctx; ++j) {
      const float* k = cache.data() + table[j / bs] * page_floats + (j % bs) * W + int64_t{g} * D;
      double d = 0;
      for (int c = 0; c < D; ++c) d += double(qh[c]) * k[c];
      s[j] = d * scale, mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < ctx; ++j) s[j] = std::exp(s[j] - mx), sum += s[j];
    for (int j = 0; j < ctx; ++j) {
      const float* v = cache.data() + table[j / bs] * page_floats + kv + (j % bs) * W + int64_t{g} * D;
      for (int c = 0; c < D; ++c) out[int64_t{h} * D + c] += s[j] / sum * v[c];
    }
  }
}

/// The decode mode (see the top of the file).
int bench_decode(int bs, int max_ctx) {
  const Shape shapes[] = {{"qwen3.5-9b", 16, 4, 256}, {"falcon-h1-7b", 12, 2, 128}};
  constexpr int kReps = 20, kCopies = 8;
  for (const Shape& sh : shapes) {
    const int D = sh.D, KVH = sh.kv_heads, group = sh.heads / KVH;
    const int64_t W = int64_t{KVH} * D, page_floats = 2 * int64_t{bs} * W, QW = int64_t{sh.heads} * D;
    const int nb = (max_ctx + bs - 1) / bs;  // pages 1..nb (page 0 unused)
    std::vector<float> host(static_cast<size_t>(page_floats) * (nb + 1)), hq(static_cast<size_t>(QW));
    fill(host, 4242u + D, -1.0f, 1.0f);
    fill(hq, 99u + D, -2.0f, 2.0f);
    DeviceBuffer cache(host.size() * sizeof(float)), dq = cuda::to_device(hq), dout(QW * sizeof(float));
    cache.upload(host.data(), host.size() * sizeof(float));
    const KvCacheView kv{static_cast<std::byte*>(cache.data()), page_floats * int64_t{sizeof(float)}, 0, bs, KVH, D};
    for (int ctx : {2048, 8192, 32768, 131072}) {
      if (ctx > max_ctx) continue;
      const int blocks = (ctx + bs - 1) / bs, copies = std::max(1, std::min(kCopies, nb / blocks));
      // Copy c's table: pages 1 + c * blocks .. (disjoint copies of the context when they fit).
      std::vector<std::vector<int32_t>> tables(copies, std::vector<int32_t>(blocks));
      std::vector<DeviceBuffer> dtabs;
      for (int c = 0; c < copies; ++c) {
        for (int b = 0; b < blocks; ++b) tables[c][b] = 1 + c * blocks + b;
        dtabs.push_back(cuda::to_device(tables[c]));
      }
      std::vector<double> ref;
      reference_decode(sh, bs, host, page_floats, hq.data(), tables[0], ctx, ref);
      const std::vector<int32_t> qsl{0, 1}, sls{ctx};
      DeviceBuffer dqsl = cuda::to_device(qsl), dsl = cuda::to_device(sls);
      // (fixed splits, fill items, decode kernel): the runner's default plan with each kernel, the default plan sized
      // for more items (SSMSERVE_ATTN_FILL_ITEMS), batch-invariant mode's fixed 512-key splits with each kernel.
      struct Config {
        bool fixed;
        int fill_items;
        bool kernel;
      };
      for (const Config cf : {Config{false, 256, true}, Config{false, 256, false}, Config{false, 512, true},
                              Config{false, 1024, true}, Config{true, 256, true}, Config{true, 256, false}}) {
        const int fixed = cf.fixed, kernel = cf.kernel;
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.attn_decode_kernel = cf.kernel;
        t.attn_fill_items = cf.fill_items;
        cuda::set_kernel_tuning(t);
        const auto plan = cuda::PagedAttentionPlan::decode(1, blocks * bs, group, cf.fixed);
        DeviceBuffer dtasks = cuda::to_device(plan.tasks), ditems = cuda::to_device(plan.items),
                     ws(cuda::paged_attention_workspace_floats(plan, KVH, D) * sizeof(float));
        {
          auto args = [&](int c) {
            cuda::PagedAttentionArgs a{sh.heads, 1.0f / std::sqrt(static_cast<float>(D)), blocks, dqsl.as<int32_t>(),
                                       dsl.as<int32_t>(), dtabs[c].as<int32_t>(), dtasks.as<int32_t>(), ditems.as<int32_t>(),
                                       plan.num_tasks, plan.num_items, plan.tokens_per_task, plan.key_split};
            a.num_single_tasks = plan.num_single_tasks;
            a.fixed_split = plan.fixed_split;
            return a;
          };
          cudaEvent_t e0, e1;
          SSM_CUDA_CHECK(cudaEventCreate(&e0));
          SSM_CUDA_CHECK(cudaEventCreate(&e1));
          std::vector<float> ms;
          for (int i = 0; i < 6; ++i) {  // a warm-up sample, then 5 timed
            SSM_CUDA_CHECK(cudaEventRecord(e0));
            for (int r = 0; r < kReps; ++r)
              SSM_CUDA_CHECK(cuda::paged_attention(dq.as<float>(), QW, dout.as<float>(), QW, kv, args((r + 1) % copies),
                                                   ws.as<float>(), nullptr));
            SSM_CUDA_CHECK(cudaEventRecord(e1));
            SSM_CUDA_CHECK(cudaEventSynchronize(e1));
            float tm = 0;
            SSM_CUDA_CHECK(cudaEventElapsedTime(&tm, e0, e1));
            if (i > 0) ms.push_back(tm / kReps);
          }
          SSM_CUDA_CHECK(cudaEventDestroy(e0));
          SSM_CUDA_CHECK(cudaEventDestroy(e1));
          std::sort(ms.begin(), ms.end());
          // The output checked: one more call on copy 0 (the reference's pages).
          SSM_CUDA_CHECK(cuda::paged_attention(dq.as<float>(), QW, dout.as<float>(), QW, kv, args(0), ws.as<float>(), nullptr));
          SSM_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got = cuda::to_host<float>(dout, static_cast<size_t>(QW));
          double err = 0, ref_norm = 0;
          for (int64_t c = 0; c < QW; ++c) {
            const double d = got[c] - ref[c];
            err += d * d, ref_norm += ref[c] * ref[c];
          }
          const double bytes = double(ctx) * KVH * D * 8;
          std::printf("decode attention %-13s %2d/%d heads x %3d, context %6d, block %d, %s splits of %3d (%4d items x %d "
                      "kv heads), %-13s: %8.4f ms, %7.1f GB/s, rel err %.2e\n",
                      sh.name, sh.heads, KVH, D, ctx, bs, fixed ? "fixed    " : cf.fill_items == 256 ? "fill     " :
                      cf.fill_items == 512 ? "fill 512 " : "fill 1024", plan.key_split, plan.num_items, KVH,
                      kernel ? "decode kernel" : "tiled kernel", ms[2], bytes / ms[2] * 1e-6,
                      std::sqrt(err / std::max(ref_norm, 1e-30)));
          std::fflush(stdout);
        }
      }
      cuda::set_kernel_tuning(cuda::KernelTuning{});
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "decode") {
    const int bs = argc > 2 ? std::atoi(argv[2]) : 16, max_ctx = argc > 3 ? std::atoi(argv[3]) : 131072;
    if (bs <= 0 || max_ctx < 2048) {
      std::fprintf(stderr, "usage: bench_cuda_prefill_attention decode [block_size > 0] [max context >= 2048]\n");
      return 2;
    }
    if (!cuda::gpu_available()) {
      std::fprintf(stderr, "bench_cuda_prefill_attention: no CUDA device\n");
      return 1;
    }
    return bench_decode(bs, max_ctx);
  }
  const int bs = argc > 1 ? std::atoi(argv[1]) : 16, max_len = argc > 2 ? std::atoi(argv[2]) : 32768;
  // The tile kernels to time (see the top of the file): (name, staged keys, warpgroup tiles, attn_tc_ws).
  struct Kind {
    const char* name;
    bool staged, wgmma;
    int ws;
  };
  const Kind kinds[] = {{"tc", false, false, 0}, {"staged", true, false, 0}, {"wg", true, true, 0}, {"ws", true, true, 1},
                        {"ws2", true, true, 2}};
  std::vector<Kind> chosen;
  {
    const std::string list = argc > 3 ? argv[3] : "tc";
    size_t at = 0;
    while (at <= list.size()) {
      const size_t end = std::min(list.find(',', at), list.size());
      const std::string name = list.substr(at, end - at);
      bool found = false;
      for (const Kind& k : kinds)
        if (name == k.name || name == "all") chosen.push_back(k), found = true;
      if (!found) chosen.clear(), at = list.size();
      at = end + 1;
    }
  }
  if (bs <= 0 || max_len < 16 || chosen.empty()) {
    std::fprintf(stderr, "usage: bench_cuda_prefill_attention [block_size > 0] [max L >= 16] [tc,staged,wg,ws,ws2 | all]\n");
    return 2;
  }
  if (!cuda::gpu_available()) {
    std::fprintf(stderr, "bench_cuda_prefill_attention: no CUDA device\n");
    return 1;
  }
  const Shape shapes[] = {{"gqa4-128", 32, 8, 128}, {"falcon-h1-7b", 12, 2, 128}, {"qwen3.5-9b", 16, 4, 256},
                          {"qwen3.5-35b-a3b", 16, 2, 256}};
  for (const Shape& sh : shapes) {
    const int D = sh.D, KVH = sh.kv_heads, group = sh.heads / KVH;
    const int64_t W = int64_t{KVH} * D, page_floats = 2 * int64_t{bs} * W, QW = int64_t{sh.heads} * D;
    const int nb = (max_len + bs - 1) / bs;
    // Pages 1..nb hold the sequence's K / V (page 0 unused), the prompt's L tokens already cached (as the runner
    // does: reshape_and_cache precedes attention).
    std::vector<float> host(static_cast<size_t>(page_floats) * (nb + 1)), hq(static_cast<size_t>(max_len) * QW);
    fill(host, 12345u + D, -1.0f, 1.0f);
    fill(hq, 777u + D, -2.0f, 2.0f);
    DeviceBuffer cache(host.size() * sizeof(float)), dq = cuda::to_device(hq), dout(hq.size() * sizeof(float));
    cache.upload(host.data(), host.size() * sizeof(float));
    const KvCacheView kv{static_cast<std::byte*>(cache.data()), page_floats * int64_t{sizeof(float)}, 0, bs, KVH, D};
    std::vector<int32_t> table(nb);
    for (int b = 0; b < nb; ++b) table[b] = b + 1;
    DeviceBuffer dtab = cuda::to_device(table);
    for (int L : {2048, 8192, 32768}) {
      if (L > max_len) continue;
      const std::vector<int32_t> qsl{0, L}, sls{L};
      const auto plan = cuda::PagedAttentionPlan::build(qsl, sls, group, cuda::kTcMinTokens);
      const size_t stage = cuda::tc_stage_floats(plan, KVH, D, true);
      DeviceBuffer dqsl = cuda::to_device(qsl), dsl = cuda::to_device(sls), dz = cuda::to_device(std::vector<int32_t>{0}),
                   dtc = cuda::to_device(plan.tc_tiles),
                   dti = cuda::to_device(plan.tc_items.empty() ? std::vector<int32_t>{0} : plan.tc_items),
                   dbase = cuda::to_device(plan.tc_row_key_base), dstage = cuda::to_device(plan.tc_stage_rows),
                   ws(std::max<size_t>(16, (cuda::paged_attention_workspace_floats(plan, KVH, D) + stage) * sizeof(float)));
      // The 4 checked query tokens' fp64 references (once per case).
      const int checked[] = {0, 1, L / 2 + 3, L - 1};
      std::vector<std::vector<double>> refs(4);
      for (int c = 0; c < 4; ++c) reference_row(sh, bs, host, page_floats, hq, checked[c], refs[c]);
      for (const Kind& kind : chosen) {
        cuda::PagedAttentionArgs a{sh.heads, 1.0f / std::sqrt(static_cast<float>(D)), nb, dqsl.as<int32_t>(),
                                   dsl.as<int32_t>(), dtab.as<int32_t>(), dz.as<int32_t>(), dz.as<int32_t>(), 0, 0,
                                   plan.tokens_per_task, plan.key_split, dtc.as<int32_t>(), plan.num_tc_tiles,
                                   plan.tc_tokens, dti.as<int32_t>(), plan.num_tc_items};
        if (kind.staged) {
          if (stage == 0) continue;  // over kTcStageMaxBytes: the runner would not stage either
          a.tc_row_key_base = dbase.as<int32_t>(), a.tc_stage_rows = dstage.as<int32_t>();
          a.num_tc_stage_rows = plan.num_tc_stage_rows, a.tc_stage_max_keys = plan.tc_stage_max_keys;
          a.tc_stage_keys = plan.tc_stage_keys, a.num_tc_slots = plan.num_tc_slots, a.tc_wgmma = kind.wgmma;
        }
        if (kind.wgmma && !cuda::tc_wgmma_head_dim_ok(D)) continue;
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.attn_tc_ws = kind.ws;
        cuda::set_kernel_tuning(t);
        cudaEvent_t e0, e1;
        SSM_CUDA_CHECK(cudaEventCreate(&e0));
        SSM_CUDA_CHECK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int i = 0; i < 6; ++i) {  // a warm-up, then 5 timed
          SSM_CUDA_CHECK(cudaEventRecord(e0));
          SSM_CUDA_CHECK(cuda::paged_attention(dq.as<float>(), QW, dout.as<float>(), QW, kv, a, ws.as<float>(), nullptr));
          SSM_CUDA_CHECK(cudaEventRecord(e1));
          SSM_CUDA_CHECK(cudaEventSynchronize(e1));
          float tm = 0;
          SSM_CUDA_CHECK(cudaEventElapsedTime(&tm, e0, e1));
          if (i > 0) ms.push_back(tm);
        }
        SSM_CUDA_CHECK(cudaEventDestroy(e0));
        SSM_CUDA_CHECK(cudaEventDestroy(e1));
        cuda::set_kernel_tuning(cuda::KernelTuning{});
        std::sort(ms.begin(), ms.end());
        const double t_ms = ms[2], flops = 4.0 * (double(L) * L / 2) * D * sh.heads;
        // Accuracy of the 4 query tokens against the fp64 reference.
        const auto got = cuda::to_host<float>(dout, static_cast<size_t>(L) * QW);
        double err = 0, ref_norm = 0;
        for (int c = 0; c < 4; ++c)
          for (int64_t x = 0; x < QW; ++x) {
            const double d = got[checked[c] * QW + x] - refs[c][x];
            err += d * d, ref_norm += refs[c][x] * refs[c][x];
          }
        std::printf("prefill attention %-15s %2d/%d heads x %3d, L %5d, block %d, %-6s: %9.3f ms, %6.1f TFLOP/s (%4d tiles, "
                    "%4d items) x %d kv heads, rel err %.2e\n",
                    sh.name, sh.heads, KVH, D, L, bs, kind.name, t_ms, flops / t_ms * 1e-9, plan.num_tc_tiles,
                    plan.num_tc_items, KVH, std::sqrt(err / std::max(ref_norm, 1e-30)));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
