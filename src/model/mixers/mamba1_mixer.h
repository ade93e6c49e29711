// Owns the Mamba-1 mixer (transformers' MambaMixer, vllm-ssm-design.md §5.1): in_proj -> [x | z]; causal conv1d +
// SiLU over x; x_proj -> [dt_low | B | C]; dt_proj; selective scan with D skip and SiLU(z) gate; out_proj.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Parameters of one Mamba-1 mixer layer (I = d_inner, H = hidden, N = d_state, K = d_conv, R = dt_rank).
struct MambaLayerWeights {
  Weight in_proj;                    ///< [2I, H]
  std::vector<float> in_proj_bias;   ///< [2I] or empty
  std::vector<float> conv_weight;    ///< [I, K]
  std::vector<float> conv_bias;      ///< [I] or empty
  Weight x_proj;                     ///< [R + 2N, I] (replicated: every rank holds the whole, d_inner columns)
  Weight dt_proj;                    ///< [I, R]
  std::vector<float> dt_bias;        ///< [I]
  std::vector<float> A;              ///< [I, N] = -exp(A_log)
  std::vector<float> D;              ///< [I]
  Weight out_proj;                   ///< [H, I]; a rank: its output rows output_shard(H) x the whole d_inner
  std::vector<float> out_proj_bias;  ///< [H] or empty; a rank: its output rows
  std::vector<float> dt_norm, b_norm, c_norm;  ///< [R], [N], [N] Jamba's inner RMSNorm weights, or empty
};

/// Reads the mixer tensors `prefix`{in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj} (and with
/// m.inner_layernorms {dt_layernorm, b_layernorm, c_layernorm}) of one layer with their
/// shapes from `m` and keeps rank tp.rank's slice: channels c = d_inner / tp (in_proj x and z rows, conv, dt_proj
/// rows, dt_bias, A, D); x_proj replicated; out_proj split by output rows over the whole d_inner
/// (dist/gathered_linear.h). Projections are packed for cpu::linear when `pack` (the CPU module; the GPU runner
/// reads them row-major). Throws Error naming a missing / misshapen tensor or when tp.world does not divide d_inner.
MambaLayerWeights read_mamba1_layer(WeightSource& src, const std::string& prefix, int64_t hidden, const MambaConfig& m,
                                    const dist::TpRank& tp, bool pack = true);

/// What one Mamba-1 layer keeps per request (CPU and GPU modules alike): conv [d_conv-1, I] and SSM [I, N] of this
/// rank's channels I = shard.d_inner, and the unsharded layer's elements.
ModuleStateSpec mamba1_state_spec(const MambaConfig& shard, int full_d_inner);

/// The registry's factory ("mamba1"): hyperparameters from args.params (HF MambaConfig fields).
std::unique_ptr<CpuModule> make_mamba1_mixer(const ModuleArgs& args);

}  // namespace ssmserve
