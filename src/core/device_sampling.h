// Owns the plain-data description of a sampling step run on a device (issue 7: LM head + sampling on the GPU):
// per logits row the request's sampling knobs and pre-drawn uniform, plus a compact list of per-token logit
// modifications (logit_bias, min_tokens masking, penalty history) that reproduces engine/sampler's steps 0-2.
// No dependencies: shared by the engine (packing), the model interface and the CUDA kernels.
#pragma once
#include <cstdint>
#include <vector>

namespace ssmserve {

/// LogitMod::flags bits.
inline constexpr uint32_t kLogitModBias = 1;  ///< add LogitMod::bias (logit_bias)
inline constexpr uint32_t kLogitModMask = 2;  ///< set to -inf (EOS / stop_token_ids while min_tokens is unmet)
inline constexpr uint32_t kLogitModSeen = 4;  ///< token occurs in prompt + output (repetition_penalty)

/// One token's modification of its row's raw logit, applied in sample_token's order: + bias, mask to -inf,
/// repetition penalty (x > 0 ? x / rp : x * rp, a finite x clamped to +-FLT_MAX, -inf kept), then
/// x -= frequency_penalty * count; x -= presence_penalty (the last two only when count > 0). Each id occurs at most once
/// per row.
struct LogitMod {
  int32_t id = 0;       ///< token id in [0, vocab)
  float bias = 0.0f;    ///< logit_bias value (flags & kLogitModBias)
  int32_t count = 0;    ///< occurrences in the output so far (frequency / presence penalties; 0 = none)
  uint32_t flags = 0;   ///< kLogitMod* bits
};

/// One logits row's sampling parameters (engine/sampler.h sample_token semantics).
struct SampleRowParams {
  double uniform = 0.0;   ///< the request's RequestRng::uniform() for this step, in [0, 1) (unused when greedy)
  double top_p = 1.0;     ///< (0, 1]; 1 = off
  double min_p = 0.0;     ///< [0, 1]; 0 = off
  float temperature = 0.0f;          ///< float(params.temperature); 0 = greedy (SamplingParams::greedy())
  float repetition_penalty = 1.0f;   ///< float(params.repetition_penalty)
  float frequency_penalty = 0.0f;    ///< float(params.frequency_penalty)
  float presence_penalty = 0.0f;     ///< float(params.presence_penalty)
  int32_t top_k = 0;      ///< effective top-k in [1, vocab] (vocab = off; SamplingParams::effective_top_k)
  int32_t num_top = 0;    ///< top log-probabilities to return, [0, 20]
  int32_t mods_begin = 0; ///< this row's entries are DeviceSampleBatch::mods[mods_begin, mods_begin + mods_count)
  int32_t mods_count = 0;
  /// Prompt scoring (prompt_logprobs): the next prompt token, whose raw logprob and rank the device returns
  /// (GreedyRow::score_logprob / score_rank); -1 = none. Such a row's pick is unused (pack it greedy).
  int32_t score_token = -1;
  /// 1: also return the picked token's raw rank (GreedyRow::sampled_rank; requests with logprobs, vLLM's
  /// Logprob.rank); 0: not computed (one more pass over the row).
  int32_t rank_sampled = 0;
};

/// A step's device sampling input: rows[i] for logits row i, and the concatenated per-row modification lists.
struct DeviceSampleBatch {
  std::vector<SampleRowParams> rows;
  std::vector<LogitMod> mods;
};

/// GreedyPick::token / GreedyRow::token of a row the device left to the host sampler (its candidate set did not
/// fit the device's on-chip capacity); the runner then returns the row's raw logits in GreedyPick::logits.
inline constexpr int kPickOnHost = -2;

}  // namespace ssmserve
