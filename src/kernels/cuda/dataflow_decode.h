// Owns the dataflow Mamba-1 decode kernel (issue 7, batch-1 decode against the HBM roofline): the whole layer
// stack of a decode step in one cooperative launch, one block per SM, with the weights streamed through a
// shared-memory ring by the copy engine (TMA bulk copies) independently of the step's data dependencies.
//
// Why: the op-by-op chain pays a fixed ~4-5 us per dependent kernel (ramp-up, tail, cross-block split sums) and
// leaves HBM idle in the latency-bound middle of a layer (conv -> x_proj -> dt_proj -> scan); weights do not
// depend on activations, so here one producer warp per block copies its block's weight rows, in the order the
// consumer warps use them, as far ahead as the ring allows (contiguous runs of whole rows: large copies), while
// the consumers wait for the few grid-wide dependencies of a layer. (Hazy Research's "megakernel" idea; the
// session-5 persistent kernel kept the op chain's split GEMMs and grid barriers and so never streamed ahead.)
//
// Work split (fixed for a given grid size, independent of the batch): block b owns channels [c0, c1) of d_inner
// (pairs, spread evenly) and rows [h0, h1) of out_proj (spread evenly), so that between two exchanges every block
// streams about the same bytes (an exchange waits for the slowest block). Per layer,
// block b streams in_proj's x rows c0..c1 (full K), x_projᵀ rows c0..c1, in_proj's z rows, dt_proj rows c0..c1 and
// out_proj rows h0..h1, and:
//   1. after the previous layer (exchange 3, or the input's before layer 0): every block's residual rows -> RMSNorm
//      with the exchange warp's 1 / rms (from every block's sum of squares) -> bf16 xn [M, H] in shared memory;
//   2. x = in_proj_x xn (own channels), causal conv update (own channels, state written back), u = SiLU(conv);
//   3. x_proj partial sums over own channels -> global partials [G, M, R + 2N] (exchange 0);
//   4. z = in_proj_z xn (own channels), while every block's exchange warp sums its slice of the partials over the
//      G blocks in block order (reduce-scatter) -> xdbl slice (exchange 1);
//   5. every block reads xdbl [M, R + 2N]; dt = softplus(dt_proj bf16(dt_low) + dt_bias) (own channels);
//   6. selective state update (own channels, fp32 math, state written back), y = (Σ state C + D u) SiLU(z) ->
//      bf16 y to global (in the GEMV operand order, act_pos; exchange 2);
//   7. out_proj rows h0..h1 over all of y (read into shared memory) -> hidden[h] += out[h] and the block's sum of
//      squares of the new residual rows (exchange 3: the next layer's norm), or `out` for the last layer.
// The exchanges have no grid barrier: every published value is a 64-bit "LL" word {32 data bits, a flag naming
// the launch, layer and exchange} (NCCL's low-latency protocol), and a reader re-reads a word until it carries the
// flag it waits for (dataflow_common.cuh). On the H200 that took mamba-2.8b batch-1 decode from 412 to ~502
// tokens/s (with the kernel templated on its benchmark timing, whose registers no longer weigh on the untimed
// kernel), 510 with the GEMV's x loads limited to the batch's rows (docs/benchmarks.md, session 13).
// Every sum runs in a fixed order that depends on the shape and the grid size only, never on the batch: a row's
// bits are the same alone or in any batch of up to kDataflowMaxRows rows (batch-invariant), and the same on every
// run. They are not the op chain's bits (different summation order): tests compare within bf16 tolerance.
//
// The math (Mamba-1, Gu & Dao 2023 §3; Hugging Face MambaMixer.slow_forward's decode step): as the op chain's
// kernels (decode_math.cuh: conv_update_channel, scan_update_channel; RMSNorm x * (1 / sqrt(mean(x²) + eps)) * w).
// The bf16 roundings sit where the op chain has them: the in_proj input, x_proj's input u, dt_proj's input
// dt_low, out_proj's input y.
//
// Framework-free: device pointers, sizes, a stream; returns the launch status (cudaErrorInvalidValue for
// unsupported shapes or unaligned pointers: check mamba1_dataflow_supported first).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cache/state_view.h"
#include "kernels/cuda/mamba1_decode_layer.h"

namespace ssmserve::cuda {

/// One layer for the dataflow kernel: the decode layer plus x_proj transposed.
struct Mamba1DataflowLayer {
  Mamba1DecodeLayer w;
  const void* x_proj_t = nullptr;  ///< [I, R + 2N] bf16 (mamba1_dataflow_transpose_x_proj of w.x_proj)
};

/// The step's activations (device, fp32, contiguous rows): hidden [M, H] the residual stream on entry (the
/// embeddings) and the last layer's residual input on return; out [M, H] the last layer's mixer output on return
/// (so the final add + RMSNorm is the caller's, as after the op chain). state_indices [M] int32 (0 = null row:
/// no state read-modify-write, y = 0). hidden and the workspace 16-byte aligned (else cudaErrorInvalidValue).
struct Mamba1DataflowBuffers {
  float* hidden = nullptr;
  float* out = nullptr;
  const int32_t* state_indices = nullptr;
  /// mamba1_dataflow_workspace bytes, zeroed once by the caller; the kernel keeps its exchange words and launch
  /// generation there between launches, so one workspace serves one stream's launches (any shapes and batches in
  /// turn), never two launches at once.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

/// Time points per layer and block of the benchmark timing.
constexpr int kDataflowTimePoints = 12;

/// Benchmarks: timing [num_layers, grid, kDataflowTimePoints] or nullptr: every block's %globaltimer (ns) at the
/// layer's start, norm done, x rows done, conv done, x_proj partials published, z rows done, xdbl read, dt done,
/// y published, y read, out rows done, residual published (a separate kernel build: the untimed one pays nothing).
struct Mamba1DataflowOptions {
  unsigned long long* timing = nullptr;
  /// Benchmarks only (wrong results): bit 1 skips the streamed GEMVs' arithmetic, bit 2 does it twice.
  int debug = 0;
  /// Bulk copies of weights in flight per block at most (speed only; clamped to the ring's slots). 1 measured
  /// best on the H200 (session 16: mamba-2.8b 27.8 us per layer vs 32.2 / 33.2 for 2 / 3, and slower still with
  /// 2 only while a GEMV streams: more bytes in flight slow the latency-bound exchanges more than they speed the
  /// streams).
  int inflight = 1;
  /// Groups of consumer warps that take the GEMV slots in turn: 1, 2 or 5 (a divisor of the 10 consumer warps;
  /// any other value runs as 1); speed only, other bits. 2 groups of 5 measured fastest: 26.4-26.6 us per
  /// mamba-2.8b layer against 26.9 for 1.
  int slot_groups = 2;
  /// The same for out_proj's GEMV.
  int slot_groups_out = 2;
  /// Tests only: launches per wrap of the exchange flags' generation bits, as a power of two (1 ... 20; the
  /// wrap zeroes the workspace's exchange words, see dataflow_common.cuh).
  int flag_wrap_log2 = 20;
  /// Pause (ns) between two reads of another block's exchange word that has not arrived yet (speed only).
  int poll_ns = 32;
};

/// Most layers of one launch (the exchange flags hold 4 per layer).
constexpr int kDataflowMaxLayers = 1000;

/// Largest batch of one launch (the shared memory may allow fewer: mamba1_dataflow_supported; the runner splits
/// decode batches of up to 16 rows into launches of the most it takes).
constexpr int kDataflowMaxRows = 8;

/// Whether the kernel takes this shape / batch on the current device: 1 <= M <= 8, H % 8 == 0, I % 8 == 0,
/// R % 8 == 0, (R + 2N) % 8 == 0, 1 <= N <= 256, 1 <= W <= 8, F32 or BF16 states, and the shared memory fits a
/// ring of at least 3 slots.
bool mamba1_dataflow_supported(const Mamba1DecodeShape& s, int64_t M, DType state_dtype);

/// Workspace bytes (launch generation, and the blocks' exchange words: x_proj partials, xdbl, y, residual rows and
/// their sums of squares); num_layers does not change it.
size_t mamba1_dataflow_workspace(const Mamba1DecodeShape& s, int num_layers);

/// x_proj_t [I, XD] = x_projᵀ (x_proj [XD, I] bf16), on `stream`.
cudaError_t mamba1_dataflow_transpose_x_proj(const void* x_proj, int64_t XD, int64_t I, void* x_proj_t,
                                             cudaStream_t stream);

/// Runs num_layers decode layers for M rows in one launch. layers_host / layers_dev: the same num_layers
/// descriptors on the host (checked: 16-byte aligned weights and state blocks, one state dtype) and on the
/// device. Cooperative launch, one block per SM.
cudaError_t mamba1_dataflow_decode(const Mamba1DecodeShape& s, const Mamba1DataflowLayer* layers_host,
                                   const Mamba1DataflowLayer* layers_dev, int num_layers, int M,
                                   const Mamba1DataflowBuffers& buf, const Mamba1DataflowOptions& opt,
                                   cudaStream_t stream);

}  // namespace ssmserve::cuda
