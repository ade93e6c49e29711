// Owns the host-side packing of device sampling rows (see device_sampling.h).
#include "engine/device_sampling.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "engine/bad_words.h"

namespace ssmserve {
namespace {

void check_ids(std::span<const int> ids, int vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    SSM_CHECK(ids[i] >= 0 && ids[i] < vocab, "sampler: {}[{}] = {} is outside the vocabulary [0, {})", what, i, ids[i],
              vocab);
}

}  // namespace

void pack_sample_row(const SamplingParams& p, std::span<const int> prompt_ids, std::span<const int> output_ids,
                     std::span<const int> eos_token_ids, int vocab, double uniform, SampleRowParams& row,
                     std::vector<LogitMod>& mods) {
  SSM_CHECK(vocab > 0, "pack_sample_row: vocab must be > 0, got {}", vocab);
  check_ids(prompt_ids, vocab, "prompt_ids");
  check_ids(output_ids, vocab, "output_ids");
  row = SampleRowParams{};
  row.uniform = uniform;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.temperature = p.greedy() ? 0.0f : static_cast<float>(p.temperature);
  row.repetition_penalty = static_cast<float>(p.repetition_penalty);
  row.frequency_penalty = static_cast<float>(p.frequency_penalty);
  row.presence_penalty = static_cast<float>(p.presence_penalty);
  row.top_k = p.effective_top_k(vocab);
  row.num_top = p.logprobs.value_or(0);
  row.rank_sampled = p.logprobs.has_value() ? 1 : 0;
  row.mods_begin = static_cast<int32_t>(mods.size());

  // slot[id] = index of id's entry in mods + 1 (0 = none); all-zero between calls.
  thread_local std::vector<int32_t> slot;
  if (static_cast<int>(slot.size()) < vocab) slot.resize(vocab, 0);
  const size_t first = mods.size();
  auto entry = [&](int id) -> LogitMod& {
    if (slot[id] == 0) {
      mods.push_back(LogitMod{id, 0.0f, 0, 0});
      slot[id] = static_cast<int32_t>(mods.size() - first);
    }
    return mods[first + slot[id] - 1];
  };
  try {
    for (const auto& [id, bias] : p.logit_bias) {
      SSM_CHECK(id >= 0 && id < vocab, "sampler: logit_bias token id {} is outside the vocabulary [0, {})", id, vocab);
      LogitMod& m = entry(id);
      m.bias = bias;
      m.flags |= kLogitModBias;
    }
    // bad_words: the tokens banned at this position, masked (-inf absorbs the bias and penalties, so the mask's place
    // in the device's per-token order gives process_logits' result).
    for_each_banned_token(p.bad_words_token_ids, output_ids, [&](int t) {
      SSM_CHECK(t >= 0 && t < vocab, "sampler: bad_words token id {} is outside the vocabulary [0, {})", t, vocab);
      entry(t).flags |= kLogitModMask;
    });
    if (static_cast<int>(output_ids.size()) < p.min_tokens) {
      if (!p.ignore_eos) {
        check_ids(eos_token_ids, vocab, "eos_token_ids");
        for (const int t : eos_token_ids) entry(t).flags |= kLogitModMask;
      }
      check_ids(p.stop_token_ids, vocab, "stop_token_ids");
      for (const int t : p.stop_token_ids) entry(t).flags |= kLogitModMask;
    }
    if (p.repetition_penalty != 1.0) {
      for (const int t : prompt_ids) entry(t).flags |= kLogitModSeen;
      for (const int t : output_ids) entry(t).flags |= kLogitModSeen;
    }
    if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
      for (const int t : output_ids) ++entry(t).count;
  } catch (...) {
    for (size_t i = first; i < mods.size(); ++i) slot[mods[i].id] = 0;
    mods.resize(first);
    throw;
  }
  for (size_t i = first; i < mods.size(); ++i) slot[mods[i].id] = 0;
  row.mods_count = static_cast<int32_t>(mods.size() - first);
}

void apply_logit_mods(std::span<float> logits, const SampleRowParams& row, std::span<const LogitMod> mods) {
  const int vocab = static_cast<int>(logits.size());
  const float rp = row.repetition_penalty, fp = row.frequency_penalty, pp = row.presence_penalty;
  for (int j = 0; j < row.mods_count; ++j) {
    const LogitMod& m = mods[static_cast<size_t>(row.mods_begin) + j];
    if (m.id < 0 || m.id >= vocab) continue;
    float x = logits[m.id];
    if (m.flags & kLogitModBias) x += m.bias;
    if (m.flags & kLogitModMask) x = -std::numeric_limits<float>::infinity();
    if (m.flags & kLogitModSeen) {  // finite stays finite, -inf stays -inf (the device kernel's clamp)
      constexpr float kMax = std::numeric_limits<float>::max();
      if (x > 0.0f) x = std::min(x / rp, kMax);
      else if (x != -std::numeric_limits<float>::infinity()) x = std::max(x * rp, -kMax);
    }
    if (m.count > 0) {
      x -= fp * static_cast<float>(m.count);
      x -= pp;
    }
    logits[m.id] = x;
  }
}

}  // namespace ssmserve
