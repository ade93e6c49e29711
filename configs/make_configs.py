#!/usr/bin/env python3
"""Writes configs/<name>/config.json: real checkpoint shapes in Hugging Face config.json format, for
benchmarks with random weights. Numbers come from shared/docs/reference/real-shapes.md (see configs/README.md).

Usage: python3 configs/make_configs.py [--check]
  --check  also instantiate every config with transformers on the meta device and print parameter counts
           (needs torch + transformers; writes nothing else).

Templates are the bundled tiny checkpoints' config.json files (same fields, same order); only the shape
fields differ.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "models"

# Inline copies of the templates (models/tiny-mamba, shared/models/tiny-mamba2, shared/models/tiny-minimax
# config.json), so this script does not depend on shared/ being present.
MAMBA1_TEMPLATE = {
    "architectures": ["MambaForCausalLM"], "bos_token_id": 0, "conv_kernel": 4, "dtype": "bfloat16",
    "eos_token_id": 0, "expand": 2, "hidden_act": "silu", "hidden_size": 256, "initializer_range": 0.1,
    "intermediate_size": 512, "layer_norm_epsilon": 1e-05, "model_type": "mamba", "num_hidden_layers": 8,
    "pad_token_id": 0, "rescale_prenorm_residual": False, "residual_in_fp32": True, "state_size": 16,
    "tie_word_embeddings": True, "time_step_floor": 0.0001, "time_step_init_scheme": "random",
    "time_step_max": 0.1, "time_step_min": 0.001, "time_step_rank": 16, "time_step_scale": 1.0,
    "transformers_version": "5.17.0", "use_associative_scan": True, "use_bias": False, "use_cache": True,
    "use_conv_bias": True, "use_mambapy": False, "vocab_size": 50280,
}
MAMBA2_TEMPLATE = {
    "architectures": ["Mamba2ForCausalLM"], "bos_token_id": 0, "chunk_size": 64, "conv_kernel": 4,
    "dtype": "bfloat16", "eos_token_id": 0, "expand": 2, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 256, "initializer_range": 0.1, "layer_norm_epsilon": 1e-05, "model_type": "mamba2",
    "n_groups": 1, "norm_before_gate": False, "num_heads": 8, "num_hidden_layers": 8, "pad_token_id": 0,
    "rescale_prenorm_residual": False, "residual_in_fp32": True, "rms_norm": True, "state_size": 64,
    "tie_word_embeddings": True, "time_step_floor": 0.0001,
    "time_step_limit": [0.0, {"__float__": "Infinity"}], "time_step_max": 0.1, "time_step_min": 0.001,
    "time_step_rank": 16, "transformers_version": "5.17.0", "use_bias": False, "use_cache": True,
    "use_conv_bias": True, "vocab_size": 50280,
}
MINIMAX_TEMPLATE = {
    "architectures": ["MiniMaxForCausalLM"], "attention_dropout": 0.0, "block_size": 64, "bos_token_id": 0,
    "dtype": "bfloat16", "eos_token_id": 0, "full_attn_alpha_factor": 1, "full_attn_beta_factor": 1,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 256, "initializer_range": 0.02,
    "intermediate_size": 256, "layer_types": [], "linear_attn_alpha_factor": 1, "linear_attn_beta_factor": 1,
    "max_position_embeddings": 8192, "mlp_alpha_factor": 1, "mlp_beta_factor": 1, "model_type": "minimax",
    "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 8, "num_key_value_heads": 2,
    "num_local_experts": 4, "output_router_logits": False, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0, "sliding_window": None, "tie_word_embeddings": True,
    "transformers_version": "5.17.0", "use_cache": True, "vocab_size": 50280,
}

# real-shapes.md §3.1: (hidden, layers); intermediate = 2*hidden, dt_rank = ceil(hidden/16).
MAMBA1 = {
    "mamba-130m": (768, 24),
    "mamba-370m": (1024, 48),
    "mamba-790m": (1536, 48),
    "mamba-1.4b": (2048, 48),
    "mamba-2.8b": (2560, 64),
}
# real-shapes.md §3.2: (d_model, n_layer); nheads = 2*d_model/64, d_state 128, chunk 256, vocab 50288.
MAMBA2 = {
    "mamba2-130m": (768, 24),
    "mamba2-370m": (1024, 48),   # unverified in the doc (follows the Mamba-1 size ladder)
    "mamba2-780m": (1536, 48),
    "mamba2-1.3b": (2048, 48),
    "mamba2-2.7b": (2560, 64),
}


def mamba1(hidden: int, layers: int) -> dict:
    c = copy.deepcopy(MAMBA1_TEMPLATE)
    c.update(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
             time_step_rank=math.ceil(hidden / 16), state_size=16, conv_kernel=4, expand=2, vocab_size=50280)
    return c


def mamba2(hidden: int, layers: int) -> dict:
    c = copy.deepcopy(MAMBA2_TEMPLATE)
    c.update(hidden_size=hidden, num_hidden_layers=layers, num_heads=2 * hidden // 64, head_dim=64,
             state_size=128, n_groups=1, chunk_size=256, conv_kernel=4, expand=2, vocab_size=50288,
             time_step_rank=math.ceil(hidden / 16), norm_before_gate=False)
    return c


def codestral() -> dict:
    # real-shapes.md §3.4 (HF conversion Molbap/code2 + mistral-inference params.json).
    c = mamba2(4096, 64)
    c.update(num_heads=128, n_groups=8, vocab_size=32768, tie_word_embeddings=False,
             # The HF conversion says norm_before_gate true; mamba_ssm semantics (and transformers'
             # MambaRMSNormGated, which ignores the flag) are norm(y * silu(z)), i.e. false.
             norm_before_gate=False,
             # Mistral v3 SentencePiece special ids: <unk>=0, <s>=1, </s>=2 (not listed in the doc).
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return c


def minimax_text_01() -> dict:
    # real-shapes.md §3.5 (MiniMaxAI/MiniMax-Text-01 config.json mapped onto transformers' MiniMaxConfig names).
    c = copy.deepcopy(MINIMAX_TEMPLATE)
    alpha = (2 * 80) ** 0.25  # 3.5565588200778455
    c.update(
        hidden_size=6144, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
        intermediate_size=9216, num_local_experts=32, num_experts_per_tok=2, vocab_size=200064,
        rms_norm_eps=1e-05, hidden_act="silu", max_position_embeddings=10240000, block_size=256,
        layer_types=(["linear_attention"] * 7 + ["full_attention"]) * 10,
        full_attn_alpha_factor=alpha, full_attn_beta_factor=1.0,
        linear_attn_alpha_factor=alpha, linear_attn_beta_factor=1.0,
        mlp_alpha_factor=alpha, mlp_beta_factor=1.0,
        # rotary_dim 64 of head_dim 128. transformers' MiniMax port (5.24) ignores partial_rotary_factor
        # and rotates all 128 dims; the original model rotates 64.
        rope_parameters={"rope_theta": 10000000.0, "rope_type": "default", "partial_rotary_factor": 0.5},
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
        router_aux_loss_coef=0.001, router_jitter_noise=0.0, initializer_range=0.02,
    )
    return c


def minimax_bench() -> dict:
    # Not a public checkpoint: the MiniMax-shaped benchmark model of issue 8 that fits one H200 with dummy weights
    # (hidden 2048, 16 layers with one softmax layer per 8, 16 heads x 128, 8 experts top-2).
    c = copy.deepcopy(MINIMAX_TEMPLATE)
    c.update(hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=1024, num_local_experts=8, num_experts_per_tok=2, block_size=256,
             max_position_embeddings=131072, layer_types=(["linear_attention"] * 7 + ["full_attention"]) * 2)
    return c


def all_configs() -> dict[str, dict]:
    out = {name: mamba1(*hw) for name, hw in MAMBA1.items()}
    out.update({name: mamba2(*hw) for name, hw in MAMBA2.items()})
    out["codestral-mamba-7b"] = codestral()
    out["minimax-text-01"] = minimax_text_01()
    out["minimax-bench"] = minimax_bench()
    return out


def check_templates() -> None:
    """The inline templates must have exactly the fields of the tiny checkpoints' config.json."""
    for tmpl, path in [(MAMBA1_TEMPLATE, ROOT / "models" / "tiny-mamba" / "config.json"),
                       (MAMBA2_TEMPLATE, SHARED / "tiny-mamba2" / "config.json"),
                       (MINIMAX_TEMPLATE, SHARED / "tiny-minimax" / "config.json")]:
        if path.exists():
            ref = json.loads(path.read_text())
            if list(ref) != list(tmpl):
                raise SystemExit(f"template fields differ from {path}: {set(ref) ^ set(tmpl)}")


def param_count(name: str, cfg_path: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(str(cfg_path.parent))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    seen, n = set(), 0
    for p in model.parameters():  # tied weights counted once
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    check_templates()
    for name, cfg in all_configs().items():
        path = HERE / name / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        msg = f"{path.relative_to(ROOT)}"
        if args.check:
            msg += f": {param_count(name, path) / 1e6:.1f} M parameters"
        print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
