#!/usr/bin/env python3
"""Measures tokenizer encode throughput on the LAMBADA passages: ssmserve (the LAMBADA cases of
build/test_tokenizer_configs, test_tokenizer_sentencepiece and test_tokenizer_lambada, which print MB/s) against HF
`tokenizers` (Tokenizer.encode per passage and encode_batch, one thread: RAYON_NUM_THREADS=1) and the `sentencepiece`
package on the same files. Prints a Markdown table for docs/benchmarks.md.

Run: /work/venv-tok/bin/python tools/make_tokenizer_throughput.py [--shared DIR] [--build DIR]
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import time

os.environ["RAYON_NUM_THREADS"] = "1"
import sentencepiece as spm  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizers"
FAMILIES = ["llama_legacy", "metaspace_first", "bytelevel_llama3", "falcon_digits", "normalizer_mix"]


def best_of(n, f):
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def ssmserve_rates(build, shared):
    env = dict(os.environ, SSMSERVE_SHARED_DIR=str(shared))
    rates = {}
    for exe, filt in [("test_tokenizer_configs", "*Lambada*"), ("test_tokenizer_sentencepiece", "*Lambada*"),
                      ("test_tokenizer_lambada", "*")]:
        out = subprocess.run([str(build / exe), f"--gtest_filter={filt}"], env=env, capture_output=True, text=True,
                             check=True).stdout
        for m in re.finditer(r"\[tokenizer\] (\S+) LAMBADA: \d+ bytes, encode ([\d.]+) MB/s(?: cold, ([\d.]+) MB/s warm)?",
                             out):
            rates[m.group(1)] = float(m.group(3) or m.group(2))
        m = re.search(r"\[tokenizer\] LAMBADA: .*\(([\d.]+) MB/s\)", out)
        if m:
            rates["gpt-neox"] = float(m.group(1))
    return rates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--build", default=str(ROOT / "build"))
    args = ap.parse_args()
    texts = [json.loads(line)["text"] for line in open(pathlib.Path(args.shared) / "data" / "lambada_test.jsonl")]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    ours = ssmserve_rates(pathlib.Path(args.build), pathlib.Path(args.shared))
    print("| tokenizer | ssmserve MB/s | tokenizers encode() MB/s | tokenizers encode_batch, 1 thread MB/s |")
    print("|---|---:|---:|---:|")
    files = [(f, DATA / f / "tokenizer.json") for f in FAMILIES] + [("gpt-neox", ROOT / "models/tiny-mamba/tokenizer.json")]
    for name, path in files:
        tok = Tokenizer.from_file(str(path))
        one = best_of(3, lambda: [tok.encode(t) for t in texts])
        batch = best_of(3, lambda: tok.encode_batch(texts))
        print(f"| {name} | {ours.get(name, float('nan')):.1f} | {mb / one:.1f} | {mb / batch:.1f} |")
    for name in ["spm_bpe", "spm_unigram"]:
        sp = spm.SentencePieceProcessor(model_file=str(DATA / name / "tokenizer.model"))
        one = best_of(3, lambda: [sp.encode(t) for t in texts])
        print(f"| {name} (sentencepiece {spm.__version__}) | {ours.get(name, float('nan')):.1f} | {mb / one:.1f} | |")


if __name__ == "__main__":
    main()
