#!/usr/bin/env python3
"""Prefill table for docs/benchmarks.md from one scripts/gpu-check.sh run: ssmserve prefill tokens/s
(bench latency JSON files OUTDIR/prefill-<model>-<B>x<L>.json) next to the compute roofline at the bf16 GEMM rate
measured in the same run (OUTDIR/gemm-prefill.log from bench_cuda_gemm; gemm.log in older runs), and the transformers peer (OUTDIR/peer.log) as a
ratio. Roofline tokens/s = GEMM FLOP/s / (2 x parameters); shown for the parameters without the embedding (the
products a prefill token really runs: the LM head runs on one row per sequence) and for all parameters.

usage: bench/prefill_report.py OUTDIR [CONFIGS_DIR]
"""
import glob
import json
import os
import sys


def params(cfg):
    """(non-embedding, total) parameter counts of a Mamba / Mamba-2 config.json (tied embeddings)."""
    H, V, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    K = cfg.get("conv_kernel", 4)
    if cfg.get("model_type") == "mamba2":
        I = cfg.get("expand", 2) * H
        N, G, NH = cfg["state_size"], cfg.get("n_groups", 1), cfg["num_heads"]
        C = I + 2 * G * N
        layer = H * (I + C + NH) + C * K + C + 3 * NH + I + I * H + H
    else:
        I, N = cfg["intermediate_size"], cfg["state_size"]
        R = cfg.get("time_step_rank", -(-H // 16))
        if R == "auto":
            R = -(-H // 16)
        layer = H * 2 * I + I * K + I + (R + 2 * N) * I + I * R + I + I * N + I + I * H + H
    body = n * layer + H
    return body, body + V * H


def main():
    out = sys.argv[1]
    cdir = sys.argv[2] if len(sys.argv) > 2 else "configs"
    tflops = None
    for name in ("gemm.log", "gemm-prefill.log"):
        path = os.path.join(out, name)
        for line in open(path, errors="replace") if os.path.exists(path) else []:
            if "bf16_gemm_tflops_best" in line:
                tflops = json.loads(line)["bf16_gemm_tflops_best"]
    peers = {}
    if os.path.exists(os.path.join(out, "peer.log")):
        for line in open(os.path.join(out, "peer.log"), errors="replace"):
            if line.startswith("{"):
                r = json.loads(line)
                peers[os.path.basename(r["config"].rstrip("/"))] = r
    print(f"bf16 GEMM rate measured in this run: {tflops} TFLOP/s")
    print("| model shape | prompts | ssmserve prefill tok/s | roofline tok/s (non-emb. / all params) | of roofline "
          "(non-emb. / all) | transformers eager tok/s | ssmserve / transformers |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(out, "prefill-*.json"))):
        r = json.load(open(path))
        model = os.path.basename(r["model"].rstrip("/"))
        cfg = json.load(open(os.path.join(cdir, model, "config.json")))
        body, total = params(cfg)
        tps = r["prefill_tokens_per_s"]
        shape = f'{r["batch_size"]} x {r["input_len"]}'
        roof = (tflops * 1e12 / (2 * body), tflops * 1e12 / (2 * total)) if tflops else (None, None)
        frac = f"{100 * tps / roof[0]:.0f}% / {100 * tps / roof[1]:.0f}%" if tflops else "-"
        roofs = f"{roof[0]:,.0f} / {roof[1]:,.0f}" if tflops else "-"
        pr = peers.get(model, {})
        peer = pr.get(f'prefill_{r["batch_size"]}x{r["input_len"]}_tokens_per_s')
        note = ""
        if not peer:  # the peer at a shorter prompt of the same batch (eager's rate barely depends on the length)
            for k, v in pr.items():
                if k.startswith(f'prefill_{r["batch_size"]}x') and k.endswith("_tokens_per_s") and v:
                    peer, note = v, f' (at {k[len("prefill_"):-len("_tokens_per_s")].replace("x", " x ")})'
        ratio = f"{tps / peer:.1f}x" if peer else "-"
        print(f"| {model} ({total / 1e9:.2f} B) | {shape} | {tps:,.0f} | {roofs} | {frac} | "
              f"{f'{peer:,.0f}' if peer else '-'}{note} | {ratio} |")
    for model, p in peers.items():
        line = (f"peer {model}: batch-1 decode {p.get('decode_batch1_tokens_per_s', 0):.1f} tok/s, "
                f"fast kernels {p.get('fast_kernels')}, {p.get('skipped', [])}")
        for name in (f"decode_b1_{model}.json",):
            path = os.path.join(out, name)
            if os.path.exists(path) and p.get("decode_batch1_tokens_per_s"):
                d = json.load(open(path)).get("decode_tokens_per_s")
                if d:
                    line += f"; ssmserve batch-1 decode {d:.1f} tok/s = {d / p['decode_batch1_tokens_per_s']:.1f}x"
        print(line)
    # Offline throughput (bench throughput JSON tput_<model>.json) next to the compute roofline and the peer.
    for path in sorted(glob.glob(os.path.join(out, "tput_*.json"))):
        r = json.load(open(path))
        model = os.path.basename(r["model"].rstrip("/"))
        cfg = json.load(open(os.path.join(cdir, model, "config.json")))
        body, total = params(cfg)
        tps = r["tokens_per_second"]
        roof = tflops * 1e12 / (2 * total) if tflops else None
        line = (f"throughput {model}: {r['num_requests']} prompts {r.get('input_len')} -> {r['output_len']}, "
                f"{tps:,.0f} total tok/s in {r['elapsed_time']:.2f} s")
        if roof:
            line += f", compute roofline (2 x all params) {roof:,.0f} tok/s: {100 * tps / roof:.1f}%"
        pt = peers.get(model, {}).get("throughput", {})
        if pt.get("tokens_per_s"):
            line += (f"; transformers ({pt['prompts']} prompts, batch {pt['batch']}, {pt['input_len']} -> "
                     f"{pt['output_len']}) {pt['tokens_per_s']:,.0f} tok/s: {tps / pt['tokens_per_s']:.1f}x")
        print(line)


if __name__ == "__main__":
    main()
