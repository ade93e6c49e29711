// Owns the Mamba-1 selective scan on the GPU (Gu & Dao 2023, Algorithm 2 "S6"; vllm-ssm-design.md §5.1 step 5):
//   dt = softplus(delta + delta_bias);  s_t = exp(dt * A) * s_{t-1} + dt * B_t * u_t;
//   y_t = <s_t, C_t> + D * u_t;  y_t *= SiLU(z_t)
// as the varlen prefill scan (fp32 state in registers, written back once per sequence in the pool's dtype) and
// the decode update over a batch of state blocks (vLLM's selective_scan_fn / selective_state_update).
// Reference: kernels/cpu/selective_scan.h. Layout: one group of min(32, d_state) lanes per channel, each lane
// holding d_state / lanes state elements; tokens are walked in order. Framework-free: device pointers, sizes,
// row strides (elements), a stream; each returns the launch status (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cache/state_view.h"
#include "core/dtype.h"
#include "kernels/cuda/state_stores.h"

namespace ssmserve::cuda {

/// A row-major fp32 device matrix [rows, cols] with a row stride (elements), e.g. a slice of a projection.
struct DevRows {
  const float* data = nullptr;
  int64_t stride = 0;
};

/// Per-token inputs, indexed by packed token row t.
struct ScanInputs {
  DevRows u;      ///< [num_tokens, dim] post-conv activations
  DevRows delta;  ///< [num_tokens, dim] dt before bias and softplus
  DevRows B;      ///< [num_tokens, d_state]
  DevRows C;      ///< [num_tokens, d_state]
  DevRows z;      ///< [num_tokens, dim] gate, or data == nullptr
};

/// Sequence-aligned chunk metadata of the prefill tokens (device arrays; build_mamba_metadata's *_p arrays,
/// validated on the host by the metadata builder): chunks never span two sequences and hold at most chunk_size
/// tokens. Shared by the chunked Mamba-1 scan and the Mamba-2 SSD.
struct ChunkMetadataDev {
  int num_seqs = 0;
  int nchunks = 0;
  const int32_t* cu_chunk_seqlen = nullptr;     ///< [nchunks + 1] chunk starts, then num_tokens
  const int32_t* seq_idx = nullptr;             ///< [nchunks] sequence of each chunk
  const int32_t* last_chunk_indices = nullptr;  ///< [num_seqs] index of each sequence's last chunk
  const int32_t* state_indices = nullptr;       ///< [num_seqs] running-state block ids (0 = skip)
  const uint8_t* has_initial_states = nullptr;  ///< [num_seqs]
  /// Upper bound of every chunk's length (tokens). 1..256 selects the chunk-parallel kernels; 0 (unknown) or
  /// larger values the sequential per-sequence kernels. Chunks longer than this are not read past it.
  int chunk_size = 0;
  /// Device scratch for the chunked forms (at least ssd_workspace_bytes / scan_workspace_bytes for these
  /// sizes), reused across calls by the caller; nullptr: taken from the stream-ordered pool for each call.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  /// Prefix caching's "all" mode: [nchunks] the block each chunk's end state is also written into (0: none), or
  /// nullptr. The SSD writes them (every store offset ends a chunk: block sizes are multiples of the chunk).
  const int32_t* chunk_store_blocks = nullptr;
  /// The same stores by row offset (state_stores.h); the Mamba-1 scans write them in their token walks, wherever the
  /// offsets fall.
  DevStateStores stores = {};
};

/// Layer parameters (device) and the state pool.
struct ScanParams {
  int64_t dim = 0;                    ///< channels (d_inner)
  int d_state = 0;                    ///< N, 1..256
  const float* A = nullptr;           ///< [dim, d_state] = -exp(A_log)
  const float* D = nullptr;           ///< [dim] or nullptr
  const float* delta_bias = nullptr;  ///< [dim] or nullptr
  bool delta_softplus = true;
  StateView ssm_states;               ///< [num_blocks, dim, d_state] block-strided, F32/BF16/F16; block 0 = null
};

/// Varlen prefill over sequences delimited by query_start_loc [num_seqs+1] (device). Sequence s starts from
/// ssm_states[state_indices[s]] when has_initial_states[s] (else zeros) and writes its final state back.
/// y: [num_tokens, dim] fp32 (row stride y_stride). Sequences whose state index is 0 are skipped (y not written).
/// stores: "all"-mode state stores of the sequences (state_stores.h; rows = sequences): the running state after
/// each store's offset is written into its block, rounded to the state dtype as the final state.
cudaError_t selective_scan_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                               const int32_t* query_start_loc, const int32_t* state_indices,
                               const uint8_t* has_initial_states, int num_seqs, cudaStream_t stream,
                               const DevStateStores& stores = {});

/// Chunk-parallel varlen prefill over the sequence-aligned chunks of `meta` (same inputs, outputs and state
/// semantics as selective_scan_fwd, y fp32): pass 1 scans every chunk from a zero state in parallel (one thread
/// per channel, d_state <= 16 in registers) keeping its end state and sum of dt; pass 2 carries the states across
/// each sequence's chunks (s_in(c+1) = exp(A * sum dt(c)) s_in(c) + s_local(c)) and writes the final state back;
/// pass 3 rescans every chunk from its carried-in state and writes y. Falls back to selective_scan_fwd when
/// d_state > 16 or meta.chunk_size is outside 1..256. Workspace from the stream-ordered pool (cudaMallocAsync).
/// meta.stores ("all" mode): pass 3 writes the running state at each store offset into its block (rounded to the
/// state dtype); the offsets need not end chunks.
/// Workspace bytes selective_scan_chunked_fwd needs for `nchunks` chunks of a `dim`-channel layer.
size_t scan_workspace_bytes(int64_t dim, int64_t nchunks);

cudaError_t selective_scan_chunked_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                                       const ChunkMetadataDev& meta, const int32_t* query_start_loc,
                                       cudaStream_t stream);

/// selective_scan_chunked_fwd writing y in y_dtype: F32, or BF16 (the rounding of the fp32 result: out_proj's
/// input, so no separate cast pass). BF16 needs the chunked form (cudaErrorInvalidValue where it would fall back).
cudaError_t selective_scan_chunked_fwd_out(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                           int64_t y_stride, const ChunkMetadataDev& meta,
                                           const int32_t* query_start_loc, cudaStream_t stream);

/// Decode: row b of `in` is one token of the request whose state is ssm_states[state_indices[b]] ([batch],
/// device), updated in place. y: [batch, dim]. Rows with state index 0 are skipped. Two rows must not share a
/// nonzero state index.
cudaError_t selective_state_update(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                                   const int32_t* state_indices, int batch, cudaStream_t stream);

/// selective_state_update for large decode batches (the engine uses it for more than 16 rows outside
/// batch-invariant mode): same math and arguments, y in y_dtype (F32 or BF16), four lanes per (row, channel)
/// with the channel's states in registers (coalesced 16-byte state vectors); d_state <= 16 (else
/// cudaErrorInvalidValue). Its y sum runs in
/// another order than selective_state_update's (not bit-identical). pdl: Programmatic Dependent Launch.
cudaError_t selective_state_update_wide(const ScanInputs& in, const ScanParams& p, void* y, DType y_dtype,
                                        int64_t y_stride, const int32_t* state_indices, int batch, bool pdl,
                                        cudaStream_t stream);

}  // namespace ssmserve::cuda
