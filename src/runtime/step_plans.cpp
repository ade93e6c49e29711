// Owns the per-step plans of the lightning and softmax-attention layers (see step_plans.h).
#include "runtime/step_plans.h"

#include <algorithm>
#include <span>

#include "core/error.h"
#include "device/cuda_check.h"

namespace ssmserve::cuda {

void StepPlans::build(const ForwardBatch& batch, bool decode_only) {
  const LinearAttentionMetadata& lm = batch.linear_meta;
  const PagedAttentionMetadata& am = batch.attn_meta;
  host_.clear();
  auto put = [&](const std::vector<int32_t>& v) {
    const size_t off = host_.size();
    host_.insert(host_.end(), v.begin(), v.end());
    host_.resize((host_.size() + 3) / 4 * 4);  // 16-byte aligned parts
    return off;
  };
  if (shape.linear) {
    const int nd = lm.num_decodes;
    lin_idx = put(lm.state_indices_tensor);
    lin_qsl = put(lm.query_start_loc);
    lin_nc = put(lm.num_computed_tokens);
    const auto qsl_p = std::span(lm.query_start_loc).subspan(nd);
    const int bpr = qsl_p.empty() ? 1
                                  : LightningPlan::pick_blocks_per_range(qsl_p.back() - qsl_p.front(), shape.linear_block_size,
                                                                         shape.linear_heads);
    // Prefix caching's "all" mode: the state stores of the prefill rows (the same rows, in the same order, as the
    // Mamba metadata's prefill rows) cut the plan's blocks and ranges.
    const MambaBatchMetadata& mm = batch.meta;
    const bool stores = mm.has_state_stores();
    SSM_CHECK(!stores || mm.num_prefills == lm.num_prefills,
              "lightning plan: {} prefill rows with state stores, {} linear ones", mm.num_prefills, lm.num_prefills);
    const auto nc_p = std::span(lm.num_computed_tokens).subspan(nd);
    lplan = stores ? LightningPlan::build(qsl_p, nc_p, shape.linear_block_size, bpr, mm.state_store_start_p,
                                          mm.state_store_offset_p, mm.state_store_block_p)
                   : LightningPlan::build(qsl_p, nc_p, shape.linear_block_size, bpr);
    blocks = put(lplan.blocks);
    seq_first = put(lplan.seq_first_block);
    qtiles = put(lplan.qtiles);
    ranges = put(lplan.ranges);
    seq_first_range = put(lplan.seq_first_range);
    block_range = put(lplan.block_range);
    if (lplan.has_stores()) block_store = put(lplan.block_store), range_store = put(lplan.range_store);
  }
  if (shape.attention) {
    tables = put(am.block_tables);
    seq_lens = put(am.seq_lens);
    attn_qsl = put(am.query_start_loc);
    slots = put(am.slot_mapping);
    positions = put(am.positions);
    aplan = decode_only ? PagedAttentionPlan::decode(batch.meta.num_reqs, std::max(1, am.max_num_blocks_per_seq * shape.kv_block_size),
                                                     shape.attention_group, shape.attention_fixed_split)
                        : PagedAttentionPlan::build(am.query_start_loc, am.seq_lens, shape.attention_group,
                                                    shape.attention_tc ? kTcMinTokens : 0, shape.attention_fixed_split);
    tasks = put(aplan.tasks);
    items = put(aplan.items);
    tc_tiles = put(aplan.tc_tiles);
    tc_items = put(aplan.tc_items);
    tc_row_key_base = put(aplan.tc_row_key_base);
    tc_stage_rows = put(aplan.tc_stage_rows);
  }
  if (host_.empty()) host_.resize(4);
}

void StepPlans::upload(cudaStream_t s) {
  dev_.get(host_.size() * 4);
  SSM_CUDA_CHECK(cudaMemcpyAsync(dev_.buf.data(), host_.data(), host_.size() * 4, cudaMemcpyHostToDevice, s));
}

LightningPlanDev StepPlans::lightning_prefill(int nd) const {
  return {lplan.num_seqs, lplan.num_blocks, lplan.num_qtiles, dev(blocks), dev(seq_first), dev(qtiles), dev(lin_idx) + nd,
          dev(lin_nc) + nd, lplan.num_ranges, dev(ranges), dev(seq_first_range), dev(block_range),
          lplan.has_stores() ? dev(block_store) : nullptr, lplan.has_stores() ? dev(range_store) : nullptr};
}

}  // namespace ssmserve::cuda
