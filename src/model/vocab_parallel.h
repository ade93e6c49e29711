// Owns the vocab-parallel embedding and LM head (vLLM's VocabParallelEmbedding / ParallelLMHead; in model/, since
// they read the ForwardBatch; dist/ holds the collectives): each rank holds the rows [shard.begin, shard.end) of the [vocab, H] matrix; the embedding all-reduces the rows (the
// owning rank contributes the row, the others zeros, so the sum is exact), the LM head all-gathers the logits.
#pragma once
#include <cstdint>

#include "dist/communicator.h"
#include "dist/shard.h"
#include "model/forward_batch.h"
#include "core/weight.h"

namespace ssmserve::dist {

/// hidden: [T, H] fp32 = embedding rows of batch.input_ids, on every rank. embedding: [shard.size(), H], the rows
/// vocab_shard(vocab, comm.rank(), comm.world_size()) of the [vocab, H] table. Collective (one all_reduce_sum of
/// T * H). Throws Error (on every rank) on a token id outside [0, vocab).
void embed_tokens_vocab_parallel(const ForwardBatch& batch, const Weight& embedding, int64_t vocab, Communicator& comm,
                                 float* hidden);

/// logits: [logits_indices.size(), vocab] = lm_head(rms_norm(hidden[row], norm_f)) for each requested row, written
/// only when logits is not null (the other ranks still take part). hidden: [T, H] fp32 (identical on every rank);
/// norm_f: [H]; lm_head: [shard.size(), H], the rows of vocab_shard(vocab, rank, world). Collective (one all_gather).
void final_norm_and_lm_head_vocab_parallel(const ForwardBatch& batch, const float* hidden, int64_t H, const float* norm_f,
                                           float eps, const Weight& lm_head, int64_t vocab, Communicator& comm, float* logits);

}  // namespace ssmserve::dist
