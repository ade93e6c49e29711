// Owns build_mamba_metadata (see batch_metadata.h): classification, reordering, decode padding, the
// sequence-relative chunk metadata and the 'all'-mode block indices.
#include "model/batch_metadata.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace ssmserve {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

/// vLLM's decode test (treat_short_extends_as_decodes=False, no #42430 exception; see the header): a row that is not
/// prefilling of one token, or a speculative verify row (more tokens, with state columns for them).
bool is_decode(const ScheduledSeq& s) {
  return !s.is_prefilling && (s.num_scheduled_tokens == 1 || !s.spec_state_blocks.empty());
}

/// ceil(a / b) for a >= 0, b >= 1.
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void validate(std::span<const ScheduledSeq> seqs, const MetadataOptions& opt) {
  SSM_CHECK(opt.chunk_size >= 1, "batch metadata: chunk_size must be >= 1 (got {})", opt.chunk_size);
  SSM_CHECK(opt.mamba_block_size >= 0, "batch metadata: mamba_block_size must be >= 0 (got {})", opt.mamba_block_size);
  SSM_CHECK(opt.mamba_block_size % opt.chunk_size == 0,
            "batch metadata: mamba_block_size {} must be a multiple of chunk_size {} (states are captured at chunk ends)",
            opt.mamba_block_size, opt.chunk_size);
  SSM_CHECK(opt.pad_decodes_to >= 0, "batch metadata: pad_decodes_to must be >= 0 (got {})", opt.pad_decodes_to);
  SSM_CHECK(seqs.size() <= static_cast<size_t>(kInt32Max), "batch metadata: {} requests do not fit int32", seqs.size());
  int64_t total = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const ScheduledSeq& s = seqs[i];
    SSM_CHECK(s.state_block >= 1, "batch metadata: request {} has state_block {} (must be >= 1; 0 is the null block)", i,
              s.state_block);
    SSM_CHECK(s.num_computed_tokens >= 0, "batch metadata: request {} has num_computed_tokens {} (must be >= 0)", i,
              s.num_computed_tokens);
    SSM_CHECK(s.num_scheduled_tokens >= 1, "batch metadata: request {} has num_scheduled_tokens {} (must be >= 1)", i,
              s.num_scheduled_tokens);
    SSM_CHECK(!is_decode(s) || s.num_computed_tokens >= 1,
              "batch metadata: request {} is a decode (not prefilling) with num_computed_tokens 0", i);
    SSM_CHECK(!is_decode(s) || s.num_scheduled_tokens == 1 ||
                  static_cast<int64_t>(s.spec_state_blocks.size()) >= s.num_scheduled_tokens - 1,
              "batch metadata: decode request {} schedules {} tokens but has {} speculative state columns (needs {})", i,
              s.num_scheduled_tokens, s.spec_state_blocks.size(), s.num_scheduled_tokens - 1);
    if (is_decode(s))
      for (int j = 0; j + 1 < s.num_scheduled_tokens; ++j)
        SSM_CHECK(s.spec_state_blocks[j] >= 1, "batch metadata: request {} has speculative state column {} in block {} "
                  "(must be >= 1)", i, j + 1, s.spec_state_blocks[j]);
    SSM_CHECK(int64_t{s.num_computed_tokens} + s.num_scheduled_tokens <= kInt32Max,
              "batch metadata: request {} ends at position {} (overflows int32)", i,
              int64_t{s.num_computed_tokens} + s.num_scheduled_tokens);
    int32_t prev = 0;
    for (const StateStore& st : s.state_stores) {
      SSM_CHECK(!is_decode(s), "batch metadata: request {} is a decode row with state stores", i);
      SSM_CHECK(st.offset > prev && st.offset < s.num_scheduled_tokens,
                "batch metadata: request {} stores a state after {} of its {} tokens (offsets must increase within (0, {}))", i,
                st.offset, s.num_scheduled_tokens, s.num_scheduled_tokens);
      SSM_CHECK(st.block >= 1 && st.block != s.state_block,
                "batch metadata: request {} stores a state into block {} (must be >= 1 and not its state block {})", i, st.block,
                s.state_block);
      prev = st.offset;
    }
    total += s.num_scheduled_tokens;
  }
  SSM_CHECK(total + opt.pad_decodes_to <= kInt32Max, "batch metadata: {} scheduled tokens overflow int32", total);
}

/// Appends sequence-relative chunks for one prefill row (§2.3): computed c, new n, starting at prefill-token
/// offset `start`; records the row's last chunk.
void append_chunks(int32_t row, int32_t c, int32_t n, int32_t start, int32_t cs, MambaBatchMetadata& m) {
  int32_t pos = start;
  const int32_t end = start + n;
  // 1. Finish the partly filled chunk, if the sequence stopped mid-chunk last step.
  if (c % cs != 0) {
    pos += std::min(cs - c % cs, n);
    m.cu_chunk_seqlen_p.push_back(start);
    m.seq_idx_p.push_back(row);
  }
  // 2. Full chunks from there (the last may be shorter).
  for (; pos < end; pos += std::min(cs, end - pos)) {
    m.cu_chunk_seqlen_p.push_back(pos);
    m.seq_idx_p.push_back(row);
  }
  // 3. This row's last chunk.
  m.last_chunk_indices_p.push_back(m.num_chunks() - 1);
}

}  // namespace

void build_mamba_metadata(std::span<const ScheduledSeq> seqs, const MetadataOptions& opt, MambaBatchMetadata& m) {
  validate(seqs, opt);
  const int32_t cs = opt.chunk_size, bs = opt.mamba_block_size;

  // 1. Classify and reorder: decodes first, stable within each class.
  m.order.clear();
  for (size_t i = 0; i < seqs.size(); ++i)
    if (is_decode(seqs[i])) m.order.push_back(static_cast<int32_t>(i));
  m.num_decodes = static_cast<int>(m.order.size());
  m.num_prefills = static_cast<int>(seqs.size()) - m.num_decodes;
  m.num_prefill_tokens = 0;
  size_t max_chunks = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    if (!is_decode(seqs[i])) {
      m.order.push_back(static_cast<int32_t>(i));
      m.num_prefill_tokens += seqs[i].num_scheduled_tokens;
      max_chunks += static_cast<size_t>(cdiv(seqs[i].num_scheduled_tokens, cs)) + 1;
    }
  m.num_decode_tokens = 0;
  m.spec_cols = 1;
  for (int r = 0; r < m.num_decodes; ++r) {
    m.num_decode_tokens += seqs[m.order[r]].num_scheduled_tokens;
    m.spec_cols = std::max(m.spec_cols, seqs[m.order[r]].num_scheduled_tokens);
  }

  // 2. Decode CUDA-graph padding: decode-only batches of 1..pad_decodes_to one-token rows grow to pad_decodes_to.
  const bool pad = m.num_prefills == 0 && m.num_decodes >= 1 && m.num_decodes <= opt.pad_decodes_to && m.spec_cols == 1;
  m.num_padded_decodes = pad ? opt.pad_decodes_to - m.num_decodes : 0;
  m.num_reqs = m.num_decodes + m.num_padded_decodes + m.num_prefills;
  const int D = m.num_decode_rows();

  // 3. Decode part: one token per row (padded rows included: null block), or 1 + drafts per verify row, each token
  //    with its state column (spec_cols > 1).
  m.query_start_loc.clear();
  m.query_start_loc.reserve(m.num_reqs + 1);
  m.query_start_loc_d.clear();
  m.query_start_loc_d.reserve(D + 1);
  m.state_indices_tensor_d.clear();
  m.state_indices_tensor_d.reserve(D);
  m.state_indices_spec_d.clear();
  if (m.spec_cols > 1) m.state_indices_spec_d.assign(static_cast<size_t>(D) * m.spec_cols, 0);
  int32_t tok = 0;
  for (int r = 0; r <= D; ++r) {
    m.query_start_loc.push_back(tok);
    m.query_start_loc_d.push_back(tok);
    if (r == D) break;
    tok += r < m.num_decodes ? seqs[m.order[r]].num_scheduled_tokens : 1;
  }
  for (int r = 0; r < m.num_decodes; ++r) {
    const ScheduledSeq& s = seqs[m.order[r]];
    m.state_indices_tensor_d.push_back(s.state_block);
    if (m.spec_cols == 1) continue;
    m.state_indices_spec_d[static_cast<size_t>(r) * m.spec_cols] = s.state_block;
    for (int j = 1; j < s.num_scheduled_tokens; ++j)
      m.state_indices_spec_d[static_cast<size_t>(r) * m.spec_cols + j] = s.spec_state_blocks[j - 1];
  }
  m.state_indices_tensor_d.resize(D, 0);
  m.num_accepted_tokens.assign(D, 1);

  // 4. Prefill part and its sequence-relative chunks (§2.3).
  m.chunk_size = cs;
  m.query_start_loc_p.clear();
  m.has_initial_states_p.clear();
  m.num_computed_tokens_p.clear();
  m.state_indices_tensor_p.clear();
  m.cu_chunk_seqlen_p.clear();
  m.seq_idx_p.clear();
  m.last_chunk_indices_p.clear();
  m.query_start_loc_p.reserve(m.num_prefills + 1);
  m.has_initial_states_p.reserve(m.num_prefills);
  m.num_computed_tokens_p.reserve(m.num_prefills);
  m.state_indices_tensor_p.reserve(m.num_prefills);
  m.last_chunk_indices_p.reserve(m.num_prefills);
  m.cu_chunk_seqlen_p.reserve(max_chunks + 1);
  m.seq_idx_p.reserve(max_chunks);
  m.prep_initial_states = false;
  if (m.num_prefills > 0) m.query_start_loc_p.push_back(0);
  int32_t start = 0;  // prefill-token offset of the current row
  for (int p = 0; p < m.num_prefills; ++p) {
    const ScheduledSeq& s = seqs[m.order[m.num_decodes + p]];
    append_chunks(p, s.num_computed_tokens, s.num_scheduled_tokens, start, cs, m);
    start += s.num_scheduled_tokens;
    m.query_start_loc_p.push_back(start);
    m.query_start_loc.push_back(m.num_decode_tokens + start);
    m.has_initial_states_p.push_back(s.num_computed_tokens > 0 ? 1 : 0);
    m.prep_initial_states |= s.num_computed_tokens > 0;
    m.num_computed_tokens_p.push_back(s.num_computed_tokens);
    m.state_indices_tensor_p.push_back(s.state_block);
  }
  if (m.num_prefills > 0) m.cu_chunk_seqlen_p.push_back(m.num_prefill_tokens);

  // 4b. "all"-mode state stores (CSR over the prefill rows), empty when no row stores.
  m.state_store_start_p.clear();
  m.state_store_offset_p.clear();
  m.state_store_block_p.clear();
  bool stores = false;
  for (int p = 0; p < m.num_prefills; ++p) stores |= !seqs[m.order[m.num_decodes + p]].state_stores.empty();
  if (stores) {
    m.state_store_start_p.push_back(0);
    for (int p = 0; p < m.num_prefills; ++p) {
      for (const StateStore& st : seqs[m.order[m.num_decodes + p]].state_stores) {
        m.state_store_offset_p.push_back(st.offset);
        m.state_store_block_p.push_back(st.block);
      }
      m.state_store_start_p.push_back(static_cast<int32_t>(m.state_store_offset_p.size()));
    }
  }

  // 5. 'all'-mode block indices (§2.2 formulas), over all rows; padded rows 0.
  m.block_idx_last_computed_token.clear();
  m.block_idx_first_scheduled_token_p.clear();
  m.block_idx_last_scheduled_token.clear();
  if (bs == 0) return;
  m.block_idx_last_computed_token.reserve(m.num_reqs);
  m.block_idx_last_scheduled_token.reserve(m.num_reqs);
  m.block_idx_first_scheduled_token_p.reserve(m.num_prefills);
  auto push_row = [&](const ScheduledSeq& s) {
    const int64_t c = s.num_computed_tokens, seq_len = c + s.num_scheduled_tokens;
    m.block_idx_last_computed_token.push_back(static_cast<int32_t>(std::max<int64_t>(cdiv(c, bs) - 1, 0)));
    m.block_idx_last_scheduled_token.push_back(static_cast<int32_t>(std::max<int64_t>(cdiv(seq_len, bs) - 1, 0)));
  };
  for (int r = 0; r < m.num_decodes; ++r) push_row(seqs[m.order[r]]);
  m.block_idx_last_computed_token.resize(D, 0);
  m.block_idx_last_scheduled_token.resize(D, 0);
  for (int p = 0; p < m.num_prefills; ++p) {
    const ScheduledSeq& s = seqs[m.order[m.num_decodes + p]];
    push_row(s);
    m.block_idx_first_scheduled_token_p.push_back(static_cast<int32_t>(cdiv(int64_t{s.num_computed_tokens} + 1, bs) - 1));
  }
}

DecodeRows MambaBatchMetadata::decode_rows() const {
  if (spec_cols == 1) return DecodeRows(state_indices_tensor_d);
  return DecodeRows(state_indices_spec_d, spec_cols, query_start_loc_d);
}

MambaBatchMetadata build_mamba_metadata(std::span<const ScheduledSeq> seqs, const MetadataOptions& opt) {
  MambaBatchMetadata m;
  build_mamba_metadata(seqs, opt, m);
  return m;
}

}  // namespace ssmserve
