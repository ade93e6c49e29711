// Owns the sampling math: RequestRng, penalties, min_tokens masking, greedy / top-k / top-p / min-p draws and
// raw-distribution logprobs (vLLM v1 Sampler semantics for one row). Its vectorized reductions over the vocabulary
// are CPU kernels (kernels/cpu/sampling.h), compiled per instruction-set variant.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "engine/bad_words.h"
#include "kernels/cpu/sampling.h"

namespace ssmserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kMaxLogit = std::numeric_limits<float>::max();  ///< a finite logit's bound after the penalties

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Max of logits; throws on empty input, NaN or +inf.
float checked_max(std::span<const float> logits) {
  SSM_CHECK(!logits.empty(), "sampler: logits are empty");
  int nans = 0;
  const float m = cpu::lane_max(logits.data(), static_cast<int>(logits.size()), &nans);
  if (nans > 0) {
    const auto it = std::find_if(logits.begin(), logits.end(), [](float x) { return std::isnan(x); });
    fail("sampler: logits[{}] is NaN", it - logits.begin());
  }
  SSM_CHECK(m != std::numeric_limits<float>::infinity(), "sampler: logits contain +inf");
  return m;
}

double log_sum_exp_with_max(std::span<const float> logits, float m) {
  SSM_CHECK(m != kNegInf, "sampler: every logit is -inf (all tokens masked)");
  const double sum = cpu::sum_exp(logits.data(), static_cast<int>(logits.size()), m, 1.0f, nullptr);
  return static_cast<double>(m) + std::log(sum);
}

/// Sort key whose ascending order is (x desc, id asc) for non-NaN x (-0 and +0 compare equal).
inline uint64_t desc_key(float x, int id) {
  uint32_t b;
  x += 0.0f;  // -0 -> +0
  std::memcpy(&b, &x, sizeof b);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // ascending-order-preserving
  return (static_cast<uint64_t>(~b) << 32) | static_cast<uint32_t>(id);
}

/// Top-k of raw logits by (logit desc, id asc) with logprobs relative to lse.
std::vector<TokenLogprob> top_k_logprobs(std::span<const float> logits, int k, double lse) {
  std::vector<TokenLogprob> out;
  if (k <= 0) return out;
  std::vector<int> ids;
  const int n = static_cast<int>(logits.size());
  cpu::top_k_ids(logits.data(), n, std::min(k, n), ids);
  out.reserve(ids.size());
  for (const int id : ids)
    out.push_back({id, static_cast<float>(static_cast<double>(logits[id]) - lse), static_cast<int>(out.size()) + 1});
  return out;
}

}  // namespace

uint64_t derived_request_seed(uint64_t engine_seed, uint64_t index) {
  return splitmix64(splitmix64(engine_seed) + index);
}

int raw_rank(std::span<const float> logits, float x) {
  return 1 + static_cast<int>(std::count_if(logits.begin(), logits.end(), [x](float v) { return v > x; }));
}

namespace {

void check_ids(std::span<const int> ids, int vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    SSM_CHECK(ids[i] >= 0 && ids[i] < vocab, "sampler: {}[{}] = {} is outside the vocabulary [0, {})", what, i,
              ids[i], vocab);
  }
}

/// Repetition (prompt + output), then frequency and presence (output) penalties, in place; vLLM v1 order.
void apply_penalties(float* l, int vocab, const SamplingParams& p, std::span<const int> prompt_ids,
                     std::span<const int> output_ids) {
  if (p.repetition_penalty != 1.0) {
    thread_local std::vector<uint8_t> seen;  // all-zero between calls
    if (static_cast<int>(seen.size()) < vocab) seen.resize(vocab, 0);
    const float rp = static_cast<float>(p.repetition_penalty);
    auto apply = [&](int t) {
      if (seen[t]) return;
      seen[t] = 1;
      // A finite logit stays finite (a tiny penalty would overflow it to inf, and inf - inf leaves no token with a
      // positive probability); a masked one stays -inf.
      if (l[t] > 0.0f) l[t] = std::min(l[t] / rp, kMaxLogit);
      else if (l[t] != kNegInf) l[t] = std::max(l[t] * rp, -kMaxLogit);
    };
    for (const int t : prompt_ids) apply(t);
    for (const int t : output_ids) apply(t);
    for (const int t : prompt_ids) seen[t] = 0;
    for (const int t : output_ids) seen[t] = 0;
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    thread_local std::vector<uint32_t> counts;  // all-zero between calls
    if (static_cast<int>(counts.size()) < vocab) counts.resize(vocab, 0);
    const float fp = static_cast<float>(p.frequency_penalty);
    const float pp = static_cast<float>(p.presence_penalty);
    for (const int t : output_ids) ++counts[t];
    for (const int t : output_ids) {
      if (counts[t] == 0) continue;  // already applied
      l[t] -= fp * static_cast<float>(counts[t]);
      l[t] -= pp;
      counts[t] = 0;
    }
  }
}

/// allowed_token_ids, bad_words, logit_bias, min_tokens masking, then penalties, in place; prompt / output ids already
/// range-checked.
void process_logits_unchecked(float* l, int vocab, const SamplingParams& params, std::span<const int> prompt_ids,
                              std::span<const int> output_ids, std::span<const int> eos_token_ids) {
  if (!params.allowed_token_ids.empty()) {  // vLLM applies the allowed set first
    check_ids(params.allowed_token_ids, vocab, "allowed_token_ids");
    thread_local std::vector<float> keep;
    keep.assign(static_cast<size_t>(vocab), kNegInf);
    for (const int t : params.allowed_token_ids) keep[t] = l[t];
    std::copy(keep.begin(), keep.end(), l);
  }
  if (!params.bad_words_token_ids.empty())  // then the bad words (vLLM's order)
    apply_bad_words(std::span<float>(l, static_cast<size_t>(vocab)), params.bad_words_token_ids, output_ids);
  for (const auto& [id, bias] : params.logit_bias) {
    SSM_CHECK(id >= 0 && id < vocab, "sampler: logit_bias token id {} is outside the vocabulary [0, {})", id, vocab);
    l[id] += bias;
  }
  if (static_cast<int>(output_ids.size()) < params.min_tokens) {
    if (!params.ignore_eos) {
      check_ids(eos_token_ids, vocab, "eos_token_ids");
      for (const int t : eos_token_ids) l[t] = kNegInf;
    }
    check_ids(params.stop_token_ids, vocab, "stop_token_ids");
    for (const int t : params.stop_token_ids) l[t] = kNegInf;
  }
  apply_penalties(l, vocab, params, prompt_ids, output_ids);
}

int argmax_lowest_id(const float* l, int vocab) {
  const float m = cpu::lane_max(l, vocab);
  SSM_CHECK(m != kNegInf,
            "sampler: every logit is -inf after masking (allowed_token_ids / bad_words / min_tokens / penalties)");
  return static_cast<int>(std::find(l, l + vocab, m) - l);
}

/// Inverse-CDF pick among weights w[0..n) in index order: the first j with cumulative > u * total. Block sums
/// (fixed lane order) locate the block, then a sequential scan inside it; -1 if every weight is 0.
int pick(const float* w, int n, double u) {
  constexpr int kBlock = 256;
  thread_local std::vector<double> block_sum;
  const int nb = (n + kBlock - 1) / kBlock;
  block_sum.resize(nb);
  double total = 0.0;
  for (int b = 0; b < nb; ++b) {
    block_sum[b] = cpu::sum_range(w, b * kBlock, std::min(n, (b + 1) * kBlock));
    total += block_sum[b];
  }
  const double target = u * total;
  double cum = 0.0;
  for (int b = 0; b < nb; ++b) {
    if (cum + block_sum[b] > target) {
      int last = -1;
      for (int i = b * kBlock, hi = std::min(n, i + kBlock); i < hi; ++i) {
        if (w[i] <= 0.0f) continue;
        cum += w[i];
        last = i;
        if (cum > target) return i;
      }
      return last;  // rounding inside the block
    }
    cum += block_sum[b];
  }
  for (int i = n - 1; i >= 0; --i)  // rounding at the very end (u * total == total)
    if (w[i] > 0.0f) return i;
  return -1;
}

/// Temperature / top-k / top-p / min-p sampling over processed logits l[0..vocab); w[0..vocab) is workspace.
/// u: the request's uniform draw for this step.
int sample_random(const float* l, float* w, int vocab, const SamplingParams& p, double u) {
  const float m = cpu::lane_max(l, vocab);
  SSM_CHECK(m != kNegInf,
            "sampler: every logit is -inf after masking (allowed_token_ids / bad_words / min_tokens / penalties)");
  const float temp = static_cast<float>(p.temperature);
  // w[i] = unnormalized softmax(l / T); the max token has weight exactly 1.
  const double total = cpu::sum_exp(l, vocab, m, temp, w);
  const int k = p.effective_top_k(vocab);
  const bool use_top_k = k < vocab;
  const bool use_top_p = p.top_p < 1.0;

  if (!use_top_k && !use_top_p) {  // full vocabulary in id order; w_max = 1 so min-p drops w < min_p
    if (p.min_p > 0.0) cpu::zero_below(w, vocab, static_cast<float>(p.min_p));
    const int j = pick(w, vocab, u);
    SSM_CHECK(j >= 0, "sampler: no token has positive probability");
    return j;
  }

  // Candidates sorted (logit desc, id asc): the top k, or the nucleus prefix.
  thread_local std::vector<int> ids;
  thread_local std::vector<float> cw;
  thread_local std::vector<uint64_t> keys;
  auto gather = [&](int count) {
    cw.resize(count);
    for (int j = 0; j < count; ++j) cw[j] = w[ids[j]];
  };
  // Smallest prefix of cw[0..count) with cumulative mass >= need; -1 if rounding never gets there.
  auto nucleus = [&](int count, double need) {
    double cum = 0.0;
    for (int j = 0; j < count; ++j) {
      cum += cw[j];
      if (cum >= need) return j + 1;
    }
    return -1;
  };
  int kept = 0;
  if (use_top_k) {
    cpu::top_k_ids(l, vocab, k, ids);
    gather(k);
    kept = k;
    if (use_top_p) {
      double zk = 0.0;
      for (int j = 0; j < k; ++j) zk += cw[j];
      const int c = nucleus(k, p.top_p * zk);
      kept = c > 0 ? c : k;
    }
  } else {
    // The nucleus is a prefix of the sorted order, so it lies inside {l >= t} once that set holds enough
    // mass: grow t downward (weights >= e^-2, e^-4, ...) and sort only that candidate set.
    const double need = p.top_p * total;
    kept = -1;
    for (float d = 2.0f; kept < 0; d *= 2.0f) {
      const bool all = d > 128.0f;
      const float t = m - d * temp;
      if (!all && cpu::mass_at_or_above(l, w, vocab, t) < need) continue;
      keys.clear();
      for (int i = 0; i < vocab; ++i)
        if (all || l[i] >= t) keys.push_back(desc_key(l[i], i));
      std::sort(keys.begin(), keys.end());
      const int count = static_cast<int>(keys.size());
      ids.resize(count);
      for (int j = 0; j < count; ++j) ids[j] = static_cast<int>(static_cast<uint32_t>(keys[j]));
      gather(count);
      kept = nucleus(count, need);
      if (all && kept < 0) kept = count;
    }
  }
  if (p.min_p > 0.0) {
    const double floor = p.min_p * static_cast<double>(cw[0]);  // cw[0] is the max (== 1)
    int j = 1;
    while (j < kept && static_cast<double>(cw[j]) >= floor) ++j;
    kept = j;
  }
  const int j = pick(cw.data(), kept, u);
  SSM_CHECK(j >= 0, "sampler: no token has positive probability");
  return ids[j];
}

}  // namespace

RequestRng::RequestRng(std::optional<uint64_t> seed) {
  if (seed) {
    engine_.seed(*seed);
  } else {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    engine_.seed(seq);
  }
}

RequestRng RequestRng::for_sequence(std::optional<uint64_t> seed, int seq_index) {
  if (!seed || seq_index == 0) return RequestRng(seed);
  return RequestRng(splitmix64(*seed ^ splitmix64(static_cast<uint64_t>(seq_index))));
}

double RequestRng::uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

double log_sum_exp(std::span<const float> logits) { return log_sum_exp_with_max(logits, checked_max(logits)); }

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k, float* logprob_of, int id) {
  SSM_CHECK(k >= 0, "top_logprobs: k must be >= 0, got {}", k);
  const double lse = log_sum_exp(logits);
  if (logprob_of) {
    SSM_CHECK(id >= 0 && static_cast<size_t>(id) < logits.size(), "top_logprobs: id {} outside [0, {})", id,
              logits.size());
    *logprob_of = static_cast<float>(static_cast<double>(logits[id]) - lse);
  }
  return top_k_logprobs(logits, k, lse);
}

void process_logits(std::span<float> logits, const SamplingParams& params, std::span<const int> prompt_ids,
                    std::span<const int> output_ids, std::span<const int> eos_token_ids) {
  const int vocab = static_cast<int>(logits.size());
  check_ids(prompt_ids, vocab, "prompt_ids");
  check_ids(output_ids, vocab, "output_ids");
  process_logits_unchecked(logits.data(), vocab, params, prompt_ids, output_ids, eos_token_ids);
}

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int> prompt_ids, std::span<const int> output_ids,
                          std::span<const int> eos_token_ids, RequestRng& rng, std::vector<float>& scratch) {
  return sample_token_with_uniform(logits, params, prompt_ids, output_ids, eos_token_ids,
                                   params.greedy() ? 0.0 : rng.uniform(), scratch);
}

SampleResult sample_token_with_uniform(std::span<const float> logits, const SamplingParams& params,
                                       std::span<const int> prompt_ids, std::span<const int> output_ids,
                                       std::span<const int> eos_token_ids, double uniform, std::vector<float>& scratch) {
  const int vocab = static_cast<int>(logits.size());
  const double lse = log_sum_exp(logits);  // validates: non-empty, no NaN / +inf, not all -inf
  check_ids(prompt_ids, vocab, "prompt_ids");
  check_ids(output_ids, vocab, "output_ids");

  scratch.resize(2 * static_cast<size_t>(vocab));
  std::copy(logits.begin(), logits.end(), scratch.begin());
  float* l = scratch.data();
  process_logits_unchecked(l, vocab, params, prompt_ids, output_ids, eos_token_ids);

  SampleResult r;
  r.token = params.greedy() ? argmax_lowest_id(l, vocab) : sample_random(l, l + vocab, vocab, params, uniform);
  r.logprob = static_cast<float>(static_cast<double>(logits[r.token]) - lse);
  if (params.logprobs) r.rank = raw_rank(logits, logits[r.token]);
  r.top = top_k_logprobs(logits, params.logprobs.value_or(0), lse);
  return r;
}

}  // namespace ssmserve
