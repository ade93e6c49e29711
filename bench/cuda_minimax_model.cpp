// Owns the end-to-end GPU benchmark of the MiniMax runner (issue 8): with dummy bf16 weights at a config's shape
// (configs/minimax-bench), for each context length one prefill step of the whole prompt (tokens/s, wall clock
// including the logits download, median of 3) and then batch-1 decode steps (ms per token, median of the steps after the CUDA
// graph capture). The same is measured for the config with every layer turned into a lightning layer, whose
// decode time per token must not grow with the context. Prints one line per (variant, context).
// Usage: bench_cuda_minimax_model CONFIG_DIR [CONTEXT ...]   (default contexts 1024 4096 16384 65536;
//        SSMSERVE_BENCH_HYBRID_ONLY=1 skips the all-linear variant, SSMSERVE_BENCH_LINEAR_ONLY=1 the hybrid one,
//        SSMSERVE_BENCH_LINEAR_CONTEXTS="..." picks the all-linear
//        contexts). Prefill: median of 3 steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "device/device.h"
#include "model/attention_metadata.h"
#include "model/causal_lm.h"
#include "runtime/cuda_minimax.h"

using namespace ssmserve;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// One step of `n` new tokens on state block 1 after `computed` tokens, KV blocks 2, 3, ...
ForwardBatch step(const CausalLM& m, int computed, int n, std::mt19937& rng) {
  const int bs = m.kv_block_size();
  std::vector<ScheduledSeq> seqs = {{1, computed, n, computed == 0}};
  std::vector<std::vector<int32_t>> toks(1, std::vector<int32_t>(n)), tables(1);
  for (auto& t : toks[0]) t = 2 + static_cast<int32_t>(rng() % 50000);
  if (bs > 0)
    for (int b = 0; b < (computed + n + bs - 1) / bs; ++b) tables[0].push_back(2 + b);
  MetadataOptions opt;
  opt.chunk_size = m.chunk_size();
  ForwardBatch fb = make_forward_batch(seqs, toks, opt);
  build_attention_metadata(seqs, tables, bs, fb.meta, fb.linear_meta, fb.attn_meta);
  fb.logits_indices = {n - 1};
  return fb;
}

void run(const ModelConfig& cfg, const char* variant, const std::vector<int>& contexts) {
  const double t0 = now_s();
  auto model = cuda::load_minimax_cuda(cfg, LoadFormat::Dummy);
  std::printf("%s: loaded in %.1f s (kv block %d tokens)\n", variant, now_s() - t0, model->kv_block_size());
  std::mt19937 rng(1);
  const int decode_steps = 40, bs = std::max(1, model->kv_block_size());
  std::vector<float> logits(cfg.vocab_size);
  {  // warm-up: module loading, cuBLASLt heuristics
    StateCache cache(1, model->state_shape(), 4);
    model->forward(step(*model, 0, 256, rng), cache, logits.data());
    model->forward(step(*model, 256, 1, rng), cache, logits.data());
  }
  for (int ctx : contexts) {
    // State block 1 plus, with softmax layers, the KV pages 2, 3, ... (an all-linear model needs no pages: one
    // state block per page would be 16 MB per token here).
    const int blocks = model->kv_block_size() > 0 ? 2 + (ctx + decode_steps + bs - 1) / bs + 1 : 3;
    StateCache cache(1, model->state_shape(), blocks);
    ForwardBatch pre = step(*model, 0, ctx, rng);
    // Prefill: median of 3 (each from an empty state, rewriting the same KV slots).
    std::vector<double> pres;
    double a = 0;
    for (int r = 0; r < 3; ++r) {
      a = now_s();
      model->forward(pre, cache, logits.data());
      pres.push_back(now_s() - a);
    }
    std::sort(pres.begin(), pres.end());
    const double prefill = pres[1];
    std::vector<double> dec;
    for (int i = 0; i < decode_steps; ++i) {
      ForwardBatch d = step(*model, ctx + i, 1, rng);
      a = now_s();
      model->forward(d, cache, logits.data());
      dec.push_back(now_s() - a);
    }
    std::vector<double> tail(dec.begin() + 3, dec.end());  // after the eager run and the capture
    std::sort(tail.begin(), tail.end());
    std::printf("%s context %6d: prefill %8.1f ms  %9.0f tok/s | decode %.3f ms/token (median of %zu, min %.3f)\n",
                variant, ctx, 1e3 * prefill, ctx / prefill, 1e3 * tail[tail.size() / 2], tail.size(), 1e3 * tail[0]);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CONFIG_DIR [CONTEXT ...]\n", argv[0]);
    return 2;
  }
  if (!cuda::gpu_available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  std::vector<int> contexts;
  for (int i = 2; i < argc; ++i) contexts.push_back(std::atoi(argv[i]));
  if (contexts.empty()) contexts = {1024, 4096, 16384, 65536};
  try {
    std::printf("device: %s\n", cuda::device_description(0).c_str());
    ModelConfig cfg = ModelConfig::load(argv[1]);
    const char* lo = std::getenv("SSMSERVE_BENCH_LINEAR_ONLY");
    if (!(lo && *lo && std::string(lo) != "0")) run(cfg, "hybrid", contexts);
    if (const char* v = std::getenv("SSMSERVE_BENCH_HYBRID_ONLY"); v && *v && std::string(v) != "0") return 0;
    // The same shapes with every layer a lightning layer: decode cost independent of the context.
    nlohmann::json raw = cfg.raw;
    for (auto& t : raw["layer_types"]) t = "linear_attention";
    const auto dir = std::filesystem::temp_directory_path() / "minimax-bench-linear";
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << raw.dump(2);
    std::vector<int> linear_contexts = contexts;  // SSMSERVE_BENCH_LINEAR_CONTEXTS="1024 16384 65536" narrows them
    if (const char* v = std::getenv("SSMSERVE_BENCH_LINEAR_CONTEXTS"); v && *v) {
      linear_contexts.clear();
      for (const char* p = v; *p;) {
        char* end = nullptr;
        const long c = std::strtol(p, &end, 10);
        if (end == p) break;
        linear_contexts.push_back(static_cast<int>(c));
        p = end;
      }
    }
    run(ModelConfig::load(dir), "all-linear", linear_contexts);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
