// Owns the hybrid-metadata checks both decoders run (see decoder_shape.h).
#include "model/decoder/decoder_shape.h"

#include "core/error.h"

namespace ssmserve {

void check_decoder_metadata(const std::string& label, const ForwardBatch& batch, const StateCache& cache,
                            const StateLayout& layout, bool has_linear, int tp_world) {
  const LinearAttentionMetadata& lm = batch.linear_meta;
  const PagedAttentionMetadata& am = batch.attn_meta;
  const int B = batch.meta.num_reqs;
  const int64_t T = batch.num_tokens();
  if (has_linear || layout.has_attention()) {
    SSM_CHECK(static_cast<int>(lm.state_indices_tensor.size()) == B && static_cast<int>(lm.query_start_loc.size()) == B + 1 &&
                  static_cast<int>(lm.num_computed_tokens.size()) == B,
              "{} forward: the batch has no linear-attention metadata for its {} rows (build_forward_batch)", label, B);
    for (int32_t b : lm.state_indices_tensor) SSM_CHECK(b >= 0 && b < cache.num_blocks(), "{} forward: state index {} out of range", label, b);
  }
  if (!layout.has_attention()) return;
  const int bs = layout.kv_block_size();
  SSM_CHECK(am.block_size == bs && static_cast<int>(am.seq_lens.size()) == B && static_cast<int>(am.slot_mapping.size()) == T &&
                static_cast<int>(am.positions.size()) == T && static_cast<int>(am.query_start_loc.size()) == B + 1 &&
                static_cast<int64_t>(am.block_tables.size()) >= static_cast<int64_t>(B) * am.max_num_blocks_per_seq,
            "{} forward: paged-attention metadata missing or for block size {} (model: {})", label, am.block_size, bs);
  for (int32_t b : am.block_tables) SSM_CHECK(b >= 0 && b < cache.num_blocks(), "{} forward: KV block {} out of range", label, b);
  for (int32_t s : am.slot_mapping)
    SSM_CHECK(s >= -1 && s < static_cast<int64_t>(cache.num_blocks()) * bs, "{} forward: slot {} out of range", label, s);
  for (int r = 0; r < B; ++r)
    SSM_CHECK((am.seq_lens[r] + bs - 1) / bs <= am.max_num_blocks_per_seq, "{} forward: row {} needs more than {} KV blocks", label, r,
              am.max_num_blocks_per_seq);
  SSM_CHECK(tp_world == 1 || cache.shape().ssm_elems * static_cast<int64_t>(dtype_size(cache.dtypes().ssm)) >= layout.kv_page_bytes(),
            "{} tensor-parallel forward: a rank's part of the page ({} elements of the SSM state dtype) cannot hold its {} bytes "
            "of KV block (use --mamba-ssm-cache-dtype float32 with --tensor-parallel-size > 1)",
            label, cache.shape().ssm_elems, layout.kv_page_bytes());
}

}  // namespace ssmserve
