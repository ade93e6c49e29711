// Owns the CPU backend's exact replacement for row-parallel projections (issue 9): instead of each rank multiplying
// its column shard of the input by its column slice of W and all-reducing the partial sums (vLLM's
// RowParallelLinear, whose summation order differs from one GEMM over K), the ranks all-gather the input shards
// and each computes its share of the *output* columns over the whole K with cpu::linear -- every element one FMA
// chain over k = 0..K-1, as the unsharded product computes it -- then all-gather the outputs. TP = N is then
// bit-identical to TP = 1, with the compute and the weight still split N ways, for about 1.5x the communicated
// volume (cheap between in-process ranks). The NCCL/GPU path keeps RowParallelLinear + all-reduce.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "dist/shard.h"
#include "core/weight.h"

namespace ssmserve::dist {

/// The output rows rank `rank` computes in output_split_linear: ceil(n / world) per rank, the last ranks fewer
/// (possibly none) -- the same split as vocab_shard.
inline Range output_shard(int64_t n, int rank, int world) { return vocab_shard(n, rank, world); }

/// x_full [T, world * k] (row stride full_stride) = every rank's column shard x [T, k] (row stride x_stride) side
/// by side in rank order. Collective (one all_gather of T * k). `scratch` is grown as needed.
void all_gather_columns(const float* x, int64_t T, int64_t k, int64_t x_stride, Communicator& comm, float* x_full,
                        int64_t full_stride, std::vector<float>& scratch);

/// y [T, n_out] (row stride y_stride) = every rank's output columns output_shard(n_out, rank, world), rank r's taken
/// from its part [T, ceil(n_out / world)] (contiguous; columns past its shard ignored). Collective (one all_gather).
void all_gather_output_columns(const float* part, int64_t T, int64_t n_out, Communicator& comm, float* y, int64_t y_stride,
                               std::vector<float>& scratch);

/// y [T, n_out] (row stride y_stride) = x [T, K] W^T (+ bias), where this rank holds W's rows
/// output_shard(n_out, rank, world) as w_rows [rows, K] (and their bias, or nullptr); x is identical on every
/// rank. Collective (one all_gather). Throws Error when w_rows does not have that shard's row count or K columns.
void output_split_linear(const float* x, int64_t T, int64_t K, const Weight& w_rows, const float* bias, int64_t n_out,
                         Communicator& comm, float* y, int64_t y_stride, std::vector<float>& scratch);

}  // namespace ssmserve::dist
