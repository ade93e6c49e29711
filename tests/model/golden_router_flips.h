// Owns the goldens' rule for greedy steps after a MoE routing near-tie: a golden prompt's `router_flips`
// (tools/golden_router_flips.py) are transformers' greedy logprobs and top-2 gaps with one router choice flipped,
// and a step may match one of them instead of the golden when the flip's position is one the step's logits depend on.
#pragma once
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace ssmserve::testing {

/// One routing the golden's reference allows at a router near-tie: at decoder layer `layer` and sequence position
/// `position` (0-based over prompt + greedy ids), the top_k-th expert swapped for the (top_k+1)-th, whose router
/// logits were `logit_gap` apart (natural-log units). greedy_logprobs / top2_gap: [steps], as the golden's fields of
/// the same names (the golden's greedy ids teacher-forced; top2_gap: the golden id's logprob minus the best other id's,
/// negative where the flip makes another id the argmax).
struct RouterFlip {
  int layer = 0, position = 0;
  double logit_gap = 0;
  std::vector<double> greedy_logprobs, top2_gap;
};

/// A golden prompt's router_flips (empty when the golden has none: a model without softmax top-k routers, or a golden
/// made before tools/golden_router_flips.py). Throws nlohmann::json errors on a malformed entry.
inline std::vector<RouterFlip> router_flips(const nlohmann::json& prompt) {
  std::vector<RouterFlip> out;
  if (!prompt.contains("router_flips")) return out;
  for (const auto& f : prompt["router_flips"])
    out.push_back({f.at("layer").get<int>(), f.at("position").get<int>(), f.at("logit_gap").get<double>(),
                   f.at("greedy_logprobs").get<std::vector<double>>(), f.at("top2_gap").get<std::vector<double>>()});
  return out;
}

/// The verdict on greedy step `step` of one golden prompt (prompt: its JSON object; flips: router_flips(prompt)).
/// Step s's logits depend on positions 0 .. num_prompt_tokens - 1 + s, so only flips at those positions apply.
///  - same id: ok when |got_logprob - greedy_logprobs[s]| <= tol, or within tol of an applicable flip's logprob
///    (`flip` names it: the routing near-tie explains the step);
///  - another id: a divergence, allowed when the golden's top2_gap[s] or an applicable flip's is below near_tie.
/// `why` says what failed (or which flip excused the step); empty when the golden itself matched.
struct StepVerdict {
  bool ok = false;
  const RouterFlip* flip = nullptr;
  std::string why;
};

inline StepVerdict judge_greedy_step(const nlohmann::json& prompt, const std::vector<RouterFlip>& flips, int step, int got_id,
                                     double got_logprob, double tol, double near_tie) {
  StepVerdict v;
  const size_t s = static_cast<size_t>(step);
  const int last_pos = prompt.at("num_prompt_tokens").get<int>() - 1 + step;
  const auto applies = [&](const RouterFlip& f) { return f.position <= last_pos && s < f.greedy_logprobs.size(); };
  if (got_id != prompt.at("greedy_token_ids").at(s).get<int>()) {
    const double gap = prompt.at("top2_gap").at(s).get<double>();
    if (gap < near_tie) {
      v.ok = true;
      return v;
    }
    for (const RouterFlip& f : flips)
      if (applies(f) && f.top2_gap.at(s) < near_tie) {
        v.ok = true, v.flip = &f;
        v.why = fmt::format("greedy token differs at a top-2 gap of {:.3g} with layer {}'s choice at position {} flipped",
                            f.top2_gap[s], f.layer, f.position);
        return v;
      }
    v.why = fmt::format("greedy token differs away from a near-tie (reference top-2 gap {:.3g})", gap);
    return v;
  }
  const double want = prompt.at("greedy_logprobs").at(s).get<double>();
  if (std::abs(got_logprob - want) <= tol) {
    v.ok = true;
    return v;
  }
  const RouterFlip* nearest = nullptr;
  for (const RouterFlip& f : flips) {
    if (!applies(f)) continue;
    if (!nearest || std::abs(got_logprob - f.greedy_logprobs[s]) < std::abs(got_logprob - nearest->greedy_logprobs[s])) nearest = &f;
  }
  if (nearest && std::abs(got_logprob - nearest->greedy_logprobs[s]) <= tol) {
    v.ok = true, v.flip = nearest;
    v.why = fmt::format("logprob {:.4f} (golden {:.4f}) matches {:.4f}: layer {}'s choice at position {} flipped (router logit gap {:.3g})",
                        got_logprob, want, nearest->greedy_logprobs[s], nearest->layer, nearest->position, nearest->logit_gap);
    return v;
  }
  v.why = fmt::format("logprob {:.4f}, golden {:.4f}", got_logprob, want);
  if (nearest)
    v.why += fmt::format(" (nearest routing alternative {:.4f}: layer {} position {})", nearest->greedy_logprobs[s], nearest->layer,
                         nearest->position);
  return v;
}

}  // namespace ssmserve::testing
