// Owns the one batch builder (see batch_builder.h).
#include "model/batch_builder.h"

namespace ssmserve {

ForwardBatch build_forward_batch(std::span<const ScheduledSeq> seqs, std::span<const std::vector<int32_t>> tokens,
                                 std::span<const std::vector<int32_t>> block_tables, const BatchBuilderOptions& opt) {
  ForwardBatch b = make_forward_batch(seqs, tokens, opt.meta);
  if (opt.linear_attention || opt.kv_block_size > 0)
    build_attention_metadata(seqs, opt.kv_block_size > 0 ? block_tables : std::span<const std::vector<int32_t>>{}, opt.kv_block_size,
                             b.meta, b.linear_meta, b.attn_meta);
  return b;
}

}  // namespace ssmserve
