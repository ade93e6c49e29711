// Owns the hybrid model's per-step metadata builder (see attention_metadata.h).
#include "model/attention_metadata.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve {

void build_attention_metadata(std::span<const ScheduledSeq> seqs, std::span<const std::vector<int32_t>> block_tables,
                              int kv_block_size, const MambaBatchMetadata& meta, LinearAttentionMetadata& linear,
                              PagedAttentionMetadata& paged) {
  SSM_CHECK(kv_block_size >= 0, "attention metadata: kv block size {} < 0", kv_block_size);
  SSM_CHECK(kv_block_size == 0 || block_tables.size() == seqs.size(), "attention metadata: {} sequences but {} block tables",
            seqs.size(), block_tables.size());
  const int B = meta.num_reqs, nd = meta.num_decode_rows();
  // Row r -> input sequence (-1 for padded rows).
  std::vector<int32_t> seq_of(static_cast<size_t>(B), -1);
  for (int r = 0; r < meta.num_decodes; ++r) seq_of[r] = meta.order[r];
  for (int r = 0; r < meta.num_prefills; ++r) seq_of[nd + r] = meta.order[meta.num_decodes + r];
  // 1. Linear attention (§2.4).
  linear.num_prefills = meta.num_prefills;
  linear.num_prefill_tokens = meta.num_prefill_tokens;
  linear.num_decodes = nd;
  linear.num_decode_tokens = meta.query_start_loc[nd];
  linear.query_start_loc = meta.query_start_loc;
  linear.seq_lens.assign(B, 0);
  linear.state_indices_tensor.assign(B, 0);
  linear.num_computed_tokens.assign(B, 0);
  for (int r = 0; r < B; ++r) {
    if (seq_of[r] < 0) continue;
    const ScheduledSeq& s = seqs[seq_of[r]];
    linear.seq_lens[r] = s.num_computed_tokens + s.num_scheduled_tokens;
    linear.state_indices_tensor[r] = s.state_block;
    linear.num_computed_tokens[r] = s.num_computed_tokens;
  }
  // 2. Paged attention.
  paged = PagedAttentionMetadata{};
  if (kv_block_size == 0) return;
  paged.block_size = kv_block_size;
  paged.query_start_loc = meta.query_start_loc;
  paged.seq_lens = linear.seq_lens;
  int max_blocks = 1;
  for (int r = 0; r < B; ++r) max_blocks = std::max(max_blocks, (paged.seq_lens[r] + kv_block_size - 1) / kv_block_size);
  paged.max_num_blocks_per_seq = max_blocks;
  paged.block_tables.assign(static_cast<size_t>(B) * max_blocks, 0);
  const int T = meta.query_start_loc.back();
  paged.slot_mapping.assign(T, -1);
  paged.positions.assign(T, 0);
  for (int r = 0; r < B; ++r) {
    if (seq_of[r] < 0) continue;
    const ScheduledSeq& s = seqs[seq_of[r]];
    const auto& table = block_tables[seq_of[r]];
    const int need = (paged.seq_lens[r] + kv_block_size - 1) / kv_block_size;
    SSM_CHECK(static_cast<int>(table.size()) >= need, "attention metadata: sequence {} has {} KV blocks for {} tokens (needs {})",
              seq_of[r], table.size(), paged.seq_lens[r], need);
    for (int i = 0; i < need; ++i) {
      SSM_CHECK(table[i] >= 1, "attention metadata: sequence {} holds KV block id {} (0 is the null block)", seq_of[r], table[i]);
      paged.block_tables[static_cast<size_t>(r) * max_blocks + i] = table[i];
    }
    for (int i = 0; i < s.num_scheduled_tokens; ++i) {
      const int pos = s.num_computed_tokens + i, t = meta.query_start_loc[r] + i;
      paged.positions[t] = pos;
      paged.slot_mapping[t] = table[pos / kv_block_size] * kv_block_size + pos % kv_block_size;
    }
  }
}

}  // namespace ssmserve
