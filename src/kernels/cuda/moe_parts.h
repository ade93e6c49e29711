// Owns the entry points to sparse_moe's sort and combine kernels (moe_parts.cu) and its fused down + combine
// (moe_down_combine.cu): sparse_moe's, and the tests' and
// benchmarks' that compare their forms (KernelTuning::prefill_row_kernels) alone.
// Framework-free: device pointers, sizes, a stream; each returns the launch status.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/moe.h"

namespace ssmserve::cuda::detail {

/// Sorts P (token, slot) pairs by expert: offsets [E + 1] (expert e owns sorted rows [offsets[e], offsets[e + 1])),
/// sorted [P] (row -> pair index t * top_k + slot), pair_row [P] (its inverse). The order of one expert's pairs is
/// unspecified (shared-memory atomics). ids: [P] int32 in [0, E), E <= 1024. counts: the multi-block form's
/// scratch, moe_sort_counts_bytes(P, E) bytes (null when that is 0). The form: one block (the old one) unless
/// KernelTuning::prefill_row_kernels and P >= kMoeSortMultiMinPairs.
cudaError_t moe_sort_pairs(const int32_t* ids, int64_t P, int E, int32_t* offsets, int32_t* sorted, int32_t* pair_row,
                           int32_t* counts, cudaStream_t stream, bool pdl);
/// The multi-block sort's scratch bytes for P pairs of E experts (0: the one-block form).
size_t moe_sort_counts_bytes(int64_t P, int E);

/// sparse_moe's combine: out[t, c] = sum over t's slots in ascending expert id (ties: slot order) of
/// wts[t * top_k + k] * y[pair_row[t * top_k + k], c], then the shared add (MoeSharedAdd, `x` resolved: non-null
/// when shared->gate is; shared->ready is not waited for here), with the form moe_combine_per_token(T) picks (the
/// column slices where out / y / shared->y rows are not 16-byte aligned). y: [P, hidden] fp32 contiguous; ids, wts,
/// pair_row: [T, top_k]; out: [T, hidden] fp32 (row stride os).
cudaError_t moe_combine(const float* y, int64_t hidden, const int32_t* ids, const float* wts, const int32_t* pair_row,
                        int64_t T, int top_k, float* out, int64_t os, const MoeSharedAdd* shared, cudaStream_t stream,
                        bool pdl);

/// Whether moe_down_combine takes a step of T tokens: top_k <= 16 act rows of `intermediate` bf16 in 47 KB of shared
/// memory (48 KB without an opt-in, less the kernel's static arrays), and a gated shared add only at top_k == 8 (the combine's 256-thread block, so its gate dot's bits).
bool moe_down_combine_fits(int64_t T, int top_k, int64_t hidden, int64_t intermediate, const MoeSharedAdd* shared);

/// sparse_moe's down GEMV and combine in one launch (KernelTuning::moe_down_combine; the unsorted per-pair rows of
/// decode-sized steps): out[t, n] = sum over t's slots in ascending expert id (ties: slot order) of
/// wts[p] * (act[p] . w2[ids[p], n]), p = t * top_k + slot, then the shared add (as moe_combine; shared->ready is not
/// waited for here). The same bits as the per-pair down GEMV with `rows` output rows per warp (1, 2 or 4) followed by
/// moe_combine. act: [T * top_k, intermediate] bf16; ids, wts: [T, top_k]; w2: [E, hidden, intermediate] bf16; out:
/// [T, hidden] fp32 (row stride os). preload: ids and the first weight chunks read before the PDL wait (ids written
/// two launches back, as PairGemvArgs::preload). cudaErrorInvalidValue outside moe_down_combine_fits or bad strides.
cudaError_t moe_down_combine(const __nv_bfloat16* act, const int32_t* ids, const float* wts, int64_t T, int top_k,
                             const __nv_bfloat16* w2, int64_t hidden, int64_t intermediate, int rows, float* out,
                             int64_t os, const MoeSharedAdd* shared, bool preload, cudaStream_t stream, bool pdl);

}  // namespace ssmserve::cuda::detail
