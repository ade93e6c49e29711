// Owns the parts every recurrent causal LM shares around its mixer stack: checking a batch against the state
// pool, the embedding lookup, and the final RMSNorm + LM head on the rows whose logits are wanted.
#pragma once
#include <cstdint>
#include <string_view>

#include "cache/state_cache.h"
#include "model/forward_batch.h"
#include "model/weight.h"

namespace ssmserve {

/// Throws Error (prefixed with `model`) if the cache has a different layer count or a state index of the
/// batch is outside the pool.
void check_batch_against_cache(const ForwardBatch& batch, const StateCache& cache, int num_state_layers,
                               std::string_view model);

/// hidden: [T, H] fp32 = embedding rows of batch.input_ids. embedding: [vocab, H].
/// Throws Error on a token id outside [0, vocab).
void embed_tokens(const ForwardBatch& batch, const Weight& embedding, float* hidden);

/// logits: [logits_indices.size(), vocab] = lm_head(rms_norm(hidden[row], norm_f)) for each requested row.
/// hidden: [T, H] fp32; norm_f: [H]; lm_head: [vocab, H].
void final_norm_and_lm_head(const ForwardBatch& batch, const float* hidden, int64_t H, const float* norm_f, float eps,
                            const Weight& lm_head, float* logits);

}  // namespace ssmserve
