// Owns how the CPU mixers store states inside a prefill (prefix caching's "all" mode, docs/architecture.md §3a): a
// prefill row with state stores (MambaBatchMetadata::state_store_*_p) runs as consecutive pieces split at its store
// offsets, each piece continuing from the state the previous one left, and after each piece but the last the
// layer's state is copied into that store's cached block. The pieces start at block boundaries, which lie on the
// chunk grid of every chunked form (block sizes are multiples of the chunk), so the pieces round exactly as the uncut
// row does (the same cut the scheduler's align mode makes between steps).
#pragma once
#include <cstdint>
#include <vector>

#include "cache/state_view.h"
#include "model/batch_metadata.h"

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

}  // namespace ssmserve
