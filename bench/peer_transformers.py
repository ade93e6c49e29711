#!/usr/bin/env python3
"""Peer measurement for docs/benchmarks.md: Hugging Face transformers' Mamba on the CPU at a config's shape with
random weights, prefill tokens/s (one forward over the prompt) and batch-1 decode tokens/s (cached one-token
forwards), median of repeats. Needs `pip install torch transformers` (not part of the test suite).

usage: bench/peer_transformers.py CONFIG_DIR [--input-len 512] [--output-len 128] [--dtype float32|bfloat16]
"""
import argparse
import json
import statistics
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config_dir")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-iters", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = ap.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    cfg = transformers.AutoConfig.from_pretrained(a.config_dir)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    ids = torch.randint(0, 50000, (1, a.input_len))
    prefill, decode = [], []
    with torch.inference_mode():
        for it in range(a.num_iters + 1):
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            t1 = time.perf_counter()
            cache = out.cache_params
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            pos = a.input_len
            t2 = time.perf_counter()
            for _ in range(a.output_len - 1):
                out = model(input_ids=tok, cache_params=cache, use_cache=True,
                            cache_position=torch.tensor([pos]))
                cache = out.cache_params
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                pos += 1
            t3 = time.perf_counter()
            if it > 0:  # first iteration is warmup
                prefill.append(a.input_len / (t1 - t0))
                decode.append((a.output_len - 1) / (t3 - t2))
    print(json.dumps({"peer": "transformers", "version": transformers.__version__, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "dtype": a.dtype, "config": a.config_dir,
                      "input_len": a.input_len, "output_len": a.output_len,
                      "prefill_tokens_per_s": statistics.median(prefill),
                      "decode_tokens_per_s": statistics.median(decode)}))


if __name__ == "__main__":
    main()
