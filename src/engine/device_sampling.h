// Owns the host side of device sampling (issue 7): packing one request's sampling parameters, pre-drawn uniform and
// token history into the plain rows the device sampler reads (model/device_sampling.h), and the CPU reference of
// how the device applies those rows' logit modifications.
#pragma once
#include <span>
#include <vector>

#include "engine/sampling_params.h"
#include "core/device_sampling.h"

namespace ssmserve {

/// Fills `row` and appends the row's logit modifications to `mods` (row.mods_begin = mods.size() on entry), so that
/// apply_logit_mods(logits, row, mods) == process_logits(logits, params, prompt_ids, output_ids, eos_token_ids)
/// bit for bit: one entry per distinct token that has a logit_bias, is banned by bad_words_token_ids at this position
/// or masked by min_tokens (EOS unless ignore_eos, stop_token_ids), occurs in prompt + output (repetition_penalty != 1)
/// or in the output (frequency / presence penalty != 0). Cost O(|prompt| + |output| + |logit_bias| + bad-word tokens)
/// with a reusable per-thread vocab table. allowed_token_ids is not packed: rows with it are sampled on the host.
/// uniform: the request's rng.uniform() for this step (callers draw it only when !params.greedy()).
/// vocab: the model's vocabulary size; params must have been validate()d.
/// Throws ssmserve::Error (same messages as the CPU sampler) on history / EOS / stop / logit_bias / bad-word ids outside
/// [0, vocab).
void pack_sample_row(const SamplingParams& params, std::span<const int> prompt_ids, std::span<const int> output_ids,
                     std::span<const int> eos_token_ids, int vocab, double uniform, SampleRowParams& row,
                     std::vector<LogitMod>& mods);

/// The device's step 0-2 on the host: applies row's entries of `mods` to logits: [vocab] fp32 in place, in
/// sample_token's order per token (see LogitMod). Ids outside [0, vocab) are skipped.
void apply_logit_mods(std::span<float> logits, const SampleRowParams& row, std::span<const LogitMod> mods);

/// True when the packed row changes nothing (no modification entries): the device then samples the raw row.
inline bool row_has_mods(const SampleRowParams& row) { return row.mods_count > 0; }

}  // namespace ssmserve
