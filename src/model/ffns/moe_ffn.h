// Owns the sparse mixture-of-experts FFN (Mixtral / MiniMax style, transformers' MiniMaxSparseMoeBlock): softmax
// router over E experts, top_k renormalized, each expert a SiLU-gated MLP w2(silu(w1 x) * (w3 x)).
#pragma once
#include <memory>

#include "model/decoder/module.h"

namespace ssmserve {

/// The registry's factory ("moe"): hyperparameters num_local_experts (8), num_experts_per_tok (2),
/// intermediate_size; weights `prefix`{gate, experts.{e}.w1, w2, w3}. Tensor-parallel experts (vLLM's FusedMoE
/// default, not expert parallelism): the router replicated, every rank holding rows I / tp of each expert's w1 / w3
/// and its output rows of w2 over the all-gathered activations (dist/gathered_linear.h). Throws Error on a bad field
/// or tensor, or when tp does not divide intermediate_size.
std::unique_ptr<CpuModule> make_moe_ffn(const ModuleArgs& args);

}  // namespace ssmserve
