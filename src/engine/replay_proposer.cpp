// Owns the benchmark-only replay drafter (see replay_proposer.h).
#include "engine/replay_proposer.h"

#include "core/error.h"
#include "engine/request.h"

namespace ssmserve {

namespace {

/// splitmix64's finalizer: a well-mixed 64-bit hash of x.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

ReplayProposer::ReplayProposer(std::shared_ptr<const Continuations> continuations, int vocab, double acceptance_rate,
                               uint64_t seed)
    : continuations_(std::move(continuations)), vocab_(vocab), rate_(acceptance_rate), seed_(seed) {
  SSM_CHECK(vocab >= 2, "--speculative-config: method replay needs a vocabulary of at least 2 tokens (got {})", vocab);
  SSM_CHECK(acceptance_rate >= 0.0 && acceptance_rate <= 1.0,
            "--speculative-config: \"acceptance_rate\" must be in [0, 1] (got {})", acceptance_rate);
}

uint64_t ReplayProposer::prompt_key(std::span<const int> prompt) const {
  uint64_t h = mix(seed_);
  for (int t : prompt) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

int32_t ReplayProposer::draft(std::span<const int> prompt, int pos, int truth) const {
  return draft_for_key(prompt_key(prompt), pos, truth);
}

int32_t ReplayProposer::draft_for_key(uint64_t key, int pos, int truth) const {
  const uint64_t h = mix(key ^ (static_cast<uint64_t>(pos) << 32));
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // uniform in [0, 1)
  if (u < rate_) return truth;
  // Another token: truth + 1 + (a second hash mod vocab - 1), wrapped, so never the truth itself.
  const uint64_t off = 1 + mix(h) % static_cast<uint64_t>(vocab_ - 1);
  return static_cast<int32_t>((static_cast<uint64_t>(truth) + off) % static_cast<uint64_t>(vocab_));
}

void ReplayProposer::propose(std::span<RequestState* const> reqs, int k) {
  for (RequestState* r : reqs) {
    r->draft_token_ids.clear();
    if (!continuations_) continue;
    const auto it = continuations_->find(r->request.prompt_token_ids);
    if (it == continuations_->end()) continue;
    const std::vector<int>& cont = it->second;
    const size_t g = r->output_token_ids.size();
    Checked& c = checked_[r->request.request_id];
    for (; c.tokens < g && !c.diverged; ++c.tokens)
      if (c.tokens >= cont.size() || r->output_token_ids[c.tokens] != cont[c.tokens]) c.diverged = true, ++num_diverged_;
    const uint64_t key = prompt_key(r->request.prompt_token_ids);
    for (int j = 0; j < k && g + static_cast<size_t>(j) < cont.size(); ++j) {
      const int pos = static_cast<int>(g) + j;
      r->draft_token_ids.push_back(draft_for_key(key, pos, cont[static_cast<size_t>(pos)]));
    }
  }
}

}  // namespace ssmserve
