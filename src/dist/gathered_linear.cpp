// Owns the gathered (exact) replacement for row-parallel projections (see gathered_linear.h).
#include "dist/gathered_linear.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/linear.h"

namespace ssmserve::dist {

void all_gather_columns(const float* x, int64_t T, int64_t k, int64_t x_stride, Communicator& comm, float* x_full,
                        int64_t full_stride, std::vector<float>& scratch) {
  const int W = comm.world_size();
  const size_t need = static_cast<size_t>((W + 1) * T * k);
  if (scratch.size() < need) scratch.resize(need);
  float* mine = scratch.data();          // [T, k] this rank's shard, contiguous
  float* all = scratch.data() + T * k;   // [W, T, k]
  for (int64_t t = 0; t < T; ++t) std::copy_n(x + t * x_stride, k, mine + t * k);
  comm.all_gather(mine, T * k, all);
  for (int r = 0; r < W; ++r)
    for (int64_t t = 0; t < T; ++t) std::copy_n(all + (r * T + t) * k, k, x_full + t * full_stride + r * k);
}

void output_split_linear(const float* x, int64_t T, int64_t K, const Weight& w_rows, const float* bias, int64_t n_out,
                         Communicator& comm, float* y, int64_t y_stride, std::vector<float>& scratch) {
  const int W = comm.world_size();
  const Range mine = output_shard(n_out, comm.rank(), W);
  const int64_t per = (n_out + W - 1) / W;
  SSM_CHECK(w_rows.rows == mine.size() && (w_rows.rows == 0 || w_rows.cols == K),
            "output_split_linear: rank {} holds a [{}, {}] weight, expected [{}, {}]", comm.rank(), w_rows.rows, w_rows.cols,
            mine.size(), K);
  thread_local std::vector<float> part;  // [T, per] this rank's columns (padded); one thread drives one rank
  part.assign(static_cast<size_t>(T * per), 0.0f);
  if (mine.size() > 0 && T > 0) cpu::linear(x, T, K, w_rows, bias, part.data(), per);
  all_gather_output_columns(part.data(), T, n_out, comm, y, y_stride, scratch);
}

void all_gather_output_columns(const float* part, int64_t T, int64_t n_out, Communicator& comm, float* y, int64_t y_stride,
                               std::vector<float>& scratch) {
  const int W = comm.world_size();
  const int64_t per = (n_out + W - 1) / W;
  if (scratch.size() < static_cast<size_t>(W * T * per)) scratch.resize(static_cast<size_t>(W * T * per));
  float* all = scratch.data();  // [W, T, per]
  comm.all_gather(part, T * per, all);
  for (int r = 0; r < W; ++r) {
    const int64_t c0 = r * per, n = std::max<int64_t>(0, std::min(n_out, c0 + per) - c0);
    for (int64_t t = 0; t < T; ++t) std::copy_n(all + (r * T + t) * per, n, y + t * y_stride + c0);
  }
}

}  // namespace ssmserve::dist
