// Owns the middle of a Mamba-1 decode step in one kernel (issue 7, batch-1 decode latency): the causal conv update,
// x_proj, dt_proj (+ bias, softplus) and the selective state update with D skip and SiLU(z) gate, which the op
// chain runs as four latency-bound launches (conv1d_update_dual, two skinny GEMMs, selective_state_update_out).
//
// One block per channel slice (at most one per SM, all co-resident): before its PDL wait a block loads what does
// not depend on the previous kernel into shared memory (its slices of the x_proj / dt_proj weights, conv weights,
// A, D, dt_bias, and its rows' conv and SSM states, which only this kernel of this layer writes); after it, the
// conv outputs of its channels, then x_proj's partial sums over its channels (one per block). x_proj's outputs
// (dt_low, B, C) are the sums of those partials over the blocks: after a grid-wide arrival counter, the pairs
// (row, output) are spread over all warps of the grid (lane k sums the partials of blocks k, k + 32, ... in order,
// then a fixed butterfly), written, and after a second arrival every block reads them back. dt_proj and the state
// update then run per channel of the slice.
//
// Results: the op chain's math (selective_scan.h / causal_conv1d.h semantics, bf16 x_proj and dt_proj operands as
// the chain rounds them, fp32 accumulation) in another summation order, so within float rounding of the chain,
// not bit-identical to it; the order depends on (d_inner, the GPU's SM count) only, so every row's results are
// bit-identical whatever the batch (<= 16 rows) and padding it is decoded in. Reference: Gu & Dao, Mamba (2023),
// Algorithm 2 (selective scan), one token; HF transformers MambaMixer.slow_forward's cache branch.
//
// Framework-free: device pointers, sizes, row strides (elements), a stream; returns the launch status
// (cudaErrorInvalidValue for shapes it does not take: check mamba1_decode_middle_supported first).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve::cuda {

/// Most decode rows the middle kernel takes (decode-only steps of up to this many rows, padding included).
constexpr int kMiddleMaxRows = 16;

/// Operands of one layer's decode middle (M = batch rows, I = scan.dim channels, R = dt_rank, N = scan.d_state).
struct Mamba1DecodeMiddleArgs {
  const float* xz = nullptr;  ///< [M, 2I] fp32 in_proj output (row stride xz_stride): x = [:, :I], z = [:, I:]
  int64_t xz_stride = 0;
  ConvParams conv;             ///< dim == I; conv_states updated in place (rows with state index 0 skipped)
  const void* w_x = nullptr;   ///< [R + 2N, I] bf16, x_proj's weight (contiguous)
  const void* w_dt = nullptr;  ///< [I, R] bf16, dt_proj's weight (contiguous)
  int64_t dt_rank = 0;
  ScanParams scan;             ///< A, D, dt_bias (delta_bias), softplus, ssm_states (same dtype as conv_states)
  void* y = nullptr;           ///< [M, I] bf16 out_proj input (row stride y_stride); rows with state index 0 untouched
  int64_t y_stride = 0;
  const int32_t* state_indices = nullptr;  ///< [M] device
  int batch = 0;                           ///< M, 0..kMiddleMaxRows
  void* workspace = nullptr;  ///< mamba1_decode_middle_workspace bytes, zeroed once before the first launch
  size_t workspace_bytes = 0;
};

/// Whether the kernel takes a layer of d_inner I, d_state N, dt_rank R, conv width W on the current GPU (shared
/// memory of one block per SM, I and R multiples of 8, N <= 64, R <= 512, W <= 8). The launch also needs 16-byte
/// aligned weights / per-channel arrays and 4-byte aligned state blocks (as the runner allocates them).
bool mamba1_decode_middle_supported(int64_t I, int N, int64_t R, int W);

/// Workspace bytes for a layer of d_inner I, d_state N, dt_rank R (arrival counters, x_proj partials and outputs
/// for kMiddleMaxRows rows); reusable by every layer of a model launched on one stream.
size_t mamba1_decode_middle_workspace(int64_t I, int N, int64_t R);

/// Benchmarks: with SSMSERVE_MIDDLE_TIMING=1 in the environment every launch records, per block, %globaltimer (ns)
/// at kernel start, after the pre-wait loads, after the PDL wait, before / after the two arrivals and at the end;
/// this returns the last launch's [blocks][8] (slots 0-6 used; empty when off). Synchronous.
std::vector<unsigned long long> mamba1_decode_middle_timing(int64_t I);

/// Enqueues the decode middle (see the file comment). pdl: Programmatic Dependent Launch (pdl.cuh).
cudaError_t mamba1_decode_middle(const Mamba1DecodeMiddleArgs& a, bool pdl, cudaStream_t stream);

}  // namespace ssmserve::cuda
