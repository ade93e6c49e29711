// Owns the device form of prefix caching's "all"-mode state stores (MambaBatchMetadata::state_store_*_p,
// docs/architecture.md §3a): after `offset` tokens of prefill row p, every recurrent layer writes its state into
// cached block `block`. The scan kernels take these arrays and write their running state at each store (Mamba-2's
// SSD at chunk ends: a block boundary is a chunk boundary of the sequence-aligned chunks; Mamba-1 in its token walk);
// the conv windows at the stores are written by conv_store_windows, one kernel for every family's conv.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cache/state_view.h"

namespace ssmserve::cuda {

/// One step's state stores on the device (all arrays device memory; num == 0: none, every pointer may be null).
/// Store i belongs to prefill row row[i] (rows in order, offsets strictly increasing within a row): after the row's
/// first offset[i] tokens (0 < offset[i] < row length) the state is written into block block[i] (>= 1).
struct DevStateStores {
  int num = 0;
  const int32_t* start = nullptr;   ///< [num_prefills + 1] row p's stores are [start[p], start[p + 1])
  const int32_t* offset = nullptr;  ///< [num] tokens of the row before the store
  const int32_t* block = nullptr;   ///< [num] destination block ids
  const int32_t* row = nullptr;     ///< [num] prefill row of each store
  bool any() const { return num > 0; }
};

/// Writes the conv window at every store: block stores.block[i]'s window ([width-1, dim] of conv_states, newest last,
/// rounded to the state dtype as causal_conv1d_fwd's write-back) = the width-1 pre-convolution inputs of row
/// stores.row[i] before its token stores.offset[i]; positions before the row's first token come from the row's
/// window conv_states[state_indices[row]] when has_initial_states[row] (else zeros). x: [num_tokens, dim] fp32 (row
/// stride x_stride) the prefill rows' conv inputs, packed as query_start_loc [num_prefills + 1] (device) says.
/// Must run before the prefill conv (causal_conv1d_fwd), which overwrites the rows' windows. Rows whose state index
/// is 0 are skipped. width 1 (no window) and stores.num == 0 do nothing. cudaErrorInvalidValue for width outside
/// [1, 8], dim < 1 or missing arrays.
cudaError_t conv_store_windows(const float* x, int64_t x_stride, int64_t dim, int width, const StateView& conv_states,
                               const int32_t* query_start_loc, const int32_t* state_indices,
                               const uint8_t* has_initial_states, const DevStateStores& stores, cudaStream_t stream);

}  // namespace ssmserve::cuda
