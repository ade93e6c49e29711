// Owns the adaptive draft length of speculative decoding: how many of its k drafts a request verifies this step,
// from the acceptance it has seen. A verify row of 1 + d tokens costs more than a plain decode row (d more state
// columns written, d more rows in every GEMM), and a draft that is rejected buys nothing, so a request whose drafts
// keep failing verifies fewer of them, down to none, with a one-draft probe now and then to notice when they start to
// match again (a quoting passage after free text). Output never depends on it: every verified position is sampled as a
// plain step would sample it (engine/step_outputs.cpp), whatever d is.
#pragma once
#include <algorithm>
#include <cmath>

namespace ssmserve {

/// Per-request draft-length state (RequestState::draft_length). The rule: with p the running estimate of the
/// probability that a draft is accepted given the one before it was (an exponential average over verify rows, starting
/// at 1), draft position i is verified when p^i >= kMinExpectedAcceptance, i.e. d = the largest i <= k with
/// p^i >= 0.1; d = 0 (no drafts) when even p < 0.1, except every kProbeInterval-th step, which verifies one draft.
/// At a constant per-position acceptance rate p: p = 1 keeps d = k, p = 0.5 gives d = 3, p < 0.1 gives a one-draft
/// probe every 8 steps (so at 0% acceptance a request pays ~1/8 of one extra token's cost per step).
struct DraftLength {
  static constexpr double kMinExpectedAcceptance = 0.1;  ///< a position is verified when its acceptance chance >= this
  static constexpr double kWeight = 0.3;                 ///< weight of the newest verify row in the estimate
  static constexpr int kProbeInterval = 8;               ///< steps between one-draft probes while d = 0

  double acceptance = 1.0;  ///< estimate of P(draft i accepted | draft i - 1 accepted), in [0, 1]
  int steps_without_drafts = 0;

  /// Drafts to verify this step, in [0, k] (k = num_speculative_tokens).
  int limit(int k) {
    int d = 0;
    for (double q = acceptance; d < k && q >= kMinExpectedAcceptance; q *= acceptance) ++d;
    if (d == 0 && ++steps_without_drafts >= kProbeInterval) d = std::min(k, 1);
    if (d > 0) steps_without_drafts = 0;
    return d;
  }

  /// A verify row of `drafted` drafts (> 0) kept `accepted` of them: the positions it tested are the accepted ones
  /// plus the first rejected one (when accepted < drafted).
  void observe(int drafted, int accepted) {
    if (drafted <= 0) return;
    const int tested = std::min(drafted, accepted + 1);
    const double rate = static_cast<double>(accepted) / static_cast<double>(tested);
    acceptance = std::clamp((1.0 - kWeight) * acceptance + kWeight * rate, 0.0, 1.0);
  }
};

}  // namespace ssmserve
