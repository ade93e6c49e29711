#!/usr/bin/env python3
"""Peer measurement for docs/benchmarks.md (issue 8): Hugging Face transformers' MiniMax on one GPU at a config's
shape (random init, bf16, eager attention by default): per context length, one prefill forward over the prompt
(tokens/s) and batch-1 decode steps with the cache (ms per token, median). A context that does not fit prints an
"out of memory" line. Needs torch + transformers (not part of the test suite).

usage: bench/peer_transformers_minimax_gpu.py CONFIG_DIR [--contexts 1024,4096,16384,65536] [--decode-steps 16]
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
    ap.add_argument("--contexts", default="1024,4096,16384,65536")
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--attn", default="eager")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.from_pretrained(a.config_dir)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                              attn_implementation=a.attn).eval()
    print(json.dumps({"peer": "transformers", "version": transformers.__version__, "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(), "attn": a.attn, "load_s": time.perf_counter() - t0}),
          flush=True)

    def run(n):
        ids = torch.randint(0, 50000, (1, n), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
        prefill = time.perf_counter() - t0
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        steps = []
        for _ in range(a.decode_steps):
            t0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            steps.append(time.perf_counter() - t0)
            cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return prefill, statistics.median(steps[2:])

    with torch.inference_mode():
        run(256)  # warm-up
        for n in [int(x) for x in a.contexts.split(",")]:
            try:
                prefill, step = run(n)
                res = {"context": n, "prefill_ms": 1e3 * prefill, "prefill_tokens_per_s": n / prefill,
                       "decode_ms_per_token": 1e3 * step}
            except torch.OutOfMemoryError:
                res = {"context": n, "error": "out of memory"}
            torch.cuda.empty_cache()
            print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
