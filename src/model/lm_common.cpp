// Owns the shared embedding / final-norm / LM-head steps and the batch checks (see lm_common.h).
#include "model/lm_common.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"

namespace ssmserve {

void check_batch_against_cache(const ForwardBatch& batch, const StateCache& cache, int num_state_layers,
                               std::string_view model) {
  batch.validate();
  SSM_CHECK(cache.num_layers() == num_state_layers, "{} forward: state cache has {} layers, model {}", model,
            cache.num_layers(), num_state_layers);
  for (const auto* v : {&batch.meta.state_indices_tensor_d, &batch.meta.state_indices_tensor_p, &batch.meta.state_indices_spec_d,
                        &batch.meta.state_store_block_p})
    for (int32_t b : *v) SSM_CHECK(b >= 0 && b < cache.num_blocks(), "{} forward: state index {} out of range", model, b);
}

void embed_tokens(const ForwardBatch& batch, const Weight& embedding, float* hidden) {
  const int64_t V = embedding.rows, H = embedding.cols;
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    const int32_t id = batch.input_ids[t];
    SSM_CHECK(id >= 0 && id < V, "token id {} is outside the vocabulary [0, {})", id, V);
    cpu::weight_row_to_f32(embedding, id, hidden + t * H);
  }
}

void final_norm_and_lm_head(const ForwardBatch& batch, const float* hidden, int64_t H, const float* norm_f, float eps,
                            const Weight& lm_head, float* logits) {
  const int64_t M = static_cast<int64_t>(batch.logits_indices.size());
  if (M == 0) return;
  std::vector<float> rows(M * H);  // [M, H]
  for (int64_t i = 0; i < M; ++i) std::copy_n(hidden + batch.logits_indices[i] * H, H, rows.data() + i * H);
  cpu::rms_norm(rows.data(), norm_f, eps, M, H, rows.data());
  cpu::linear(rows.data(), M, lm_head, nullptr, logits);
}

}  // namespace ssmserve
