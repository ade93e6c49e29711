// Owns the step schedule the GPU hybrid tests drive a CPU model and a GPU model through (test_cuda_hybrid.cpp,
// test_cuda_hybrid_models.cpp): two sequences on state blocks 1 and 2 with KV blocks from 3 up; step 0 prefills 40
// and 7 tokens, step 1 continues the second with 12 while the first decodes, later steps decode both (padded to 4
// rows); and the relative error of two logit vectors.
#pragma once
#include <cmath>
#include <random>
#include <vector>

#include "model/attention_metadata.h"
#include "model/causal_lm.h"

namespace ssmserve::cudatest {

struct HybridSchedule {
  std::vector<ScheduledSeq> seqs = {{1, 0, 40, true}, {2, 0, 7, true}};
  std::vector<std::vector<int32_t>> tables, toks;
  std::mt19937 rng;
  int vocab;
  /// Token ids drawn from [0, vocab) with `seed`.
  HybridSchedule(int kv_block_size, int vocab_size, unsigned seed) : rng(seed), vocab(vocab_size) {
    const int per = kv_block_size > 0 ? 80 / kv_block_size + 2 : 1;
    for (int s = 0; s < 2; ++s) {
      tables.emplace_back();
      for (int b = 0; b < per; ++b) tables.back().push_back(3 + s + 2 * b);
    }
    for (const auto& s : seqs) toks.push_back(ids(s.num_scheduled_tokens));
  }
  /// Pool blocks the schedule's tables reach (block ids up to 4 + 2 (per - 1), per = 80 / kv_block_size + 2), with
  /// room to spare: wide heads make a KV token large, so a page holds few tokens and the sequences span many blocks.
  static int pool_blocks(int kv_block_size) { return 6 + 2 * (kv_block_size > 0 ? 80 / kv_block_size + 2 : 1); }
  std::vector<int32_t> ids(int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<unsigned>(vocab));
    return v;
  }
  /// Step `step`'s batch for model `m` (logits of every real row, none of the padding).
  ForwardBatch batch(int step, const CausalLM& m) {
    MetadataOptions opt;
    opt.pad_decodes_to = step >= 2 ? 4 : 0;
    opt.chunk_size = m.chunk_size();
    ForwardBatch b = make_forward_batch(seqs, toks, opt);
    build_attention_metadata(seqs, tables, m.kv_block_size(), b.meta, b.linear_meta, b.attn_meta);
    for (int i = 0; i < b.num_tokens(); ++i)
      if (i < b.meta.num_decodes || i >= b.prefill_token_offset()) b.logits_indices.push_back(i);
    return b;
  }
  void advance(int step) {
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int n = step == 0 && s == 1 ? 12 : 1;
      seqs[s] = {seqs[s].state_block, seqs[s].num_computed_tokens + seqs[s].num_scheduled_tokens, n, n > 1};
      toks[s] = ids(n);
    }
  }
};

/// ||got - ref|| / ||ref|| (infinite when got holds a non-finite value).
inline double logits_rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace ssmserve::cudatest
