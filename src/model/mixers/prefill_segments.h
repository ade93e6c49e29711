// Owns how the CPU mixers store states inside a prefill (prefix caching's "all" mode, docs/architecture.md §3a): a
// prefill row with state stores (MambaBatchMetadata::state_store_*_p) runs as consecutive pieces split at its store
// offsets, each piece continuing from the state the previous one left, and after each piece but the last the
// layer's state is copied into that store's cached block. The pieces start at block boundaries, which lie on the
// chunk grid of every chunked form (block sizes are multiples of the chunk), so the pieces round exactly as the uncut
// row does (the same cut the scheduler's align mode makes between steps). A bf16 / fp16 state is carried from piece to
// piece in fp32 (run_prefill_pieces), so the pieces compute exactly what the uncut row computes, which keeps its state
// in fp32 until it stores the final one.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "cache/state_view.h"
#include "model/batch_metadata.h"
#include "model/decoder/module.h"

namespace ssmserve {

/// One piece of a prefill row: prefill tokens [begin, end) (0 = the step's first prefill token).
struct PrefillSegment {
  int32_t row = 0;           ///< prefill row (0..num_prefills-1)
  int32_t begin = 0, end = 0;
  int32_t num_computed = 0;  ///< sequence tokens in the state before the piece
  int32_t state_block = 0;   ///< the row's running state block
  int32_t store_block = 0;   ///< after the piece, copy the state here (0: the row's last piece, nothing to store)
};

/// The pieces of every prefill row of `md` in row order (a row without stores is one piece). Meant for batches with
/// md.has_state_stores(); without stores every row is one piece.
std::vector<PrefillSegment> split_prefill_rows(const MambaBatchMetadata& md);

/// The metadata of one piece run alone: a batch of one prefill row (its query_start_loc_p = {0, length}, chunk arrays
/// for chunk length md.chunk_size counted from the sequence start, has_initial_states_p = num_computed > 0). Reuses
/// `out`'s storage.
void segment_metadata(const PrefillSegment& seg, const MambaBatchMetadata& md, MambaBatchMetadata& out);

/// Copies `elems` elements of `view`'s dtype from block src to block dst (one layer's conv window or SSM state).
void copy_state_block(const StateView& view, int64_t elems, int32_t src, int32_t dst);

/// Converts `elems` elements of block `src_block` of `src` into block `dst_block` of `dst` through fp32: load_f32 then
/// store_f32 (widening is exact; narrowing rounds to nearest even, as the CPU kernels round the states they store).
void convert_state_block(const StateView& src, int32_t src_block, const StateView& dst, int32_t dst_block, int64_t elems);

/// Scratch slot (model/decoder/module.h) holding run_prefill_pieces' fp32 running state; no module uses it otherwise.
inline constexpr int kPieceStateScratchSlot = Scratch::kSlots - 1;

/// Runs one state tensor's prefill pieces: for each piece of `pieces` (split_prefill_rows' order: a row's pieces are
/// consecutive) calls run(piece, state), where the kernel must read and write the row's state in block
/// piece.state_block of the StateView `state`, and after each piece but the row's last the state goes into block
/// piece.store_block of `view` (`elems` elements per block: one layer's conv window or SSM state).
///  - fp32 `view`, or a row of one piece: the kernel runs on `view` itself, and the running block is copied into the
///    store block (exact).
///  - bf16 / fp16 `view`, a row of several pieces: the running state is carried between the pieces in fp32 in
///    `shadow` (resized to 2 * elems floats: block 0 is the null block the kernels skip, block 1 the row's state).
///    Before the row's first piece block 1 is the running block widened (exact); each piece runs on the fp32 shadow;
///    after each piece but the last its state is rounded into the store block, and after the last into the running
///    block (convert_state_block: the kernels' own rounding). The uncut row keeps its state in fp32 from its initial
///    load to its final store, so the pieces' outputs, stored states and final state equal the uncut row's bit for
///    bit (rounding the running state between pieces would not).
template <class Run>
void run_prefill_pieces(std::span<const PrefillSegment> pieces, const StateView& view, int64_t elems, std::vector<float>& shadow,
                        Run&& run) {
  const bool carry_f32 = view.dtype != DType::F32 && elems > 0;
  StateView sv{nullptr, DType::F32, elems};
  for (size_t i = 0; i < pieces.size(); ++i) {
    const PrefillSegment& g = pieces[i];
    const bool first = i == 0 || pieces[i - 1].row != g.row;
    if (!carry_f32 || (first && g.store_block == 0)) {
      run(g, view);
      if (g.store_block) copy_state_block(view, elems, g.state_block, g.store_block);
      continue;
    }
    if (sv.data == nullptr) {
      shadow.resize(static_cast<size_t>(2 * elems));
      sv.data = shadow.data();
    }
    if (first) convert_state_block(view, g.state_block, sv, 1, elems);
    PrefillSegment on_shadow = g;
    on_shadow.state_block = 1;
    run(static_cast<const PrefillSegment&>(on_shadow), sv);
    convert_state_block(sv, 1, view, g.store_block ? g.store_block : g.state_block, elems);
  }
}

}  // namespace ssmserve
