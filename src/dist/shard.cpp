// Owns the per-rank dimension splits and parameter slicing of tensor parallelism (see shard.h).
#include "dist/shard.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ssmserve::dist {
namespace {

// Adjacent ranges merged: [a, b) + [b, c) -> [a, c).
std::vector<Range> merged(const std::vector<Range>& ranges) {
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (r.size() == 0) continue;
    if (!out.empty() && out.back().end == r.begin) out.back().end = r.end;
    else out.push_back(r);
  }
  return out;
}

}  // namespace

Range even_shard(int64_t n, int rank, int world, std::string_view what) {
  SSM_CHECK(world >= 1 && rank >= 0 && rank < world, "tensor parallel: rank {} outside [0, {})", rank, world);
  SSM_CHECK(n % world == 0, "--tensor-parallel-size {} does not divide {} {}", world, what, n);
  const int64_t per = n / world;
  return {rank * per, (rank + 1) * per};
}

Range vocab_shard(int64_t n, int rank, int world) {
  SSM_CHECK(world >= 1 && rank >= 0 && rank < world, "tensor parallel: rank {} outside [0, {})", rank, world);
  const int64_t per = (n + world - 1) / world;
  return {std::min(n, rank * per), std::min(n, (rank + 1) * per)};
}

Weight slice_rows(const Weight& w, const std::vector<Range>& ranges) {
  int64_t rows = 0;
  for (const Range& r : ranges) {
    SSM_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= w.rows, "slice_rows: rows [{}, {}) outside [0, {})", r.begin, r.end, w.rows);
    rows += r.size();
  }
  const std::vector<Range> runs = merged(ranges);
  const size_t row_bytes = static_cast<size_t>(w.cols) * dtype_size(w.dtype);
  if (runs.size() <= 1) {  // one contiguous run (or nothing): a view sharing w's storage
    Weight v = w;
    v.cpu_panels.reset();
    v.rows = rows;
    if (!runs.empty()) v.data = static_cast<const std::byte*>(w.data) + runs[0].begin * row_bytes;
    return v;
  }
  Weight out = Weight::allocate(w.dtype, rows, w.cols);
  std::byte* dst = out.owned->data();
  for (const Range& r : runs) {
    std::memcpy(dst, static_cast<const std::byte*>(w.data) + r.begin * row_bytes, r.size() * row_bytes);
    dst += r.size() * row_bytes;
  }
  return out;
}

Weight slice_cols(const Weight& w, Range c) {
  SSM_CHECK(c.begin >= 0 && c.begin <= c.end && c.end <= w.cols, "slice_cols: columns [{}, {}) outside [0, {})", c.begin, c.end, w.cols);
  if (c.begin == 0 && c.end == w.cols) return w;
  Weight out = Weight::allocate(w.dtype, w.rows, c.size());
  const size_t es = dtype_size(w.dtype);
  for (int64_t r = 0; r < w.rows; ++r)
    std::memcpy(out.owned->data() + r * c.size() * es, static_cast<const std::byte*>(w.data) + (r * w.cols + c.begin) * es,
                c.size() * es);
  return out;
}

std::vector<float> slice_rows(const std::vector<float>& v, int64_t row_len, const std::vector<Range>& ranges) {
  std::vector<float> out;
  const int64_t n = row_len > 0 ? static_cast<int64_t>(v.size()) / row_len : 0;
  for (const Range& r : ranges) {
    SSM_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= n, "slice_rows: rows [{}, {}) outside [0, {})", r.begin, r.end, n);
    out.insert(out.end(), v.begin() + r.begin * row_len, v.begin() + r.end * row_len);
  }
  return out;
}

}  // namespace ssmserve::dist
