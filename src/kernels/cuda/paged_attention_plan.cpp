// Owns the host-side work list of the GPU paged attention (see paged_attention.h).
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/paged_attention.h"

namespace ssmserve::cuda {

PagedAttentionPlan PagedAttentionPlan::build(std::span<const int32_t> query_start_loc, std::span<const int32_t> seq_lens,
                                             int group, int tc_min_tokens, bool fixed_split) {
  SSM_CHECK(group >= 1 && group <= 16, "paged attention plan: {} query heads per KV head (1..16 supported)", group);
  SSM_CHECK(query_start_loc.size() == seq_lens.size() + 1, "paged attention plan: query_start_loc has {} entries for {} rows",
            query_start_loc.size(), seq_lens.size());
  PagedAttentionPlan p;
  p.fixed_split = fixed_split;
  p.tokens_per_task = std::max(1, 16 / group);
  p.tc_tokens = std::max(1, kTcRows / group);
  const auto to_tc = [&](int32_t n) { return tc_min_tokens > 0 && n >= tc_min_tokens; };
  int64_t tasks = 0;
  int32_t longest = 1;
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    const int32_t n = query_start_loc[r + 1] - query_start_loc[r];
    if (to_tc(n)) continue;
    tasks += (std::max(n, 0) + p.tokens_per_task - 1) / p.tokens_per_task;
    longest = std::max(longest, seq_lens[r]);
  }
  if (!fixed_split) p.key_split = tasks >= kManyTasks ? (longest + 31) / 32 * 32 : fill_key_split(tasks, longest, kernel_tuning().attn_fill_items);
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    const int32_t n = query_start_loc[r + 1] - query_start_loc[r], sl = seq_lens[r];
    SSM_CHECK(n >= 0 && (sl == 0 || sl >= n), "paged attention plan: row {} has {} new tokens but seq_len {}", r, n, sl);
    if (to_tc(n)) {
      for (int32_t off = 0; off < n; off += p.tc_tokens)
        p.tc_tiles.insert(p.tc_tiles.end(), {static_cast<int32_t>(r), off, std::min(p.tc_tokens, n - off)});
      continue;
    }
    for (int32_t off = 0; off < n; off += p.tokens_per_task) {
      const int32_t nt = std::min(p.tokens_per_task, n - off);
      const int32_t last = sl == 0 ? 0 : sl - n + off + nt - 1;
      const int32_t splits = last / p.key_split + 1;
      const int32_t task = static_cast<int32_t>(p.tasks.size() / 4);
      p.tasks.insert(p.tasks.end(), {static_cast<int32_t>(r), off, nt, static_cast<int32_t>(p.items.size() / 2)});
      p.num_single_tasks += nt == 1;
      for (int32_t s = 0; s < splits; ++s) p.items.insert(p.items.end(), {task, s});
    }
  }
  p.num_tasks = static_cast<int>(p.tasks.size() / 4);
  p.num_items = static_cast<int>(p.items.size() / 2);
  p.num_tc_tiles = static_cast<int>(p.tc_tiles.size() / 3);
  // The tensor-core tiles' key chunks (tc_chunk_keys of the row's seq_len): one block per chunk while the workspace
  // slots last (the result is the same either way).
  std::vector<int32_t> chunks(p.num_tc_tiles);
  bool several = false;
  for (int i = 0; i < p.num_tc_tiles; ++i) {
    const int32_t r = p.tc_tiles[3 * i], off = p.tc_tiles[3 * i + 1], nt = p.tc_tiles[3 * i + 2];
    const int32_t n = query_start_loc[r + 1] - query_start_loc[r], sl = seq_lens[r];
    chunks[i] = sl == 0 ? 1 : (sl - n + off + nt - 1) / tc_chunk_keys(sl) + 1;
    several = several || chunks[i] > 1;
  }
  if (several) {
    for (int32_t i = 0; i < p.num_tc_tiles; ++i) {
      if (chunks[i] == 1) {
        p.tc_items.insert(p.tc_items.end(), {i, 0, -1});
      } else if (p.num_tc_slots + chunks[i] <= kTcSplitMaxItems) {
        for (int32_t c = 0; c < chunks[i]; ++c) p.tc_items.insert(p.tc_items.end(), {i, c, p.num_tc_slots + c});
        p.num_tc_slots += chunks[i];
      } else {
        p.tc_items.insert(p.tc_items.end(), {i, -1, -1});
      }
    }
  }
  p.num_tc_items = static_cast<int>(p.tc_items.size() / 3);
  // The rows whose keys the tensor-core pass may stage (every key of the row: its tiles end at its last position).
  if (p.num_tc_tiles > 0) {
    p.tc_row_key_base.assign(seq_lens.size(), -1);
    for (int i = 0; i < p.num_tc_tiles; ++i) {
      const int32_t r = p.tc_tiles[3 * i];
      if (p.tc_row_key_base[r] >= 0 || seq_lens[r] == 0) continue;
      SSM_CHECK(p.tc_stage_keys + seq_lens[r] <= INT32_MAX, "paged attention plan: {} staged keys", p.tc_stage_keys + seq_lens[r]);
      p.tc_row_key_base[r] = static_cast<int32_t>(p.tc_stage_keys);
      p.tc_stage_rows.push_back(r);
      p.tc_stage_keys += seq_lens[r];
      p.tc_stage_max_keys = std::max(p.tc_stage_max_keys, seq_lens[r]);
    }
    p.num_tc_stage_rows = static_cast<int>(p.tc_stage_rows.size());
  }
  return p;
}

PagedAttentionPlan PagedAttentionPlan::decode(int batch, int max_context, int group, bool fixed_split) {
  SSM_CHECK(group >= 1 && group <= 16 && batch >= 0 && max_context >= 1,
            "paged attention decode plan: batch {}, max_context {}, group {}", batch, max_context, group);
  PagedAttentionPlan p;
  p.fixed_split = fixed_split;
  p.tokens_per_task = 1;
  p.key_split = fixed_split ? kKeySplit : fill_key_split(batch, max_context, kernel_tuning().attn_fill_items);
  const int32_t splits = (max_context - 1) / p.key_split + 1;
  for (int32_t r = 0; r < batch; ++r) {
    p.tasks.insert(p.tasks.end(), {r, 0, 1, r * splits});
    for (int32_t s = 0; s < splits; ++s) p.items.insert(p.items.end(), {r, s});
  }
  p.num_tasks = p.num_single_tasks = batch;
  p.num_items = batch * splits;
  return p;
}

}  // namespace ssmserve::cuda
