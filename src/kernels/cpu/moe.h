// Owns the sparse mixture-of-experts MLP on the CPU, in every routing the supported families use:
//  - softmax (Mixtral / MiniMax / Granite / Jamba): probabilities = softmax(logits) in fp32, the top_k experts by
//    probability (ties: lower id), their weights renormalized to sum 1 when `renormalize` (Jamba: not);
//  - sigmoid (DeepSeek-V3 / Nemotron-H, transformers' NemotronHTopkRouter): scores = sigmoid(logits); the choice uses
//    scores + e_score_correction_bias, limited to the topk_group best of n_group expert groups (a group's score: the
//    sum of its two best); weights are the chosen experts' scores, divided by their sum (+1e-20) when `renormalize`
//    (norm_topk_prob); then times routed_scaling_factor.
// Expert e: SiLU-gated w2(silu(w1 x) * (w3 x)), or, without w3, relu^2: w2(relu(w1 x)^2) (Nemotron-H);
// out = the weighted sum of the chosen experts' outputs, added in ascending expert id.
#pragma once
#include <cstdint>
#include <vector>

#include "core/weight.h"

namespace ssmserve::cpu {

/// One expert's MLP: w1 [I, hidden] (gate_proj, or up_proj when not gated), w3 [I, hidden] (up_proj; empty -> relu^2
/// expert), w2 [hidden, I] (down_proj).
struct ExpertWeights {
  Weight w1, w2, w3;
  bool gated() const { return w3.rows > 0; }
};

/// How tokens pick their experts (see the file comment).
struct MoeRouting {
  enum class Scoring { Softmax, Sigmoid };
  Scoring scoring = Scoring::Softmax;
  int top_k = 2;
  bool renormalize = true;            ///< softmax: renormalize the top_k; sigmoid: norm_topk_prob
  float routed_scaling_factor = 1.0f;
  int n_group = 1, topk_group = 1;    ///< sigmoid: group-limited choice (E % n_group == 0)
  std::vector<float> correction_bias; ///< sigmoid: [E] e_score_correction_bias, or empty (zeros)
};

/// out[t] = sum over token t's top_k experts e (ascending e) of weight_e * expert_e(x[t]).
///   x: [T, hidden] fp32; gate: [E, hidden]; experts: [E]; out: [T, hidden] fp32 (must not alias x).
/// Batch-invariant: every token's experts run through the row-invariant GEMM and are added in expert order.
/// Throws Error when top_k is outside [1, E] or shapes disagree.
void sparse_moe(const float* x, int64_t T, int64_t hidden, const Weight& gate, const std::vector<ExpertWeights>& experts,
                const MoeRouting& routing, float* out);

/// Router only: for each token the top_k expert ids (descending choice score, ties to the lower id) and their
/// weights. logits: [T, E] fp32; ids / weights: [T, top_k]. Throws Error on a bad top_k / grouping.
void moe_route(const float* logits, int64_t T, int E, const MoeRouting& routing, int32_t* ids, float* weights);

/// The softmax routing of Mixtral (renormalized top_k): moe_route with MoeRouting{Softmax, top_k}.
void moe_route(const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights);

/// The expert MLP over n rows: y[n, hidden] = expert(xs[n, hidden]); g, u: [n, I] scratch.
void expert_mlp(const ExpertWeights& w, const float* xs, int64_t n, float* g, float* u, float* y);

/// expert_mlp's activation, in place over `count` elements of g: g = silu(g) * u when `gated`, else relu(g)^2 (u
/// unused, may be null). For callers that split the expert around it (the tensor-parallel MoE, which must keep
/// TP = 1's bits: this is the arithmetic of the kernels' instruction-set variant, kernels/cpu/isa/cpu_isa.h).
void expert_activation(bool gated, float* g, const float* u, int64_t count);

/// out[c] += y[c] * weight for c in [0, n): how sparse_moe adds a routed row into its token's output (one FMA per
/// element where the variant's instruction set has it). For callers that combine expert rows themselves (the
/// tensor-parallel MoE). out and y must not overlap.
void moe_add_weighted(float* out, const float* y, float weight, int64_t n);

}  // namespace ssmserve::cpu
