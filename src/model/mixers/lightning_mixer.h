// Owns the lightning-attention mixer (MiniMax's linear attention, transformers' MiniMaxLightningAttention,
// vllm-ssm-design.md §5.3): SiLU(qkv_proj x) -> per-head decayed linear-attention recurrence on a [H, D, D] fp32
// state -> RMSNorm over all heads (eps 1e-6) -> sigmoid(output_gate x) gate -> out_proj.
#pragma once
#include <memory>
#include <vector>

#include "model/decoder/module.h"

namespace ssmserve {

/// Per-head decay slopes of decoder layer `layer` of `num_layers`, as transformers computes them:
/// s_h = (1 / 2^(8/H))^(h+1) * (1 - layer / (L - 1 + 1e-5) + 1e-5). Returns [num_heads].
std::vector<float> lightning_slopes(int num_heads, int layer, int num_layers);

/// The registry's factory ("lightning"): hyperparameters num_attention_heads, head_dim (hidden / heads), block_size
/// (256); weights `prefix`{qkv_proj, output_gate, out_proj, norm}; rank tp.rank's heads (H / tp), the norm over all
/// heads after an all-gather and out_proj split by output rows (dist/gathered_linear.h). Throws Error on a bad
/// field or tensor, or when tp does not divide the heads.
std::unique_ptr<CpuModule> make_lightning_mixer(const ModuleArgs& args);

}  // namespace ssmserve
