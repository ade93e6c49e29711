// Owns the persistent Mamba-1 decode kernel (issue 7, batch-1 decode latency): a whole decode layer (or a stack
// of layers) in one launch with every SM resident, its phases separated by grid barriers instead of kernel
// boundaries (the op-by-op chain paid 1.5-3 us per dependent launch even with PDL):
//   A. residual add + RMSNorm (every block redoes it for all rows into shared memory) -> in_proj -> xz;
//   B. per (x_proj tile, split group): the conv update's outputs of the group's channels (into shared memory),
//      x_proj's split sums, the groups added in group order by the last block to arrive -> xdbl (+ bf16 copy);
//   C. per 16-channel tile: dt_proj (one split), softplus, the conv state shift, the selective state update,
//      D skip, SiLU(z) gate -> y (bf16);
//   D. out_proj -> out; the residual of step A written back to `hidden` (by block 0, after the first barrier).
// The weights of later phases can be prefetched into L2 with TMA bulk prefetches while earlier phases run.
//
// Results: bit-identical to the op-by-op decode chain of the runner (add_rms_norm_rows, skinny_gemm in_proj,
// conv1d_update_dual, skinny_gemm x_proj with its bf16 copy, skinny_gemm dt_proj, selective_state_update_out
// with bf16 y, skinny_gemm out_proj): every GEMM uses skinny_gemm's split / group summation order for the same
// (N, K), the norm the 256-thread vector form's order, the per-channel math decode_math.cuh's functions. So it
// is batch-invariant like them: a row's bits never depend on the other rows. Rows whose state index is 0 (the
// null block) get no conv / state update and no y (as the reference chain).
//
// Framework-free: device pointers, sizes, a stream; returns the launch status (cudaErrorInvalidValue for
// unsupported shapes: check mamba1_persistent_supported first).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cache/state_view.h"

namespace ssmserve::cuda {

/// Shape of a Mamba-1 decoder layer: d_model H, d_inner I, d_state N, dt_rank R, d_conv W; RMSNorm eps.
struct Mamba1DecodeShape {
  int64_t H = 0, I = 0, N = 0, R = 0, W = 0;
  float eps = 1e-5f;
};

/// One layer's device weights (bf16 GEMM weights [rows, cols] contiguous; the rest fp32) and its state views.
struct Mamba1DecodeLayer {
  const float* norm = nullptr;          ///< [H]
  const void* in_proj = nullptr;        ///< [2I, H] bf16
  const float* conv_weight = nullptr;   ///< [I, W]
  const float* conv_bias = nullptr;     ///< [I] or nullptr
  const void* x_proj = nullptr;         ///< [R + 2N, I] bf16
  const void* dt_proj = nullptr;        ///< [I, R] bf16
  const float* dt_bias = nullptr;       ///< [I]
  const float* A = nullptr;             ///< [I, N] (= -exp(A_log))
  const float* D = nullptr;             ///< [I] or nullptr
  const void* out_proj = nullptr;       ///< [H, I] bf16
  StateView conv_states;                ///< [blocks, W - 1, I], F32 or BF16 (same dtype as ssm_states)
  StateView ssm_states;                 ///< [blocks, I, N]
};

/// The step's activations (device, fp32 unless noted; M decode rows, contiguous rows):
///   hidden [M, H] residual stream (updated: hidden += out of the previous layer), out [M, H] the previous
///   layer's mixer output on entry (ignored for the first layer) and this layer's on return; scratch xz [M, 2I],
///   xdbl [M, R + 2N], xdbl16 [M, R + 2N] bf16, y16 [M, I] bf16; state_indices [M] int32 (0 = null row).
struct Mamba1DecodeBuffers {
  float* hidden = nullptr;
  float* out = nullptr;
  float* xz = nullptr;
  float* xdbl = nullptr;
  void* xdbl16 = nullptr;
  void* y16 = nullptr;
  const int32_t* state_indices = nullptr;
  void* workspace = nullptr;  ///< mamba1_persistent_workspace bytes, zeroed once by the caller (left zeroed)
  size_t workspace_bytes = 0;
};

/// Launch options (speed only, never a result). prefetch: 0 none (the default: measured fastest on the H200, the
/// prefetch instructions delayed the latency-bound phases more than they sped up the GEMMs); 1 TMA bulk prefetches
/// (cp.async.bulk.prefetch.L2) of out_proj's weights at the start of phase B and of each block's in_proj slices at
/// its start; 2 everything of the layer at its start;
/// 3 as 1 plus, in a multi-layer launch, the next layer's in_proj during phases C and D; 4 line prefetches
/// (prefetch.global.L2) of each warp's in_proj rows at the start and of out_proj over the grid at phase B; 5 as 4
/// plus, in a multi-layer launch, the next layer's first 20 MB of in_proj during phase D (instead of at its start).
struct Mamba1PersistentOptions {
  int prefetch = 0;
  /// Benchmarks: block 0's clock64 at 9 points of each layer (start, norm done, in_proj done, barrier 1 passed,
  /// x_proj done, barrier 2 passed, scan done, barrier 3 passed, out_proj done) into timing [num_layers, 9], or
  /// nullptr.
  long long* timing = nullptr;
};

/// Largest decode batch the kernel takes (one 8-row mma tile).
constexpr int kPersistentMaxRows = 8;

/// Whether the kernel takes this shape / batch: 1 <= M <= 8, H % 8 == 0, H <= 4096, I % 8 == 0, R % 8 == 0,
/// (R + 2N) % 8 == 0, N <= 256, 1 <= W <= 8, dt_proj in one K split, states F32 or BF16 (both the same).
bool mamba1_persistent_supported(const Mamba1DecodeShape& s, int64_t M, DType state_dtype);

/// Workspace bytes (grid barrier, group partial sums and arrival counters of the split GEMMs).
size_t mamba1_persistent_workspace(const Mamba1DecodeShape& s);

/// Runs num_layers decode layers in one launch: layers_dev [num_layers] (device array) or, when null, the one
/// layer `layer` (num_layers must then be 1). first_layer: `out` holds no previous mixer output (layer 0: no
/// residual add). M rows. Co-residency of the grid: cooperative launch (one block per SM).
cudaError_t mamba1_persistent_decode(const Mamba1DecodeShape& s, const Mamba1DecodeLayer* layers_dev,
                                     const Mamba1DecodeLayer& layer, int num_layers, bool first_layer, int M,
                                     const Mamba1DecodeBuffers& buf, const Mamba1PersistentOptions& opt,
                                     cudaStream_t stream);

}  // namespace ssmserve::cuda
