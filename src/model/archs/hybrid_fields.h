// Owns the field mappings the Mamba hybrids share: their Mamba-2 fields (`mamba_n_heads`, `mamba_d_head` "auto",
// ...; Granite-4.0-H, Bamba, Falcon-H1) and Mamba-1 fields (`mamba_d_state`, `mamba_dt_rank` "auto", ...; Jamba)
// onto the mixers' own hyperparameter names, the attention fields, and the architecture default of
// tie_word_embeddings (which transformers' config classes default differently per family).
#pragma once
#include <nlohmann/json.hpp>

#include "config/model_config.h"

namespace ssmserve {

/// Mamba-2 mixer params (mamba2_mixer.h names) from the `mamba_*` fields of `j`: num_heads = mamba_n_heads,
/// head_dim = mamba_d_head (an integer or "auto" = d_inner / mamba_n_heads), d_inner = d_ssm when > 0 else
/// mamba_expand * hidden_size, state_size = mamba_d_state, n_groups = mamba_n_groups, conv_kernel = mamba_d_conv,
/// chunk_size = mamba_chunk_size, use_conv_bias = mamba_conv_bias, use_bias = mamba_proj_bias, time_step_limit.
/// Throws Error naming the field when the sizes disagree.
nlohmann::json mamba2_params_from_prefixed(const ModelConfig& cfg, int d_ssm = 0);

/// Mamba-1 mixer params (HF MambaConfig names) from Jamba's `mamba_*` fields, with its inner RMSNorms on.
nlohmann::json mamba1_params_from_prefixed(const ModelConfig& cfg);

/// tie_word_embeddings as config.json says, else the family's transformers default.
bool tie_word_embeddings_or(const ModelConfig& cfg, bool family_default);

/// `j` with `field` set to `value` (a copy).
nlohmann::json with_field(nlohmann::json j, const char* field, nlohmann::json value);

}  // namespace ssmserve
