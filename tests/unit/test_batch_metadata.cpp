// Tests build_mamba_metadata: the §2.3 worked example (chunks and 'all'-mode block indices), decode/prefill
// classification and stable reordering, decode CUDA-graph padding, input validation, and randomized
// properties of the sequence-relative chunk metadata (incl. invariance to how a prompt is cut into steps).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "model/batch_metadata.h"

namespace ssmserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ScheduledSeq prefill(int32_t block, int32_t c, int32_t n) { return {block, c, n, true}; }
ScheduledSeq decode(int32_t block, int32_t c) { return {block, c, 1, false}; }

MambaBatchMetadata build(const std::vector<ScheduledSeq>& seqs, MetadataOptions opt = {}) {
  return build_mamba_metadata(seqs, opt);
}

/// Checks every structural invariant of `m` against its input; returns nothing, records gtest failures.
void check_invariants(const std::vector<ScheduledSeq>& seqs, const MetadataOptions& opt, const MambaBatchMetadata& m) {
  const int n = static_cast<int>(seqs.size()), cs = opt.chunk_size;
  const int P = m.num_prefills, D = m.num_decode_rows();
  // Totals and classification.
  ASSERT_EQ(m.num_decodes + m.num_prefills, n);
  ASSERT_EQ(m.num_reqs, m.num_decodes + m.num_padded_decodes + m.num_prefills);
  ASSERT_EQ(m.num_decode_tokens, m.num_decodes);
  ASSERT_TRUE(m.num_padded_decodes == 0 || m.num_prefills == 0);
  ASSERT_EQ(static_cast<int>(m.order.size()), n);
  std::vector<int> seen(n, 0);
  int total_tokens = 0;
  for (int r = 0; r < n; ++r) {
    const ScheduledSeq& s = seqs[m.order[r]];
    ++seen[m.order[r]];
    const bool dec = !s.is_prefilling && s.num_scheduled_tokens == 1;
    EXPECT_EQ(dec, r < m.num_decodes) << "row " << r;
    if (r > 0 && (r < m.num_decodes) == (r - 1 < m.num_decodes)) {
      EXPECT_LT(m.order[r - 1], m.order[r]) << "stable order";
    }
    total_tokens += s.num_scheduled_tokens;
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1);
  EXPECT_EQ(m.num_decode_tokens + m.num_prefill_tokens, total_tokens);
  // query_start_loc over the reordered batch, padded rows 1 token each.
  ASSERT_EQ(static_cast<int>(m.query_start_loc.size()), m.num_reqs + 1);
  EXPECT_EQ(m.query_start_loc[0], 0);
  for (int r = 0; r < D; ++r) EXPECT_EQ(m.query_start_loc[r + 1] - m.query_start_loc[r], 1);
  for (int p = 0; p < P; ++p)
    EXPECT_EQ(m.query_start_loc[D + p + 1] - m.query_start_loc[D + p], seqs[m.order[m.num_decodes + p]].num_scheduled_tokens);
  EXPECT_EQ(m.query_start_loc.back(), total_tokens + m.num_padded_decodes);
  // Decode part.
  ASSERT_EQ(static_cast<int>(m.query_start_loc_d.size()), D + 1);
  for (int r = 0; r <= D; ++r) EXPECT_EQ(m.query_start_loc_d[r], r);
  ASSERT_EQ(static_cast<int>(m.state_indices_tensor_d.size()), D);
  ASSERT_EQ(static_cast<int>(m.num_accepted_tokens.size()), D);
  for (int r = 0; r < D; ++r) {
    EXPECT_EQ(m.state_indices_tensor_d[r], r < m.num_decodes ? seqs[m.order[r]].state_block : 0);
    EXPECT_EQ(m.num_accepted_tokens[r], 1);
  }
  // Prefill part: query_start_loc_p == tail of query_start_loc minus num_decode_tokens.
  ASSERT_EQ(static_cast<int>(m.query_start_loc_p.size()), P == 0 ? 0 : P + 1);
  for (int p = 0; p <= P && P > 0; ++p) EXPECT_EQ(m.query_start_loc_p[p], m.query_start_loc[D + p] - m.num_decode_tokens);
  ASSERT_EQ(static_cast<int>(m.has_initial_states_p.size()), P);
  ASSERT_EQ(static_cast<int>(m.num_computed_tokens_p.size()), P);
  ASSERT_EQ(static_cast<int>(m.state_indices_tensor_p.size()), P);
  bool any_init = false;
  for (int p = 0; p < P; ++p) {
    const ScheduledSeq& s = seqs[m.order[m.num_decodes + p]];
    EXPECT_EQ(m.has_initial_states_p[p], s.num_computed_tokens > 0 ? 1 : 0);
    EXPECT_EQ(m.num_computed_tokens_p[p], s.num_computed_tokens);
    EXPECT_EQ(m.state_indices_tensor_p[p], s.state_block);
    any_init |= s.num_computed_tokens > 0;
  }
  EXPECT_EQ(m.prep_initial_states, any_init);
  // Chunks: never cross a sequence, each sequence's boundaries are exactly its step start and end plus the
  // multiples of chunk_size strictly inside (in sequence coordinates), lengths in [1, chunk_size].
  EXPECT_EQ(m.chunk_size, cs);
  const int nch = m.num_chunks();
  ASSERT_EQ(static_cast<int>(m.cu_chunk_seqlen_p.size()), P == 0 ? 0 : nch + 1);
  ASSERT_EQ(static_cast<int>(m.last_chunk_indices_p.size()), P);
  if (P == 0) return;
  EXPECT_EQ(m.cu_chunk_seqlen_p[0], 0);
  EXPECT_EQ(m.cu_chunk_seqlen_p.back(), m.num_prefill_tokens);
  for (int k = 0; k < nch; ++k) {
    const int len = m.cu_chunk_seqlen_p[k + 1] - m.cu_chunk_seqlen_p[k];
    EXPECT_GE(len, 1);
    EXPECT_LE(len, cs);
    if (k > 0) {
      EXPECT_LE(m.seq_idx_p[k - 1], m.seq_idx_p[k]);
    }
    const int p = m.seq_idx_p[k];
    ASSERT_TRUE(p >= 0 && p < P);
    EXPECT_GE(m.cu_chunk_seqlen_p[k], m.query_start_loc_p[p]) << "chunk " << k << " crosses into sequence " << p;
    EXPECT_LE(m.cu_chunk_seqlen_p[k + 1], m.query_start_loc_p[p + 1]) << "chunk " << k << " crosses out of sequence " << p;
  }
  for (int p = 0; p < P; ++p) {
    const int c = m.num_computed_tokens_p[p], q0 = m.query_start_loc_p[p], q1 = m.query_start_loc_p[p + 1];
    const int last = m.last_chunk_indices_p[p];
    const int first = p == 0 ? 0 : m.last_chunk_indices_p[p - 1] + 1;
    ASSERT_TRUE(first <= last && last < nch);
    EXPECT_EQ(m.seq_idx_p[last], p);
    EXPECT_EQ(m.cu_chunk_seqlen_p[first], q0);
    EXPECT_EQ(m.cu_chunk_seqlen_p[last + 1], q1);
    std::vector<int> got, want{c};
    for (int k = first; k <= last + 1; ++k) got.push_back(c + m.cu_chunk_seqlen_p[k] - q0);
    for (int b = (c / cs + 1) * cs; b < c + (q1 - q0); b += cs) want.push_back(b);
    want.push_back(c + (q1 - q0));
    EXPECT_EQ(got, want) << "sequence-relative boundaries of prefill row " << p;
  }
  // 'all'-mode block indices.
  if (opt.mamba_block_size == 0) {
    EXPECT_THAT(m.block_idx_last_computed_token, IsEmpty());
    EXPECT_THAT(m.block_idx_first_scheduled_token_p, IsEmpty());
    EXPECT_THAT(m.block_idx_last_scheduled_token, IsEmpty());
    return;
  }
  const int bs = opt.mamba_block_size;
  ASSERT_EQ(static_cast<int>(m.block_idx_last_computed_token.size()), m.num_reqs);
  ASSERT_EQ(static_cast<int>(m.block_idx_last_scheduled_token.size()), m.num_reqs);
  ASSERT_EQ(static_cast<int>(m.block_idx_first_scheduled_token_p.size()), P);
  for (int r = 0; r < D; ++r) {
    const int c = r < m.num_decodes ? seqs[m.order[r]].num_computed_tokens : -1;  // -1: padded row
    EXPECT_EQ(m.block_idx_last_computed_token[r], c < 0 ? 0 : (c - 1) / bs);
    EXPECT_EQ(m.block_idx_last_scheduled_token[r], c < 0 ? 0 : c / bs);
  }
  for (int p = 0; p < P; ++p) {
    const int c = m.num_computed_tokens_p[p], end = c + m.query_start_loc_p[p + 1] - m.query_start_loc_p[p];
    EXPECT_EQ(m.block_idx_first_scheduled_token_p[p], c / bs) << "block of position c (0-based)";
    EXPECT_EQ(m.block_idx_last_scheduled_token[D + p], (end - 1) / bs) << "block of the last scheduled position";
    EXPECT_EQ(m.block_idx_last_computed_token[D + p], c == 0 ? 0 : (c - 1) / bs);
  }
}

TEST(BatchMetadata, WorkedExampleSection2_3) {
  const std::vector<ScheduledSeq> seqs{prefill(3, 0, 20), prefill(5, 5, 10), prefill(7, 16, 3)};
  MetadataOptions opt;
  opt.chunk_size = 8;
  opt.mamba_block_size = 8;
  const auto m = build(seqs, opt);
  EXPECT_EQ(m.num_prefills, 3);
  EXPECT_EQ(m.num_prefill_tokens, 33);
  EXPECT_EQ(m.num_decodes, 0);
  EXPECT_EQ(m.num_reqs, 3);
  EXPECT_THAT(m.query_start_loc, ElementsAre(0, 20, 30, 33));
  EXPECT_THAT(m.query_start_loc_p, ElementsAre(0, 20, 30, 33));
  EXPECT_THAT(m.query_start_loc_d, ElementsAre(0));
  EXPECT_THAT(m.cu_chunk_seqlen_p, ElementsAre(0, 8, 16, 20, 23, 30, 33));
  EXPECT_THAT(m.seq_idx_p, ElementsAre(0, 0, 0, 1, 1, 2));
  EXPECT_THAT(m.last_chunk_indices_p, ElementsAre(2, 4, 5));
  EXPECT_THAT(m.has_initial_states_p, ElementsAre(0, 1, 1));
  EXPECT_TRUE(m.prep_initial_states);
  EXPECT_THAT(m.num_computed_tokens_p, ElementsAre(0, 5, 16));
  EXPECT_THAT(m.state_indices_tensor_p, ElementsAre(3, 5, 7));
  EXPECT_THAT(m.block_idx_last_computed_token, ElementsAre(0, 0, 1));
  EXPECT_THAT(m.block_idx_first_scheduled_token_p, ElementsAre(0, 0, 2));
  EXPECT_THAT(m.block_idx_last_scheduled_token, ElementsAre(2, 1, 2));
  check_invariants(seqs, opt, m);
}

TEST(BatchMetadata, EmptyBatch) {
  MetadataOptions opt;
  opt.pad_decodes_to = 8;  // nothing to pad: an empty step runs nothing
  const auto m = build({}, opt);
  EXPECT_EQ(m.num_reqs, 0);
  EXPECT_EQ(m.num_padded_decodes, 0);
  EXPECT_THAT(m.query_start_loc, ElementsAre(0));
  EXPECT_THAT(m.query_start_loc_p, IsEmpty());
  EXPECT_THAT(m.cu_chunk_seqlen_p, IsEmpty());
  check_invariants({}, opt, m);
}

TEST(BatchMetadata, MixedBatchPutsDecodesFirstStably) {
  // Input order: P(b1) D(b2) P(b3) D(b4) D(b5) P(b6).
  const std::vector<ScheduledSeq> seqs{prefill(1, 0, 5), decode(2, 9), prefill(3, 4, 6), decode(4, 3), decode(5, 30),
                                       prefill(6, 0, 2)};
  MetadataOptions opt;
  opt.chunk_size = 4;
  opt.mamba_block_size = 4;
  const auto m = build(seqs, opt);
  EXPECT_THAT(m.order, ElementsAre(1, 3, 4, 0, 2, 5));
  EXPECT_EQ(m.num_decodes, 3);
  EXPECT_EQ(m.num_decode_tokens, 3);
  EXPECT_EQ(m.num_prefills, 3);
  EXPECT_EQ(m.num_prefill_tokens, 13);
  EXPECT_THAT(m.query_start_loc, ElementsAre(0, 1, 2, 3, 8, 14, 16));
  EXPECT_THAT(m.query_start_loc_p, ElementsAre(0, 5, 11, 13));
  EXPECT_THAT(m.query_start_loc_d, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(m.state_indices_tensor_d, ElementsAre(2, 4, 5));
  EXPECT_THAT(m.state_indices_tensor_p, ElementsAre(1, 3, 6));
  EXPECT_THAT(m.num_accepted_tokens, ElementsAre(1, 1, 1));
  // b1: c=0 n=5 -> [0,4) [4,5); b3: c=4 n=6 -> [5,9) [9,11); b6: c=0 n=2 -> [11,13).
  EXPECT_THAT(m.cu_chunk_seqlen_p, ElementsAre(0, 4, 5, 9, 11, 13));
  EXPECT_THAT(m.seq_idx_p, ElementsAre(0, 0, 1, 1, 2));
  EXPECT_THAT(m.last_chunk_indices_p, ElementsAre(1, 3, 4));
  // Decode rows: c=9 -> last computed cdiv(9,4)-1 = 2, last scheduled cdiv(10,4)-1 = 2; c=3 -> 0, 0; c=30 -> 7, 7.
  EXPECT_THAT(m.block_idx_last_computed_token, ElementsAre(2, 0, 7, 0, 0, 0));
  EXPECT_THAT(m.block_idx_last_scheduled_token, ElementsAre(2, 0, 7, 1, 2, 0));
  EXPECT_THAT(m.block_idx_first_scheduled_token_p, ElementsAre(0, 1, 0));
  check_invariants(seqs, opt, m);
}

TEST(BatchMetadata, OneTokenLastPrefillChunkStaysPrefill) {
  // The prompt's last token arrives alone while others decode: still prefilling, so a prefill row (no #42430
  // reclassification), continuing from its state mid-chunk.
  const std::vector<ScheduledSeq> seqs{decode(1, 40), prefill(2, 17, 1), decode(3, 7), prefill(4, 0, 1)};
  MetadataOptions opt;
  opt.chunk_size = 8;
  opt.pad_decodes_to = 4;  // has prefills -> never padded
  const auto m = build(seqs, opt);
  EXPECT_EQ(m.num_decodes, 2);
  EXPECT_EQ(m.num_prefills, 2);
  EXPECT_EQ(m.num_padded_decodes, 0);
  EXPECT_THAT(m.order, ElementsAre(0, 2, 1, 3));
  EXPECT_THAT(m.query_start_loc, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(m.query_start_loc_p, ElementsAre(0, 1, 2));
  EXPECT_THAT(m.has_initial_states_p, ElementsAre(1, 0));
  EXPECT_THAT(m.state_indices_tensor_p, ElementsAre(2, 4));
  EXPECT_THAT(m.cu_chunk_seqlen_p, ElementsAre(0, 1, 2));
  EXPECT_THAT(m.seq_idx_p, ElementsAre(0, 1));
  EXPECT_THAT(m.last_chunk_indices_p, ElementsAre(0, 1));
  check_invariants(seqs, opt, m);
}

TEST(BatchMetadata, NotPrefillingMultiTokenRowIsPrefill) {
  // E.g. recomputing prompt + outputs after preemption: past the prompt but several tokens -> prefill.
  const std::vector<ScheduledSeq> seqs{{9, 12, 5, false}, decode(2, 3)};
  const auto m = build(seqs);
  EXPECT_THAT(m.order, ElementsAre(1, 0));
  EXPECT_EQ(m.num_prefills, 1);
  EXPECT_THAT(m.has_initial_states_p, ElementsAre(1));
  check_invariants(seqs, {}, m);
}

TEST(BatchMetadata, VerifyRowsAreDecodesWithAStateColumnPerToken) {
  // Speculative decoding (§6.1): a decode of 1 + 3 tokens with 3 state columns, a plain decode, a verify row of 1 + 1,
  // and a prefill. Decodes come first with their tokens contiguous; column 0 is the state block.
  const std::vector<int32_t> cols_a = {21, 22, 23}, cols_c = {31};
  std::vector<ScheduledSeq> seqs{{5, 40, 4, false}, decode(2, 7), {6, 9, 2, false}, {8, 0, 3, true}};
  seqs[0].spec_state_blocks = cols_a;
  seqs[2].spec_state_blocks = cols_c;
  const auto m = build(seqs);
  EXPECT_THAT(m.order, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(m.num_decodes, 3);
  EXPECT_EQ(m.num_decode_tokens, 7);
  EXPECT_EQ(m.spec_cols, 4);
  EXPECT_THAT(m.query_start_loc_d, ElementsAre(0, 4, 5, 7));
  EXPECT_THAT(m.query_start_loc, ElementsAre(0, 4, 5, 7, 10));
  EXPECT_THAT(m.state_indices_tensor_d, ElementsAre(5, 2, 6));
  EXPECT_THAT(m.state_indices_spec_d, ElementsAre(5, 21, 22, 23, 2, 0, 0, 0, 6, 31, 0, 0));
  const DecodeRows rows = m.decode_rows();
  ASSERT_EQ(rows.num_rows(), 3);
  EXPECT_EQ(rows.num_tokens(), 7);
  EXPECT_EQ(rows.num_tokens(0), 4);
  EXPECT_EQ(rows.token_row(0, 3), 3);
  EXPECT_EQ(rows.token_row(2, 1), 6);
  EXPECT_EQ(rows.src_block(0, 0), 5);  // token 0 updates column 0 in place
  EXPECT_EQ(rows.dst_block(0, 0), 5);
  EXPECT_EQ(rows.src_block(0, 2), 21);  // token 2 reads column 1, writes column 2
  EXPECT_EQ(rows.dst_block(0, 2), 22);
  // No padding with verify rows (they run eagerly).
  MetadataOptions opt;
  opt.pad_decodes_to = 8;
  EXPECT_EQ(build_mamba_metadata(std::vector<ScheduledSeq>(seqs.begin(), seqs.begin() + 3), opt).num_padded_decodes, 0);
  // Too few state columns for the tokens: an error naming the request.
  std::vector<ScheduledSeq> bad{{5, 40, 4, false}};
  bad[0].spec_state_blocks = cols_c;
  EXPECT_THROW(build(bad), Error);
}

TEST(BatchMetadata, PadsDecodeOnlyBatchWithNullBlockRows) {
  const std::vector<ScheduledSeq> seqs{decode(4, 10), decode(6, 16), decode(2, 1)};
  MetadataOptions opt;
  opt.chunk_size = 8;
  opt.mamba_block_size = 8;
  opt.pad_decodes_to = 8;
  const auto m = build(seqs, opt);
  EXPECT_EQ(m.num_decodes, 3);
  EXPECT_EQ(m.num_decode_tokens, 3);  // real tokens only
  EXPECT_EQ(m.num_padded_decodes, 5);
  EXPECT_EQ(m.num_decode_rows(), 8);
  EXPECT_EQ(m.num_reqs, 8);
  EXPECT_THAT(m.order, ElementsAre(0, 1, 2));
  // Padded rows own one dummy token each: the kernels see 8 uniform rows / 8 tokens.
  EXPECT_THAT(m.query_start_loc, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8));
  EXPECT_THAT(m.query_start_loc_d, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8));
  EXPECT_THAT(m.state_indices_tensor_d, ElementsAre(4, 6, 2, 0, 0, 0, 0, 0));
  EXPECT_THAT(m.num_accepted_tokens, ElementsAre(1, 1, 1, 1, 1, 1, 1, 1));
  EXPECT_THAT(m.block_idx_last_computed_token, ElementsAre(1, 1, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(m.block_idx_last_scheduled_token, ElementsAre(1, 2, 0, 0, 0, 0, 0, 0));
  EXPECT_THAT(m.query_start_loc_p, IsEmpty());
  EXPECT_THAT(m.cu_chunk_seqlen_p, IsEmpty());
  check_invariants(seqs, opt, m);
}

TEST(BatchMetadata, PaddingOnlyForDecodeOnlyBatchesWithinCaptureSize) {
  MetadataOptions opt;
  opt.pad_decodes_to = 2;
  EXPECT_EQ(build({decode(1, 5), decode(2, 5)}, opt).num_padded_decodes, 0);                  // already 2 rows
  EXPECT_EQ(build({decode(1, 5), decode(2, 5), decode(3, 5)}, opt).num_padded_decodes, 0);    // too big: eager
  EXPECT_EQ(build({decode(1, 5), prefill(2, 0, 3)}, opt).num_padded_decodes, 0);              // mixed: eager
  EXPECT_EQ(build({decode(1, 5)}, opt).num_padded_decodes, 1);
  opt.pad_decodes_to = 0;
  EXPECT_EQ(build({decode(1, 5)}, opt).num_padded_decodes, 0);
}

TEST(BatchMetadata, RejectsInvalidInput) {
  auto msg = [](const std::vector<ScheduledSeq>& seqs, MetadataOptions opt = {}) -> std::string {
    try {
      build_mamba_metadata(seqs, opt);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(msg({prefill(1, 0, 3), prefill(0, 0, 3)}), HasSubstr("request 1 has state_block 0"));
  EXPECT_THAT(msg({prefill(-2, 0, 3)}), HasSubstr("state_block -2"));
  EXPECT_THAT(msg({prefill(1, -1, 3)}), HasSubstr("num_computed_tokens -1"));
  EXPECT_THAT(msg({prefill(1, 0, 0)}), HasSubstr("num_scheduled_tokens 0"));
  EXPECT_THAT(msg({decode(1, 0)}), HasSubstr("is a decode"));
  EXPECT_THAT(msg({prefill(1, 2147483600, 100)}), HasSubstr("overflows int32"));
  MetadataOptions opt;
  opt.chunk_size = 0;
  EXPECT_THAT(msg({}, opt), HasSubstr("chunk_size must be >= 1"));
  opt.chunk_size = 8;
  opt.mamba_block_size = 12;
  EXPECT_THAT(msg({}, opt), HasSubstr("must be a multiple of chunk_size"));
  opt.mamba_block_size = -8;
  EXPECT_THAT(msg({}, opt), HasSubstr("mamba_block_size must be >= 0"));
  opt.mamba_block_size = 0;
  opt.pad_decodes_to = -1;
  EXPECT_THAT(msg({}, opt), HasSubstr("pad_decodes_to must be >= 0"));
}

/// A random batch: up to 12 requests, mixed decodes / prefills (incl. 1-token and mid-chunk continuations).
std::vector<ScheduledSeq> random_batch(std::mt19937& rng) {
  std::uniform_int_distribution<int> nreq(0, 12), kind(0, 5), small(0, 40), big(0, 600), tok(1, 70);
  std::vector<ScheduledSeq> seqs(nreq(rng));
  int32_t block = 1;
  for (auto& s : seqs) {
    s.state_block = block++;
    switch (kind(rng)) {
      case 0: case 1: s = decode(s.state_block, 1 + big(rng)); break;               // decode
      case 2: s = prefill(s.state_block, 0, tok(rng)); break;                        // fresh prompt
      case 3: s = prefill(s.state_block, small(rng) + big(rng), 1); break;           // 1-token prefill chunk
      case 4: s = {s.state_block, 1 + big(rng), tok(rng), false}; break;             // non-prefilling extend
      default: s = prefill(s.state_block, big(rng), tok(rng)); break;                // continuation
    }
  }
  return seqs;
}

TEST(BatchMetadata, RandomBatchesSatisfyInvariants) {
  std::mt19937 rng(1234);
  const int chunk_sizes[] = {1, 2, 3, 8, 16, 64};
  MambaBatchMetadata reused;  // also checks that refilling one object matches a fresh build
  for (int it = 0; it < 5000; ++it) {
    const auto seqs = random_batch(rng);
    MetadataOptions opt;
    opt.chunk_size = chunk_sizes[rng() % 6];
    opt.mamba_block_size = opt.chunk_size * static_cast<int>(rng() % 4);  // 0 (off) or a multiple
    opt.pad_decodes_to = static_cast<int>(rng() % 3) == 0 ? 0 : static_cast<int>(rng() % 16);
    const auto m = build_mamba_metadata(seqs, opt);
    SCOPED_TRACE("iteration " + std::to_string(it));
    check_invariants(seqs, opt, m);
    if (m.num_prefills == 0 && m.num_decodes >= 1 && m.num_decodes <= opt.pad_decodes_to)
      EXPECT_EQ(m.num_decode_rows(), opt.pad_decodes_to);
    else
      EXPECT_EQ(m.num_padded_decodes, 0);
    build_mamba_metadata(seqs, opt, reused);
    EXPECT_EQ(reused.query_start_loc, m.query_start_loc);
    EXPECT_EQ(reused.cu_chunk_seqlen_p, m.cu_chunk_seqlen_p);
    EXPECT_EQ(reused.seq_idx_p, m.seq_idx_p);
    EXPECT_EQ(reused.state_indices_tensor_d, m.state_indices_tensor_d);
    EXPECT_EQ(reused.block_idx_last_scheduled_token, m.block_idx_last_scheduled_token);
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(BatchMetadata, ChunkBoundariesIndependentOfStepCuts) {
  // One long prompt of length L cut at random step ends, each step batched with random other requests: the
  // union of its chunk boundaries (sequence coordinates) is exactly {multiples of cs} U {step ends} U {0, L}.
  std::mt19937 rng(99);
  for (int it = 0; it < 1000; ++it) {
    const int cs = 1 + static_cast<int>(rng() % 40), L = 1 + static_cast<int>(rng() % 500);
    std::set<int> want{0, L}, got;
    for (int b = cs; b < L; b += cs) want.insert(b);
    int c = 0;
    while (c < L) {
      const int n = 1 + static_cast<int>(rng() % std::min(L - c, 3 * cs + 5));
      auto seqs = random_batch(rng);
      const int pos = seqs.empty() ? 0 : static_cast<int>(rng() % (seqs.size() + 1));
      seqs.insert(seqs.begin() + pos, prefill(1000, c, n));
      MetadataOptions opt;
      opt.chunk_size = cs;
      const auto m = build_mamba_metadata(seqs, opt);
      int p = -1;  // our prefill row
      for (int r = m.num_decodes; r < m.num_reqs; ++r)
        if (m.order[r] == pos) p = r - m.num_decodes;
      ASSERT_GE(p, 0);
      const int first = p == 0 ? 0 : m.last_chunk_indices_p[p - 1] + 1;
      for (int k = first; k <= m.last_chunk_indices_p[p] + 1; ++k)
        got.insert(c + m.cu_chunk_seqlen_p[k] - m.query_start_loc_p[p]);
      c += n;
      want.insert(c);
    }
    ASSERT_EQ(got, want) << "cs=" << cs << " L=" << L;
  }
}

}  // namespace
}  // namespace ssmserve
