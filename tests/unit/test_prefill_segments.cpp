// "all"-mode state stores in the batch metadata (ScheduledSeq::state_stores -> MambaBatchMetadata::state_store_*_p)
// and the prefill pieces the CPU mixers run (model/mixers/prefill_segments.h): CSR over the prefill rows after the
// decodes are reordered first, pieces split at the store offsets continuing the sequence positions, bad stores named.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/batch_metadata.h"
#include "model/mixers/prefill_segments.h"

namespace ssmserve {
namespace {

ScheduledSeq seq(int32_t block, int32_t computed, int32_t n, bool prefilling, std::span<const StateStore> stores = {}) {
  ScheduledSeq s{block, computed, n, prefilling};
  s.state_stores = stores;
  return s;
}

TEST(PrefillSegments, StoresBecomeCsrAndPieces) {
  const std::vector<StateStore> a = {{3, 9}, {7, 10}}, none;
  // A decode (first after reordering), a prefill with two stores, a prefill without.
  const std::vector<ScheduledSeq> seqs = {seq(1, 5, 10, true, a), seq(2, 4, 1, false), seq(3, 0, 6, true, none)};
  MetadataOptions opt;
  opt.chunk_size = 4;
  const MambaBatchMetadata m = build_mamba_metadata(seqs, opt);
  ASSERT_TRUE(m.has_state_stores());
  EXPECT_EQ(m.state_store_start_p, (std::vector<int32_t>{0, 2, 2}));
  EXPECT_EQ(m.state_store_offset_p, (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(m.state_store_block_p, (std::vector<int32_t>{9, 10}));
  const std::vector<PrefillSegment> p = split_prefill_rows(m);
  ASSERT_EQ(p.size(), 4u);
  // Row 0 (computed 5, 10 tokens): [0,3) then store 9, [3,7) then store 10, [7,10); row 1 whole.
  const auto piece = [](const PrefillSegment& g) { return std::vector<int32_t>{g.row, g.begin, g.end, g.num_computed, g.store_block}; };
  EXPECT_EQ(piece(p[0]), (std::vector<int32_t>{0, 0, 3, 5, 9}));
  EXPECT_EQ(piece(p[1]), (std::vector<int32_t>{0, 3, 7, 8, 10}));
  EXPECT_EQ(piece(p[2]), (std::vector<int32_t>{0, 7, 10, 12, 0}));
  EXPECT_EQ(piece(p[3]), (std::vector<int32_t>{1, 10, 16, 0, 0}));
  MambaBatchMetadata one;
  segment_metadata(p[1], m, one);
  EXPECT_EQ(one.num_prefills, 1);
  EXPECT_EQ(one.query_start_loc_p, (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(one.has_initial_states_p[0], 1);
  EXPECT_EQ(one.state_indices_tensor_p[0], 1);
  EXPECT_EQ(one.cu_chunk_seqlen_p, (std::vector<int32_t>{0, 4}));  // position 8: on the chunk grid
  EXPECT_FALSE(build_mamba_metadata(std::span(seqs).subspan(1), opt).has_state_stores());
}

TEST(PrefillSegments, BadStoresAreNamed) {
  MetadataOptions opt;
  opt.chunk_size = 4;
  for (const std::vector<StateStore>& bad : std::vector<std::vector<StateStore>>{{{0, 9}}, {{6, 9}}, {{3, 9}, {2, 10}}, {{3, 1}}, {{3, 0}}}) {
    const std::vector<ScheduledSeq> seqs = {seq(1, 0, 6, true, bad)};
    EXPECT_THROW(build_mamba_metadata(seqs, opt), Error);
  }
  const std::vector<StateStore> ok = {{1, 9}};
  const std::vector<ScheduledSeq> decode = {seq(1, 4, 1, false, ok)};
  EXPECT_THROW(build_mamba_metadata(decode, opt), Error);
}

// A stand-in kernel on one row: reads the state from `block` of `v` (zeros when computed == 0), advances it over tokens
// [begin, end) in fp32, stores it back in the view's dtype (load_f32 / store_f32, as the CPU kernels do). Token t adds
// +-100.3 (i + 1) (sign alternating) plus a small term, so at the boundaries (after an odd number of tokens) the state is
// large and rounding it to 16 bits loses what the small terms left, which the small final state shows. Not inlined,
// so every call runs the same instructions (no call site contracts to FMAs differently).
[[gnu::noinline]] void fake_kernel(const StateView& v, int32_t block, int32_t computed, int32_t begin, int32_t end, int64_t elems) {
  std::vector<float> st = computed > 0 ? state_to_f32(v, block, elems) : std::vector<float>(static_cast<size_t>(elems), 0.0f);
  for (int32_t t = begin; t < end; ++t)
    for (int64_t i = 0; i < elems; ++i)
      st[i] += (t % 2 == 0 ? 100.3f : -100.3f) * static_cast<float>(i + 1) + 0.0123f * static_cast<float>(t + 1);
  state_from_f32(v, block, st.data(), elems);
}

// run_prefill_pieces: a bf16 state is carried between the pieces in fp32, so the final state equals the uncut row's
// (one load, one rounding) bit for bit and each store block holds the fp32 state at its boundary rounded once; fp32
// states and rows of one piece run on the pool's view itself.
TEST(PrefillSegments, PiecesCarryNarrowStatesInFp32) {
  constexpr int64_t kElems = 5;
  const std::vector<StateStore> a = {{3, 9}, {7, 10}}, none;
  const std::vector<ScheduledSeq> seqs = {seq(1, 5, 10, true, a), seq(2, 0, 6, true, none)};
  MetadataOptions opt;
  opt.chunk_size = 4;
  const MambaBatchMetadata m = build_mamba_metadata(seqs, opt);
  const std::vector<PrefillSegment> pieces = split_prefill_rows(m);
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    const auto pool = [&](std::vector<uint16_t>& u, std::vector<float>& f) {
      u.assign(11 * kElems, 0);
      f.assign(11 * kElems, 0.0f);
      StateView v{dt == DType::F32 ? static_cast<void*>(f.data()) : static_cast<void*>(u.data()), dt, kElems};
      const std::vector<float> init = {0.3f, -1.7f, 2.2f, 0.01f, 5.5f};
      state_from_f32(v, 1, init.data(), kElems);
      return v;
    };
    std::vector<uint16_t> u_cut, u_ref;
    std::vector<float> f_cut, f_ref, shadow;
    const StateView cut = pool(u_cut, f_cut), ref = pool(u_ref, f_ref);
    int calls = 0;
    run_prefill_pieces(pieces, cut, kElems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      const bool own_view = v.data == cut.data;
      // Row 1 is one piece: always the pool's view; row 0's pieces use the fp32 shadow when the pool is narrower.
      EXPECT_EQ(own_view, dt == DType::F32 || g.row == 1) << calls;
      if (!own_view) {
        EXPECT_EQ(g.state_block, 1);
      }
      fake_kernel(v, g.state_block, g.num_computed, g.begin, g.end, kElems);
      ++calls;
    });
    EXPECT_EQ(calls, 4);
    // The uncut rows; row 0's boundaries in fp32 from the pool's initial state, each rounded once into its store block.
    fake_kernel(ref, 1, 5, 0, 10, kElems);
    fake_kernel(ref, 2, 0, 10, 16, kElems);
    std::vector<uint16_t> u_init;
    std::vector<float> f_init, f32_pool(2 * kElems, 0.0f);
    const StateView initial = pool(u_init, f_init), f32v{f32_pool.data(), DType::F32, kElems};
    convert_state_block(initial, 1, f32v, 1, kElems);
    fake_kernel(f32v, 1, 5, 0, 3, kElems);
    convert_state_block(f32v, 1, ref, 9, kElems);
    fake_kernel(f32v, 1, 8, 3, 7, kElems);
    convert_state_block(f32v, 1, ref, 10, kElems);
    for (int32_t b : {1, 2, 9, 10})
      EXPECT_EQ(state_to_f32(cut, b, kElems), state_to_f32(ref, b, kElems)) << "dtype " << static_cast<int>(dt) << " block " << b;
    if (dt == DType::F32) continue;
    // Continuing from the rounded state instead (the pieces on the pool's view) ends elsewhere: the test bites.
    std::vector<uint16_t> u_naive;
    std::vector<float> f_naive;
    const StateView naive = pool(u_naive, f_naive);
    for (const PrefillSegment& g : pieces) {
      fake_kernel(naive, g.state_block, g.num_computed, g.begin, g.end, kElems);
      if (g.store_block) copy_state_block(naive, kElems, g.state_block, g.store_block);
    }
    EXPECT_NE(state_to_f32(naive, 1, kElems), state_to_f32(ref, 1, kElems)) << "dtype " << static_cast<int>(dt);
  }
}

}  // namespace
}  // namespace ssmserve
