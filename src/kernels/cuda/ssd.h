// Owns the Mamba-2 SSD scan on the GPU: the varlen prefill over the sequence-aligned chunk metadata (vLLM's
// mamba_chunk_scan_combined_varlen inputs: cu_chunk_seqlen_p, seq_idx_p, last_chunk_indices_p) and the one-token
// decode update (selective_state_update on the tied-head-dim path). Math as kernels/cpu/ssd.h (its reference),
// per head h of group g = h / (H / G), per token t:
//   dt = clamp(softplus(dt_raw + dt_bias[h]), time_step_min, time_step_max);  dA = exp(dt * A[h]);
//   S[h] (P x N) = dA * S[h] + dt * x_t[h] (outer) B_t[g];   y_t[h] = S[h] @ C_t[g] + D[h] * x_t[h].
// Prefill (Dao & Gu 2024, "Transformers are SSMs", §6 / mamba_ssm's ssd_combined): with chunk_size <= 256 in
// the metadata, the chunked form in five launches (ssd_chunked.cu): chunk cumsum of dt * A; chunk states
// B^T (x * dt * decay-to-chunk-end) per (chunk, head); C B^T per (chunk, group); state passing along each
// sequence's chunks from its initial state (writing the final and, when asked, every chunk-end state); chunk scan
// y = (C B^T . decay . dt) x + exp(cumsum) C state_in + D x. Matrix products on tensor cores (mma.sync TF32,
// fp32 accumulate, 3xTF32 split unless exact_products = false). Otherwise (chunk_size 0 or > 256) the sequential
// walk: each sequence's tokens in order with the state in registers (each warp holds 4 rows of P x N).
// Decays exp(dt * A) below e^-60 are flushed to 0 as on the CPU. Framework-free: device pointers, sizes, row
// strides (elements), a stream; each returns the launch status (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "cache/state_view.h"
#include "kernels/cuda/device_decode_rows.h"
#include "kernels/cuda/selective_scan.h"  // DevRows

namespace ssmserve::cuda {

/// Rows of bf16 values (device): data[t * stride + i].
struct DevRowsBf16 {
  const void* data = nullptr;  ///< __nv_bfloat16
  int64_t stride = 0;
};

/// Per-token inputs (device), indexed by packed token row t.
struct SsdInputs {
  DevRows x;   ///< [num_tokens, H * P] post-conv x
  DevRows dt;  ///< [num_tokens, H] raw dt
  DevRows B;   ///< [num_tokens, G * N]
  DevRows C;   ///< [num_tokens, G * N]
  /// Optional bf16 roundings of x, B, C (e.g. the conv's bf16 output) for the bf16 tiles: where
  /// ssd_uses_bf16_copies holds they are the only x, B, C the prefill reads (no bf16 copies made).
  DevRowsBf16 x_h, B_h, C_h;
};

/// Layer sizes, parameters (device) and the state pool.
struct SsdParams {
  int num_heads = 0;  ///< H
  int head_dim = 0;   ///< P
  int n_groups = 0;   ///< G (H % G == 0)
  int d_state = 0;    ///< N, 1..256
  const float* A = nullptr;        ///< [H] = -exp(A_log)
  const float* D = nullptr;        ///< [H] or nullptr
  const float* dt_bias = nullptr;  ///< [H] or nullptr
  float time_step_min = 0.0f;
  float time_step_max = std::numeric_limits<float>::infinity();
  StateView ssm_states;  ///< [num_blocks, H, P, N] block-strided, F32/BF16/F16; block 0 = null (skipped)
  /// Chunked form's matrix products: true = 3xTF32 split (fp32-exact to ~1e-6, the op harness's 1e-4 bound);
  /// false = one TF32 pass (relative error ~5e-4, 3x fewer tensor-core instructions; bf16-weight models).
  bool exact_products = true;
  /// Chunked form on bf16 tensor cores instead (mma.sync m16n8k16, fp32 accumulation; ssd_chunked_bf16.cu): x, B,
  /// C, the decayed C B^T and the chunk-entry states rounded to bf16 (relative error ~3e-3); overrides
  /// exact_products. Only for chunk_size % 8 == 0 and d_state % 8 == 0 (else the TF32 tiles run).
  bool bf16_products = false;
};

/// Chunk metadata of the prefill tokens (see ChunkMetadataDev in selective_scan.h). With chunk_size in 1..256
/// the chunked tensor-core form runs; otherwise the sequential per-sequence walk.
using SsdChunkMetadataDev = ChunkMetadataDev;

/// Varlen chunked prefill. Sequence s covers chunks (last_chunk_indices[s-1], last_chunk_indices[s]] and starts
/// from ssm_states[state_indices[s]] when has_initial_states[s] (else zeros); its final state is written back.
///   y: [num_tokens, H * P] fp32 (row stride y_stride, not aliasing the inputs);
///   chunk_states: [nchunks, H, P, N] fp32 state at the end of every chunk, or nullptr.
/// Sequences with state index 0 are written neither in y nor in chunk_states.
/// meta.chunk_store_blocks ("all" mode): the state at the end of chunk c is also written into ssm_states block
/// chunk_store_blocks[c] when nonzero, rounded to the state dtype as the final state.
cudaError_t ssd_chunk_scan_fwd(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadataDev& meta, float* y,
                               int64_t y_stride, float* chunk_states, cudaStream_t stream);

/// Whether ssd_chunk_scan_fwd with chunk_size (the metadata's) runs the bf16 tiles on in.x_h / B_h / C_h alone,
/// reading none of in.x, in.B, in.C (the caller may leave those rows unwritten): bf16_products, chunk_size in 8..256
/// and a multiple of 8, head_dim % 64 == 0, d_state % 128 == 0, the three copies set with 16-byte aligned rows.
bool ssd_uses_bf16_copies(const SsdInputs& in, const SsdParams& p, int chunk_size);

/// Workspace bytes of the chunked form for these sizes (ChunkMetadataDev::workspace): dt and cumsum
/// [nchunks, H, chunk_size], chunk-end cumsums [nchunks, H], states [nchunks, H, P, N], C B^T [nchunks, G,
/// chunk_size, chunk_size], fp32; with bf16_products also bf16 copies of the chunk-entry states and, unless `in`
/// is given and its bf16 rows are what the tiles read (ssd_uses_bf16_copies), bf16 copies of x, B, C (per token
/// row, padded). A workspace sized without `in` fits every call.
size_t ssd_workspace_bytes(const SsdParams& p, int64_t nchunks, int chunk_size, const SsdInputs* in = nullptr);

/// The chunked form alone (what ssd_chunk_scan_fwd runs for chunk_size 1..256; cudaErrorInvalidValue otherwise).
/// Sizes are not re-validated here.
cudaError_t ssd_chunked_fwd(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadataDev& meta, float* y,
                            int64_t y_stride, float* chunk_states, cudaStream_t stream);

/// Decode over `batch` rows (device_decode_rows.h): a plain row is one token of the request whose state is
/// ssm_states[state_indices[b]], updated in place; a speculative verify row's tokens run one after another, token j
/// continuing from column j - 1's state and storing the state after it (rounded to the state dtype, as a plain
/// step stores it) into column j. y: [tokens, H * P] fp32. Null rows (block 0) are skipped; no two rows share a
/// block. Per token the math is the sequential prefill walk's (kernels/cpu/ssd.h ssd_state_update).
/// pdl: Programmatic Dependent Launch (pdl.cuh; the kernel waits on its predecessor in every block first, after
/// hinting the L2 to fetch its rows' state unless KernelTuning::decode_prewait is off).
cudaError_t ssd_state_update(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                             DeviceDecodeRows rows, int batch, cudaStream_t stream, bool pdl = false);

/// ssd_state_update for large decode batches (the runner uses it for more than 16 rows outside batch-invariant
/// mode): same math and arguments; for d_state 128 / 256 with fp32 or bf16 states (16- / 8-byte aligned blocks) each
/// lane owns a contiguous run of states of 8 head_dim rows (state traffic near the copy bandwidth at batch 256);
/// its y sum runs in another order than ssd_state_update's (not bit-identical). Other shapes: ssd_state_update.
/// pdl: Programmatic Dependent Launch, as ssd_state_update.
cudaError_t ssd_state_update_wide(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                                  const int32_t* state_indices, int batch, cudaStream_t stream, bool pdl = false);

}  // namespace ssmserve::cuda
