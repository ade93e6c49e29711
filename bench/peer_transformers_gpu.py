#!/usr/bin/env python3
"""GPU peer for docs/benchmarks.md: Hugging Face transformers' Mamba / Mamba-2 on the same GPU as ssmserve, random
weights from each config (bf16, initialized on the device), its eager path (no torch.compile, no CUDA graphs;
the mamba_ssm / causal_conv1d kernels are used only if installed, and the JSON says whether they were).
Measures prefill tokens/s of one forward over B x L prompt tokens for each --prefill shape (e.g. 1x8192,
16x2048) and batch-1 greedy decode tokens/s (cached one-token forwards after a --decode-input-len prompt).
With --throughput N, also offline throughput the way `ssmserve bench throughput` counts it (prompt + output
tokens per second): N random prompts of --tput-input-len tokens in batches of --tput-batch, each batch one
prefill forward then --tput-output-len - 1 cached greedy one-token forwards (a batched forward loop: eager
transformers has no continuous batching). Prints one JSON object per config. A shape that runs out of memory
or past --time-limit is reported as skipped.

usage: bench/peer_transformers_gpu.py CONFIG_DIR... [--prefill 1x8192 16x2048] [--decode-input-len 32]
       [--decode-len 32] [--num-iters 1] [--time-limit 120] [--throughput N --tput-batch B
       --tput-input-len 512 --tput-output-len 256]
"""
import argparse
import importlib.util
import json
import statistics
import time

import torch
import transformers


DEV = "cuda"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def fwd(model, **kw):
    """model(**kw), dropping the optional keywords an older transformers does not take."""
    try:
        return model(**kw)
    except TypeError:
        kw.pop("logits_to_keep", None)
        return model(**kw)


def prefill_rate(model, batch, length, iters, vocab):
    ids = torch.randint(0, vocab, (batch, length), device=DEV)
    rates = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fwd(model, input_ids=ids, use_cache=True, logits_to_keep=1)
        sync()
        rates.append(batch * length / (time.perf_counter() - t0))
    return statistics.median(rates)


def decode_rate(model, input_len, steps, vocab):
    ids = torch.randint(0, vocab, (1, input_len), device=DEV)
    out = fwd(model, input_ids=ids, use_cache=True, logits_to_keep=1)
    cache, tok, pos = out.cache_params, out.logits[:, -1].argmax(-1, keepdim=True), input_len
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=tok, cache_params=cache, use_cache=True, cache_position=torch.tensor([pos], device=DEV))
        cache, tok, pos = out.cache_params, out.logits[:, -1].argmax(-1, keepdim=True), pos + 1
    sync()
    return steps / (time.perf_counter() - t0)


def throughput_rate(model, prompts, batch, input_len, output_len, vocab):
    """(prompt + output tokens) / s over `prompts` prompts run `batch` at a time (prefill, then cached decode)."""
    sync()
    t0 = time.perf_counter()
    done = 0
    while done < prompts:
        b = min(batch, prompts - done)
        ids = torch.randint(0, vocab, (b, input_len), device=DEV)
        out = fwd(model, input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, tok, pos = out.cache_params, out.logits[:, -1].argmax(-1, keepdim=True), input_len
        for _ in range(output_len - 1):
            out = model(input_ids=tok, cache_params=cache, use_cache=True, cache_position=torch.tensor([pos], device=DEV))
            cache, tok, pos = out.cache_params, out.logits[:, -1].argmax(-1, keepdim=True), pos + 1
        done += b
    sync()
    return prompts * (input_len + output_len) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config_dirs", nargs="+")
    ap.add_argument("--prefill", nargs="*", default=["1x8192", "16x2048"])
    ap.add_argument("--decode-input-len", type=int, default=32)
    ap.add_argument("--decode-len", type=int, default=32)
    ap.add_argument("--num-iters", type=int, default=1)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    ap.add_argument("--time-limit", type=float, default=120.0, help="skip later prefill shapes of a config past this")
    ap.add_argument("--throughput", type=int, default=0, help="prompts of the offline throughput run (0: none)")
    ap.add_argument("--tput-batch", type=int, default=64)
    ap.add_argument("--tput-input-len", type=int, default=512)
    ap.add_argument("--tput-output-len", type=int, default=256)
    a = ap.parse_args()
    global DEV
    DEV = a.device
    torch.manual_seed(0)
    fast = {m: importlib.util.find_spec(m) is not None for m in ("mamba_ssm", "causal_conv1d")}
    for cdir in a.config_dirs:
        cfg = transformers.AutoConfig.from_pretrained(cdir)
        res = {"peer": "transformers", "version": transformers.__version__, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu", "dtype": "bfloat16", "config": cdir, "fast_kernels": fast}
        t_start = time.perf_counter()
        with torch.device(DEV):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
        res["params"] = sum(p.numel() for p in model.parameters())
        vocab = cfg.vocab_size
        with torch.inference_mode():
            prefill_rate(model, 1, 128, 1, vocab)  # warmup (allocator, kernels)
            for shape in a.prefill:
                b, l = (int(v) for v in shape.split("x"))
                key = f"prefill_{b}x{l}_tokens_per_s"
                if time.perf_counter() - t_start > a.time_limit:
                    res[key] = None
                    res.setdefault("skipped", []).append(f"{shape}: time limit")
                    continue
                try:
                    res[key] = prefill_rate(model, b, l, a.num_iters, vocab)
                    res[f"prefill_{b}x{l}_at_s"] = round(time.perf_counter() - t_start, 1)
                except torch.OutOfMemoryError:  # noqa: PERF203
                    res[key] = None
                    res.setdefault("skipped", []).append(f"{shape}: out of memory")
                if DEV == "cuda":
                    torch.cuda.empty_cache()
            res["decode_input_len"] = a.decode_input_len
            res["decode_batch1_tokens_per_s"] = decode_rate(model, a.decode_input_len, a.decode_len, vocab)
            if a.throughput > 0:
                res["throughput"] = {"prompts": a.throughput, "batch": a.tput_batch, "input_len": a.tput_input_len,
                                     "output_len": a.tput_output_len}
                try:
                    res["throughput"]["tokens_per_s"] = throughput_rate(model, a.throughput, a.tput_batch,
                                                                        a.tput_input_len, a.tput_output_len, vocab)
                except torch.OutOfMemoryError:
                    res["throughput"]["tokens_per_s"] = None
                    res.setdefault("skipped", []).append("throughput: out of memory")
        res["seconds"] = time.perf_counter() - t_start
        print(json.dumps(res), flush=True)
        del model
        if DEV == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
