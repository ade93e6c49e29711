// Owns the vocab-parallel embedding and LM head (see vocab_parallel.h).
#include "model/vocab_parallel.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"

namespace ssmserve::dist {

void embed_tokens_vocab_parallel(const ForwardBatch& batch, const Weight& embedding, int64_t vocab, Communicator& comm,
                                 float* hidden) {
  const Range shard = vocab_shard(vocab, comm.rank(), comm.world_size());
  const int64_t T = batch.num_tokens(), H = embedding.cols;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t id = batch.input_ids[t];
    SSM_CHECK(id >= 0 && id < vocab, "token id {} is outside the vocabulary [0, {})", id, vocab);
    if (id >= shard.begin && id < shard.end) cpu::weight_row_to_f32(embedding, id - shard.begin, hidden + t * H);
    else std::fill_n(hidden + t * H, H, 0.0f);
  }
  comm.all_reduce_sum(hidden, T * H);
}

void final_norm_and_lm_head_vocab_parallel(const ForwardBatch& batch, const float* hidden, int64_t H, const float* norm_f,
                                           float eps, const Weight& lm_head, int64_t vocab, Communicator& comm, float* logits) {
  const int64_t M = static_cast<int64_t>(batch.logits_indices.size());
  if (M == 0) return;  // the same on every rank: no collective
  const int W = comm.world_size();
  const int64_t per = (vocab + W - 1) / W;  // vocab_shard's rows per rank; the last ranks pad with zeros
  std::vector<float> rows(M * H), local(M * per, 0.0f), all(W * M * per);  // [M, H], [M, per], [W, M, per]
  for (int64_t i = 0; i < M; ++i) std::copy_n(hidden + batch.logits_indices[i] * H, H, rows.data() + i * H);
  cpu::rms_norm(rows.data(), norm_f, eps, M, H, rows.data());
  if (lm_head.rows > 0) cpu::linear(rows.data(), M, H, lm_head, nullptr, local.data(), per);
  comm.all_gather(local.data(), M * per, all.data());
  if (!logits) return;
  for (int r = 0; r < W; ++r) {
    const int64_t v0 = r * per, n = std::max<int64_t>(0, std::min(vocab, v0 + per) - v0);
    for (int64_t i = 0; i < M; ++i) std::copy_n(all.data() + (r * M + i) * per, n, logits + i * vocab + v0);
  }
}

}  // namespace ssmserve::dist
