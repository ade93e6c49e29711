#!/usr/bin/env python3
"""Plots decode tokens/s against batch size (docs/decode_vs_batch.png) from `ssmserve bench latency --batch-size
1 2 4 ... --output-json F` results, with the HBM roofline drawn in: at batch B a decode step must read every
weight once, so tokens/s <= B x copy_bandwidth / weight_bytes (the memory-bound line) and, for large B, <= the
compute roof bf16_rate / (2 x params) (FLOPs per token).

usage: bench/plot_decode_vs_batch.py OUT.png --params P --bandwidth TBPS --gemm-tflops R \
           --series LABEL=results.json [--series LABEL=results.json ...] [--peer LABEL=tok_s@B ...]
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--params", type=float, required=True, help="parameter count (weights read per step, bf16)")
    ap.add_argument("--bandwidth", type=float, required=True, help="measured copy bandwidth, TB/s")
    ap.add_argument("--gemm-tflops", type=float, required=True, help="measured bf16 GEMM rate, TFLOP/s")
    ap.add_argument("--series", action="append", default=[], help="LABEL=bench-latency JSON with a results list")
    ap.add_argument("--peer", action="append", default=[], help="LABEL=tokens_per_s@batch (single points)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()

    fig, ax = plt.subplots(figsize=(7.5, 5))
    allb = []
    for s in a.series:
        label, path = s.split("=", 1)
        with open(path) as f:
            res = json.load(f)["results"]
        b = [r["batch_size"] for r in res]
        t = [r["decode_tokens_per_s"] for r in res]
        allb += b
        ax.plot(b, t, "o-", label=label)
        for x, y in zip(b, t):
            ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    for p in a.peer:
        label, v = p.split("=", 1)
        tok, bb = v.split("@")
        ax.plot([float(bb)], [float(tok)], "s", label=label)
    if not allb:
        allb = [1, 256]
    bs = sorted(set(allb))
    mem = [x * a.bandwidth * 1e12 / (2 * a.params) for x in bs]
    comp = a.gemm_tflops * 1e12 / (2 * a.params)
    roof = [min(m, comp) for m in mem]
    ax.plot(bs, roof, "k--", label=f"roofline: min(B x {a.bandwidth:.1f} TB/s / {2 * a.params / 1e9:.2f} GB, "
                                   f"{a.gemm_tflops:.0f} TFLOP/s / {2 * a.params / 1e9:.2f} GFLOP)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch size (concurrent sequences)")
    ax.set_ylabel("decode tokens/s (all sequences)")
    ax.set_title(a.title or "decode tokens/s vs batch size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
