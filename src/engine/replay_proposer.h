// Owns ReplayProposer, the benchmark-only drafter of speculative decoding ({"method": "replay"}, issue 29): it replays
// each prompt's known greedy continuation with a chosen chance of being right per position, so that decode speed can
// be measured against the acceptance rate (`ssmserve bench latency --replay-acceptance-rates`). Not a real drafter:
// EngineConfig refuses the method unless allow_benchmark_proposers is set.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/spec_decode.h"

namespace ssmserve {

/// Drafts from recorded continuations: for a request whose prompt is in the map, with g output tokens so far, draft
/// j (0 <= j < k) is continuation[g + j] with probability `acceptance_rate`, else another token (never the true one).
/// The choice for output position g + j is a hash of (seed, prompt, g + j): the same for every batch composition and
/// step order, and independent across positions, so greedy verification accepts each draft with probability p given
/// that the drafts before it were accepted (a row's mean accepted drafts is p + p^2 + ... + p^k; the measured
/// acceptance rate, accepted / drafted, equals p only at 0 and 1). A row always carries k drafts while the
/// continuation lasts (a wrong draft does not end it: a real drafter does not know it is wrong), none past its end,
/// and none for a prompt not in the map.
class ReplayProposer final : public Proposer {
 public:
  /// Prompt token ids -> the greedy continuation recorded for it (output token ids).
  using Continuations = std::map<std::vector<int>, std::vector<int>>;
  /// `continuations` may be null (drafts nothing); `vocab` >= 2 (the wrong token is drawn from [0, vocab));
  /// `acceptance_rate` in [0, 1]. Throws Error naming --speculative-config otherwise.
  ReplayProposer(std::shared_ptr<const Continuations> continuations, int vocab, double acceptance_rate, uint64_t seed);
  void propose(std::span<RequestState* const> reqs, int k) override;
  void release(const std::string& request_id) override { checked_.erase(request_id); }

  /// Requests whose output left their recorded continuation so far (each counted once). A nonzero count means the
  /// target's greedy tokens are not those of the recording pass (e.g. GPU logits of a verify row and of a plain step
  /// differ in the last bits and flip a near tie): drafts after that point replay the wrong tokens, so the measured
  /// acceptance falls below the chosen rate.
  int64_t num_diverged() const { return num_diverged_; }
  /// The draft for output position `pos` of `prompt` whose true token is `truth` (exposed for tests).
  int32_t draft(std::span<const int> prompt, int pos, int truth) const;

 private:
  uint64_t prompt_key(std::span<const int> prompt) const;  // hash of (seed, prompt)
  int32_t draft_for_key(uint64_t key, int pos, int truth) const;

  std::shared_ptr<const Continuations> continuations_;
  int vocab_;
  double rate_;
  uint64_t seed_;
  struct Checked {
    size_t tokens = 0;      ///< output tokens compared with the continuation so far
    bool diverged = false;
  };
  std::map<std::string, Checked> checked_;  ///< per running request
  int64_t num_diverged_ = 0;
};

}  // namespace ssmserve
