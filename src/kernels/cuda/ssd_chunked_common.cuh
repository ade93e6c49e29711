// Owns what the chunked SSD's TF32 tiles (ssd_chunked.cu) and bf16 tiles (ssd_chunked_bf16.cu) share: the
// workspace pieces, the chunk predicates and the bf16 launches' entry points. Internal to those two files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ssd.h"

namespace ssmserve::cuda::detail {

constexpr int kSsdMaxChunk = 256;

/// Workspace pieces (device). The bf16 ones are null unless the bf16 tiles run.
struct SsdWs {
  float* dt = nullptr;       // [nchunks, H, L]
  float* cs = nullptr;       // [nchunks, H, L]
  float* cs_last = nullptr;  // [nchunks, H]
  float* states = nullptr;   // [nchunks, H, P, N] (S_c, then s_in in place)
  float* cb = nullptr;       // [nchunks, G, L, L]
  // bf16 x, B, C per token row of the call: the caller's copies (SsdInputs::x_h ...) or the convert kernel's
  // (head_dim padded with zeros to Pp, d_state to Np; rows [nchunks * L, H * Pp] / [nchunks * L, G * Np]).
  const __nv_bfloat16* xh = nullptr;  // x[t, h, p] = xh[t * xh_stride + h * Pp + p]
  const __nv_bfloat16* bh = nullptr;  // B[t, g, n] = bh[t * bh_stride + g * Np + n]
  const __nv_bfloat16* ch = nullptr;  // C likewise
  int64_t xh_stride = 0, bh_stride = 0, ch_stride = 0;
  __nv_bfloat16* states_h = nullptr;  // [nchunks, H, P, N] s_in rounded (state passing writes it)
  int Pp = 0, Np = 0;  // head_dim rounded up to 64, d_state rounded up to 128
};

/// The chunk's sequence has a real state block (else every kernel skips the chunk).
__device__ __forceinline__ bool chunk_live(const ChunkMetadataDev& m, int c) {
  return m.state_indices[m.seq_idx[c]] != 0;
}
__device__ __forceinline__ int chunk_tokens(const ChunkMetadataDev& m, int c) {
  return min(m.cu_chunk_seqlen[c + 1] - m.cu_chunk_seqlen[c], m.chunk_size);
}

/// Whether the bf16 tiles take these sizes (bf16_products asked, 16-byte aligned rows of C B^T and states).
inline bool ssd_bf16_tiles(const SsdParams& p, int chunk_size) {
  return p.bf16_products && chunk_size % 8 == 0 && p.d_state % 8 == 0;
}
inline int ssd_pad_head_dim(int P) { return (P + 63) / 64 * 64; }
inline int ssd_pad_d_state(int N) { return (N + 127) / 128 * 128; }

/// bf16 copies of x, B, C for the bf16 tiles into xh / bh / ch (the workspace; padded layout of SsdWs).
cudaError_t ssd_bf16_convert(const SsdInputs& in, const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws,
                             __nv_bfloat16* xh, __nv_bfloat16* bh, __nv_bfloat16* ch, cudaStream_t stream);
/// C B^T (fp32, into ws.cb; the tiles on or below the diagonal) from ws.bh, ws.ch.
cudaError_t ssd_bf16_cb(const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws, cudaStream_t stream);
/// The chunk states S_c (fp32, into ws.states) from ws.xh, ws.bh, ws.dt, ws.cs, ws.cs_last.
cudaError_t ssd_bf16_chunk_state(const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws, cudaStream_t stream);
/// y from ws.cb (fp32), ws.xh (also the D term's x), ws.ch, ws.states_h, ws.dt, ws.cs.
cudaError_t ssd_bf16_chunk_scan(const SsdInputs& in, const SsdParams& p, const ChunkMetadataDev& m, const SsdWs& ws,
                                float* y, int64_t y_stride, cudaStream_t stream);

}  // namespace ssmserve::cuda::detail
