// Owns the depthwise causal conv1d of the Mamba mixers on the GPU: the varlen prefill form (initial states,
// window write-back) and the one-token decode update, with the semantics of kernels/cpu/causal_conv1d.h (its
// reference; vLLM's causal_conv1d_fn / causal_conv1d_update; vllm-ssm-design.md §3.1): the window holds the last
// K-1 pre-convolution inputs, newest last. fp32 math with the CPU's fma order (bias, then taps oldest to newest),
// so an fp32 window gives the CPU's results bit for bit. Framework-free: device pointers, sizes, strides
// (elements), a stream; each returns the launch status (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cache/state_view.h"

namespace ssmserve::cuda {

/// Parameters shared by both forms (all pointers on the device).
struct ConvParams {
  int64_t dim = 0;                ///< channels
  int width = 0;                  ///< kernel size K (d_conv), 1..8
  const float* weight = nullptr;  ///< [dim, width] fp32
  const float* bias = nullptr;    ///< [dim] fp32 or nullptr
  StateView conv_states;          ///< [num_blocks, width-1, dim] block-strided, F32/BF16/F16; block 0 = null
  bool apply_silu = true;
};

/// Varlen prefill. x: [num_tokens, dim] fp32 (row stride x_stride), packed sequences delimited by
/// query_start_loc [num_seqs+1] (device, query_start_loc[num_seqs] == num_tokens); out: [num_tokens, dim] fp32
/// (row stride out_stride, must not alias x). Sequence s starts from conv_states[state_indices[s]] when
/// has_initial_states[s] (else zeros) and its window is overwritten with the last width-1 inputs. Sequences
/// whose state index is 0 are skipped (their out rows are not written). Two launches on `stream`.
cudaError_t causal_conv1d_fwd(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                              const int32_t* query_start_loc, const int32_t* state_indices,
                              const uint8_t* has_initial_states, int num_seqs, int64_t num_tokens,
                              cudaStream_t stream);

/// causal_conv1d_fwd that also writes out_bf16 [num_tokens, dim] (row stride out_bf16_stride), the bf16
/// rounding of `out` (x_proj's input: no separate cast pass), or skips it when out_bf16 is nullptr. With
/// out_bf16 set, out may be nullptr (only the bf16 copy is written; out_stride is then ignored).
cudaError_t causal_conv1d_fwd_dual(const float* x, int64_t x_stride, float* out, int64_t out_stride, void* out_bf16,
                                   int64_t out_bf16_stride, const ConvParams& p, const int32_t* query_start_loc,
                                   const int32_t* state_indices, const uint8_t* has_initial_states, int num_seqs,
                                   int64_t num_tokens, cudaStream_t stream);

/// Decode: one new input per row. x: [batch, dim] fp32 (row stride x_stride), out: [batch, dim] fp32 (row stride
/// out_stride). Row b reads and updates conv_states[state_indices[b]] in place; rows with index 0 are skipped.
/// Two rows must not share a nonzero state index.
cudaError_t causal_conv1d_update(const float* x, int64_t x_stride, float* out, int64_t out_stride,
                                 const ConvParams& p, const int32_t* state_indices, int batch, cudaStream_t stream);

}  // namespace ssmserve::cuda
