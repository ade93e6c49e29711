#!/usr/bin/env python3
"""Reference numbers for the Mamba-hybrid benchmarks (docs/benchmarks.md, issue 30), on the GPU machine:

  python3 tools/bench_hybrids_reference.py CONFIG_DIR OUT_JSON [--eager] [--prefill-len 2048] [--decode-steps 32]

1. Roofline inputs from the config (a meta-device transformers model, no memory): total parameters, parameters read
   per decoded token (active experts only; the embedding table only when it is the tied LM head), recurrent state
   bytes per request (ssmserve keeps conv windows and SSM states in fp32) and fp32 KV bytes per token of context
   (ssmserve's paged KV). Batch-1 decode roofline = bytes per token / HBM bandwidth (H200: 4.8 TB/s); prefill
   roofline = 2 x active parameters FLOPs per token / bf16 dense tensor-core peak (H200: 989 TFLOP/s); beside it the
   roofline that also counts the causal softmax attention's FLOPs of an L-token prompt (Q K^T and P V: 4 x heads x
   head_dim x (L + 1) / 2 per token and attention layer; the model FLOPs utilization convention of PaLM, appendix B),
   for L = 2k / 8k / 32k / 128k.
2. With --eager: transformers' own eager forward on random bf16 weights on the GPU (the peer in the same run):
   prefill tokens/s of one prompt, and batch-1 decode tokens/s from timed cached generate() calls
   (t(1 + n tokens) - t(1 token)) / n). A failure is recorded, not raised.
"""
from __future__ import annotations

import argparse
import json
import math
import time

HBM_BYTES_PER_S = 4.8e12
BF16_PEAK_FLOPS = 989e12


def expert_param_split(model, cfg):
    """(routed expert params in total, routed expert params active per token) over the MoE layers."""
    total = active = 0
    for name, p in model.named_parameters():
        lname = name.lower()
        routed = ".experts." in lname or ("block_sparse_moe" in lname and ("input_linear" in lname or "output_linear" in lname))
        if routed and "shared" not in lname:
            total += p.numel()
    E = getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_experts", None) or 0
    k = getattr(cfg, "num_experts_per_tok", 0) or 0
    if E and total:
        active = total * k / E
    return total, active


def roofline(cfg_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(cfg_dir)
    arch = cfg.architectures[0]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    # A multimodal wrapper (Qwen3.5): the text decoder's parameters only (the vision tower is not read per token).
    total = sum(p.numel() for n, p in model.named_parameters() if "visual" not in n)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    emb = model.get_input_embeddings().weight.numel()
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    e_total, e_active = expert_param_split(model, cfg)
    active = total - e_total + e_active - (0 if tied else emb)
    # Recurrent state and KV from the layer list.
    state = kv_per_token = attn_flops_per_key = 0
    H = cfg.hidden_size
    types = []
    for attr in ("layers_block_type", "layer_types"):
        v = getattr(cfg, attr, None)
        if isinstance(v, (list, tuple)) and v:
            types = list(v)
            break
    if arch == "FalconH1ForCausalLM":
        types = ["hybrid"] * cfg.num_hidden_layers
    delta_net = hasattr(cfg, "linear_num_value_heads")  # Qwen3.5 / Qwen3-Next: "linear_attention" is Gated DeltaNet
    if delta_net and not types:
        every = getattr(cfg, "full_attention_interval", 4)
        types = ["full_attention" if (l + 1) % every == 0 else "linear_attention" for l in range(cfg.num_hidden_layers)]
    for t in types:
        if delta_net and t == "linear_attention":
            hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
            dk, dv, K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
            state += 4 * (hv * dk * dv + (K - 1) * (2 * hk * dk + hv * dv))
            continue
        if t in ("mamba", "linear_attention", "hybrid"):
            heads = getattr(cfg, "mamba_num_heads", None) or getattr(cfg, "mamba_n_heads", None)
            hd = getattr(cfg, "mamba_head_dim", None) or getattr(cfg, "mamba_d_head", None)
            N = getattr(cfg, "ssm_state_size", None) or getattr(cfg, "mamba_d_state", None)
            G = getattr(cfg, "n_groups", None) or getattr(cfg, "mamba_n_groups", None) or 1
            K = getattr(cfg, "conv_kernel", None) or getattr(cfg, "mamba_d_conv", None) or 4
            I = heads * hd
            state += 4 * (heads * hd * N + (K - 1) * (I + 2 * G * N))
        if t in ("attention", "full_attention", "hybrid"):
            D = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
            kv_per_token += 2 * cfg.num_key_value_heads * D * 4
            attn_flops_per_key += 4 * cfg.num_attention_heads * D
    return {
        "architecture": arch,
        "params_total": total,
        "params_active_per_token": active,
        "state_bytes_per_request": state,
        "kv_bytes_per_token": kv_per_token,
        "decode_b1_roofline_tok_s_ctx2k": HBM_BYTES_PER_S / (2 * active + 2 * state + kv_per_token * 2048),
        "decode_b1_roofline_tok_s_ctx128k": HBM_BYTES_PER_S / (2 * active + 2 * state + kv_per_token * 131072),
        "prefill_roofline_tok_s": BF16_PEAK_FLOPS / (2 * active),
        "prefill_roofline_with_attention_tok_s": {
            str(L): BF16_PEAK_FLOPS / (2 * active + attn_flops_per_key * (L + 1) / 2) for L in (2048, 8192, 32768, 131072)
        },
    }


def eager(cfg_dir, prefill_len, decode_steps):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    out = {}
    cfg = AutoConfig.from_pretrained(cfg_dir)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    out["init_s"] = round(time.time() - t0, 1)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg  # Qwen3.5: the wrapper's text_config
    V = min(text_cfg.vocab_size, 50000)
    ids = torch.randint(3, V, (1, prefill_len), device="cuda")

    def timed(fn, reps=3):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.time()
            fn()
            torch.cuda.synchronize()
            ts.append(time.time() - t)
        return sorted(ts)[len(ts) // 2]

    with torch.no_grad():
        try:
            model(ids[:, :128], use_cache=False, logits_to_keep=1)  # warm-up
            t = timed(lambda: model(ids, use_cache=False, logits_to_keep=1))
            out["prefill_tok_s"] = prefill_len / t
        except Exception as e:  # noqa: BLE001 - recorded for the table
            out["prefill_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        try:
            p = ids[:, :32]
            kw = dict(do_sample=False, use_cache=True, pad_token_id=0)
            model.generate(p, max_new_tokens=4, min_new_tokens=4, **kw)
            t1 = timed(lambda: model.generate(p, max_new_tokens=1, min_new_tokens=1, **kw), 2)
            tn = timed(lambda: model.generate(p, max_new_tokens=1 + decode_steps, min_new_tokens=1 + decode_steps, **kw), 2)
            out["decode_b1_tok_s"] = decode_steps / (tn - t1)
        except Exception as e:  # noqa: BLE001
            out["decode_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    del model
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config_dir")
    ap.add_argument("out_json")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--prefill-len", type=int, default=2048)
    ap.add_argument("--decode-steps", type=int, default=32)
    a = ap.parse_args()
    res = {"config": a.config_dir, "roofline": roofline(a.config_dir)}
    if a.eager:
        res["transformers_eager"] = eager(a.config_dir, a.prefill_len, a.decode_steps)
    with open(a.out_json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
