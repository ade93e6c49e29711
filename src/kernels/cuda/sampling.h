// Owns greedy token selection on the GPU (issue 7: LM head + sampling on the device, only ids and log-probabilities
// back to the host): per logits row the argmax (lowest id on ties), its raw log-probability and the k most
// probable tokens, i.e. what engine/sampler.h's sample_token returns for a greedy request with no penalties and
// no min_tokens masking in effect (vLLM's greedy sampling with raw logprobs). log-sum-exp: float exp, double
// accumulation (as the CPU sampler). Framework-free: device pointers, sizes, a stream; returns the launch status
// (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/device_sampling.h"

namespace ssmserve::cuda {

/// Most top log-probabilities greedy_sample returns per row (vLLM's default max_logprobs).
inline constexpr int kMaxDeviceTopLogprobs = 20;

/// One row's result: token id and its log-probability, then num_top (id, logprob) pairs sorted by logprob
/// descending (ties: lower id first). A row whose logits hold a NaN or +inf, or are all -inf, gets token = -1
/// (the host then reports the error).
struct GreedyRow {
  int32_t token;
  float logprob;
  int32_t top_ids[kMaxDeviceTopLogprobs];
  float top_logprobs[kMaxDeviceTopLogprobs];
  /// sample_rows rows with SampleRowParams::score_token = t in [0, V): log_softmax(raw)[t] (double sum, as
  /// top_logprobs) and 1 + the number of raw logits strictly greater than raw[t] (vLLM's prompt-token rank).
  float score_logprob;
  int32_t score_rank;
  /// sample_rows rows with SampleRowParams::rank_sampled: 1 + the number of raw logits strictly greater than
  /// raw[token] (vLLM's Logprob.rank of the sampled token), else 0. greedy_sample leaves it unset (its pick is the
  /// raw argmax: rank 1).
  int32_t sampled_rank;
};

/// Multi-step decode: where greedy_sample also writes each row's pick as the next step's input id.
/// ids[rows[i]] = out[i].token (0 for an error row's -1, whose step the host reports), so the next decode step's
/// embedding reads each sequence's pick. rows: [n] int32 device (each logits row's token row, the step's
/// logits_indices); ids: [T] int32 device. The greedy kernel lets a PDL successor launch at its start: whatever
/// reads ids next must be a plain launch or pdl_wait() first (the embedding kernel waits before it reads them).
struct GreedyFeed {
  const int32_t* rows = nullptr;
  int32_t* ids = nullptr;
};

/// For each of n rows of logits [n, V] fp32 (row stride ld >= V), writes out[i] (device, [n]), and with feed the
/// picks into feed->ids (GreedyFeed). num_top in [0, kMaxDeviceTopLogprobs], clamped to V. Each row is read by a
/// cluster of 8 blocks, one slice each (max, lowest-id argmax and sum of exp(l - slice max), fixed thread order),
/// combined in slice order by the first block through distributed shared memory: the slices depend only on V, so a
/// row's result does not depend on n. cudaErrorInvalidValue for bad sizes or null pointers (a feed needs both).
cudaError_t greedy_sample(const float* logits, int64_t ld, int n, int64_t V, int num_top, GreedyRow* out,
                          cudaStream_t stream, const GreedyFeed* feed = nullptr);

/// Candidate capacity of sample_rows' sorted path (top-k / top-p rows): a row whose candidate set is larger is
/// left to the host (token = kPickOnHost).
inline constexpr int kDeviceSampleCapacity = 4096;

/// Full sampling of each of n rows of raw logits [n, V] fp32 (row stride ld >= V), as engine/sampler.h's
/// sample_token_with_uniform(logits row, params, history, rows[i].uniform) for the params the row was packed from
/// (engine/device_sampling.h): the row's LogitMod entries (logit_bias, min_tokens masking, repetition / frequency /
/// presence penalties, in that order, into work [n, V] fp32 for rows that have entries), greedy argmax when
/// temperature == 0, else temperature, top-k, top-p, min-p in the CPU sampler's order and one inverse-CDF draw with
/// rows[i].uniform over the same candidate order (id order without top-k / top-p; (logit desc, id asc) with).
/// Top-k / top-p use a threshold search (masses above m - d * T, d = 1/16 ... 128) and a bitonic sort of at most
/// kDeviceSampleCapacity candidates on chip, never a full-vocabulary sort. out[i]: the token, its raw logprob and
/// rows[i].num_top raw top logprobs (log_softmax of the unmodified row), like greedy_sample; a prompt-scoring row
/// (rows[i].score_token >= 0) also gets that token's raw logprob and rank (GreedyRow::score_logprob / score_rank).
/// token = -1: NaN / +inf raw logits, or every processed logit -inf; token = kPickOnHost: the candidate set
/// exceeded the capacity.
/// Sums use double accumulators in a different order than the CPU, so a draw can differ from the CPU only when the
/// uniform lies within ~1e-12 relative of a CDF boundary. rows, mods, work, out: device memory; work may be null
/// when no row has entries. One CTA of 1024 threads per row, 64 KiB dynamic shared memory.
cudaError_t sample_rows(const float* logits, int64_t ld, int n, int64_t V, const SampleRowParams* rows,
                        const LogitMod* mods, float* work, GreedyRow* out, cudaStream_t stream);

}  // namespace ssmserve::cuda
