// Owns how tensor parallelism splits a dimension across ranks and cuts a rank's slice out of a loaded parameter
// (vllm-ssm-design.md §3.1, §5): row slices of a matrix stay views into the memory-mapped checkpoint when they
// are one contiguous range; several row ranges or a column slice become an owned copy.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "core/weight.h"

namespace ssmserve::dist {

/// A half-open index range [begin, end) of one dimension.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

/// Rank `rank`'s equal share of a dimension of size n split over `world` ranks: [rank * n / world, ...).
/// Throws Error "tensor-parallel-size W does not divide <what> N" when world does not divide n.
Range even_shard(int64_t n, int rank, int world, std::string_view what);

/// Rank `rank`'s share of a vocabulary of size n: ceil(n / world) rows per rank, the last ranks holding fewer
/// (possibly none); vLLM pads the vocabulary instead, with the same effect on the logits.
Range vocab_shard(int64_t n, int rank, int world);

/// The rows `ranges` (in order) of w [rows, cols] as one [sum of sizes, cols] weight of w's dtype: a view into
/// w's storage (sharing it) when the ranges form one contiguous run, else an owned copy. Drops w's packed panels
/// (call cpu::pack_for_linear on the result). Throws Error on a range outside [0, w.rows).
Weight slice_rows(const Weight& w, const std::vector<Range>& ranges);

/// Columns [c.begin, c.end) of w [rows, cols] as an owned [rows, c.size()] weight of w's dtype (the whole w,
/// shared, when c covers every column). Throws Error on a range outside [0, w.cols).
Weight slice_cols(const Weight& w, Range c);

/// The elements of the rows `ranges` of a row-major [n, row_len] fp32 parameter, concatenated in order.
/// Throws Error when a range is outside the parameter.
std::vector<float> slice_rows(const std::vector<float>& v, int64_t row_len, const std::vector<Range>& ranges);

}  // namespace ssmserve::dist
