// Owns the sparse mixture-of-experts MLP on the CPU as transformers' MiniMaxSparseMoeBlock computes it (Mixtral
// style): router logits = x W_gate^T; probabilities = softmax (fp32); the top_k experts by probability (ties: lower
// id), their weights renormalized to sum 1; expert e: w2(silu(w1 x) * (w3 x)); out = sum of weighted expert outputs.
#pragma once
#include <cstdint>
#include <vector>

#include "core/weight.h"

namespace ssmserve::cpu {

/// One expert's SiLU-gated MLP: w1 (gate) and w3 (up) [I, hidden], w2 (down) [hidden, I].
struct ExpertWeights {
  Weight w1, w2, w3;
};

/// out[t] = sum over token t's top_k experts e (ascending e) of weight_e * expert_e(x[t]).
///   x: [T, hidden] fp32; gate: [E, hidden]; experts: [E]; out: [T, hidden] fp32 (must not alias x).
/// Batch-invariant: every token's experts run through the row-invariant GEMM and are added in expert order.
/// Throws Error when top_k is outside [1, E] or shapes disagree.
void sparse_moe(const float* x, int64_t T, int64_t hidden, const Weight& gate, const std::vector<ExpertWeights>& experts,
                int top_k, float* out);

/// Router only: for each token the top_k expert ids (by descending probability, ties to the lower id) and their
/// renormalized weights. logits: [T, E] fp32; ids / weights: [T, top_k].
void moe_route(const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights);

}  // namespace ssmserve::cpu
