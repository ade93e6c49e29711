// Owns the description of one Mamba-1 decoder layer on the device that the whole-stack decode kernel
// (dataflow_decode.h) and its tests read: the layer shape and its weights' and states' device pointers.
#pragma once
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

}  // namespace ssmserve::cuda
