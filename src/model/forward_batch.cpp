// Owns ForwardBatch packing and validation.
#include "model/forward_batch.h"

#include "core/error.h"

namespace ssmserve {

ForwardBatch make_forward_batch(std::span<const ScheduledSeq> seqs, std::span<const std::vector<int32_t>> tokens,
                                const MetadataOptions& opt) {
  SSM_CHECK(seqs.size() == tokens.size(), "make_forward_batch: {} sequences but {} token lists", seqs.size(), tokens.size());
  ForwardBatch b;
  b.meta = build_mamba_metadata(seqs, opt);
  const MambaBatchMetadata& m = b.meta;
  b.input_ids.reserve(static_cast<size_t>(m.query_start_loc.back()));
  b.seq_first_token.assign(seqs.size(), -1);
  auto append = [&](int32_t seq) {
    SSM_CHECK(static_cast<int32_t>(tokens[seq].size()) == seqs[seq].num_scheduled_tokens,
              "make_forward_batch: sequence {} schedules {} tokens but {} were given", seq, seqs[seq].num_scheduled_tokens,
              tokens[seq].size());
    b.seq_first_token[seq] = b.num_tokens();
    b.input_ids.insert(b.input_ids.end(), tokens[seq].begin(), tokens[seq].end());
  };
  // 1. Real decode rows, 2. padded decode rows (token 0, null block), 3. prefill rows.
  for (int r = 0; r < m.num_decodes; ++r) append(m.order[r]);
  b.input_ids.insert(b.input_ids.end(), m.num_padded_decodes, 0);
  for (int r = 0; r < m.num_prefills; ++r) append(m.order[m.num_decodes + r]);
  return b;
}

void ForwardBatch::validate() const {
  SSM_CHECK(!meta.query_start_loc.empty() && meta.query_start_loc.back() == num_tokens(),
            "ForwardBatch: metadata covers {} tokens but the batch has {}",
            meta.query_start_loc.empty() ? 0 : meta.query_start_loc.back(), num_tokens());
  SSM_CHECK(static_cast<int>(meta.state_indices_tensor_d.size()) == meta.num_decode_rows() &&
                static_cast<int>(meta.state_indices_tensor_p.size()) == meta.num_prefills &&
                static_cast<int>(meta.has_initial_states_p.size()) == meta.num_prefills,
            "ForwardBatch: inconsistent metadata sizes");
  SSM_CHECK(prefill_token_offset() == meta.num_decode_tokens + meta.num_padded_decodes,
            "ForwardBatch: the decode rows hold {} tokens but the metadata says {}", prefill_token_offset(),
            meta.num_decode_tokens + meta.num_padded_decodes);
  SSM_CHECK(meta.spec_cols == 1 || static_cast<int>(meta.state_indices_spec_d.size()) == meta.num_decode_rows() * meta.spec_cols,
            "ForwardBatch: inconsistent speculative state columns");
  for (int32_t i : logits_indices)
    SSM_CHECK(i >= 0 && i < num_tokens(), "ForwardBatch: logits index {} out of range", i);
}

}  // namespace ssmserve
