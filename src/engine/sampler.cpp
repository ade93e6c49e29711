// Owns the sampling math: RequestRng, penalties, min_tokens masking, greedy / top-k / top-p / min-p draws and
// raw-distribution logprobs (vLLM v1 Sampler semantics for one row).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace ssmserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Max of logits; throws on empty input, NaN or +inf.
float checked_max(std::span<const float> logits) {
  SSM_CHECK(!logits.empty(), "sampler: logits are empty");
  float m = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (!(x <= m)) {
      SSM_CHECK(!std::isnan(x), "sampler: logits[{}] is NaN", i);
      m = x;
    }
  }
  SSM_CHECK(m != std::numeric_limits<float>::infinity(), "sampler: logits contain +inf");
  return m;
}

double log_sum_exp_with_max(std::span<const float> logits, float m) {
  SSM_CHECK(m != kNegInf, "sampler: every logit is -inf (all tokens masked)");
  double s = 0.0;
  for (const float x : logits) s += static_cast<double>(std::exp(x - m));
  return static_cast<double>(m) + std::log(s);
}

/// Top-k of raw logits by (logit desc, id asc) with logprobs relative to lse.
std::vector<TokenLogprob> top_k_logprobs(std::span<const float> logits, int k, double lse) {
  const int vocab = static_cast<int>(logits.size());
  k = std::min(k, vocab);
  std::vector<TokenLogprob> out;
  if (k <= 0) return out;
  // "a before b" = a is more probable (ties: lower id). Min-heap of the best k seen: front() is the worst.
  auto before = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::vector<int> heap;
  heap.reserve(k);
  for (int i = 0; i < vocab; ++i) {
    if (static_cast<int>(heap.size()) < k) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), before);
    } else if (before(i, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = i;
      std::push_heap(heap.begin(), heap.end(), before);
    }
  }
  std::sort(heap.begin(), heap.end(), before);
  out.reserve(k);
  for (const int id : heap) out.push_back({id, static_cast<float>(static_cast<double>(logits[id]) - lse)});
  return out;
}

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
      l[t] = l[t] > 0.0f ? l[t] / rp : l[t] * rp;
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

int argmax_lowest_id(const float* l, int vocab) {
  int best = -1;
  float bv = kNegInf;
  for (int i = 0; i < vocab; ++i) {
    if (l[i] > bv) {
      bv = l[i];
      best = i;
    }
  }
  SSM_CHECK(best >= 0, "sampler: every logit is -inf after masking (min_tokens / penalties)");
  return best;
}

/// Inverse-CDF pick among weights w[0..n) (cumulative in the given order): first j with cum > u * total.
int pick(const float* w, int n, double u) {
  double total = 0.0;
  for (int j = 0; j < n; ++j) total += w[j];
  const double target = u * total;
  double cum = 0.0;
  int last_positive = -1;
  for (int j = 0; j < n; ++j) {
    if (w[j] <= 0.0f) continue;
    cum += w[j];
    last_positive = j;
    if (cum > target) return j;
  }
  return last_positive;  // rounding: u * total at the very end
}

/// Temperature / top-k / top-p / min-p sampling over processed logits l (overwritten). One rng draw.
int sample_random(float* l, int vocab, const SamplingParams& p, RequestRng& rng) {
  float m = kNegInf;
  for (int i = 0; i < vocab; ++i) m = std::max(m, l[i]);
  SSM_CHECK(m != kNegInf, "sampler: every logit is -inf after masking (min_tokens / penalties)");
  const float temp = static_cast<float>(p.temperature);
  // Unnormalized softmax(l / T) weight; the max token has weight exactly 1.
  auto weight = [&](float x) { return std::exp((x - m) / temp); };
  const int k = p.effective_top_k(vocab);
  const bool use_top_k = k < vocab;
  const bool use_top_p = p.top_p < 1.0;
  const double u = rng.uniform();

  if (!use_top_k && !use_top_p) {
    // Full vocabulary in id order; w_max = 1 so min-p drops w < min_p.
    for (int i = 0; i < vocab; ++i) {
      const float w = weight(l[i]);
      l[i] = (p.min_p > 0.0 && static_cast<double>(w) < p.min_p) ? 0.0f : w;
    }
    const int j = pick(l, vocab, u);
    SSM_CHECK(j >= 0, "sampler: no token has positive probability");
    return j;
  }

  // Candidates in (logit desc, id asc) order: the k best, or a growing prefix until the nucleus is covered.
  thread_local std::vector<int> ids;
  thread_local std::vector<float> w;
  ids.resize(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  w.clear();
  auto before = [l](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  int kept = 0;
  if (use_top_k) {
    std::nth_element(ids.begin(), ids.begin() + k, ids.end(), before);
    std::sort(ids.begin(), ids.begin() + k, before);
    for (int j = 0; j < k; ++j) w.push_back(weight(l[ids[j]]));
    kept = k;
    if (use_top_p) {
      double total = 0.0;
      for (int j = 0; j < k; ++j) total += w[j];
      const double need = p.top_p * total;
      double cum = 0.0;
      for (int j = 0; j < k; ++j) {
        cum += w[j];
        if (cum >= need) {
          kept = j + 1;
          break;
        }
      }
    }
  } else {
    double total = 0.0;
    for (int i = 0; i < vocab; ++i) total += weight(l[i]);
    const double need = p.top_p * total;
    double cum = 0.0;
    int done = 0;
    kept = vocab;  // if rounding never reaches `need`, keep everything
    bool reached = false;
    while (done < vocab && !reached) {
      const int end = std::min(vocab, done + std::max(64, done));
      if (end < vocab) std::nth_element(ids.begin() + done, ids.begin() + end, ids.end(), before);
      std::sort(ids.begin() + done, ids.begin() + end, before);
      for (int j = done; j < end; ++j) {
        w.push_back(weight(l[ids[j]]));
        cum += w.back();
        if (cum >= need) {
          kept = j + 1;
          reached = true;
          break;
        }
      }
      done = end;
    }
  }
  if (p.min_p > 0.0) {
    const double floor = p.min_p * static_cast<double>(w[0]);  // w[0] is the max (== 1)
    int j = 1;
    while (j < kept && static_cast<double>(w[j]) >= floor) ++j;
    kept = j;
  }
  const int j = pick(w.data(), kept, u);
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

SampleResult sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::span<const int> prompt_ids, std::span<const int> output_ids,
                          std::span<const int> eos_token_ids, RequestRng& rng, std::vector<float>& scratch) {
  const int vocab = static_cast<int>(logits.size());
  const double lse = log_sum_exp(logits);  // validates: non-empty, no NaN / +inf, not all -inf
  check_ids(prompt_ids, vocab, "prompt_ids");
  check_ids(output_ids, vocab, "output_ids");

  scratch.assign(logits.begin(), logits.end());
  float* l = scratch.data();
  if (static_cast<int>(output_ids.size()) < params.min_tokens) {
    if (!params.ignore_eos) {
      check_ids(eos_token_ids, vocab, "eos_token_ids");
      for (const int t : eos_token_ids) l[t] = kNegInf;
    }
    check_ids(params.stop_token_ids, vocab, "stop_token_ids");
    for (const int t : params.stop_token_ids) l[t] = kNegInf;
  }
  apply_penalties(l, vocab, params, prompt_ids, output_ids);

  SampleResult r;
  r.token = params.greedy() ? argmax_lowest_id(l, vocab) : sample_random(l, vocab, params, rng);
  r.logprob = static_cast<float>(static_cast<double>(logits[r.token]) - lse);
  r.top = top_k_logprobs(logits, params.logprobs.value_or(0), lse);
  return r;
}

}  // namespace ssmserve
