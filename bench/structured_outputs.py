#!/usr/bin/env python3
"""Structured outputs' cost on the CPU: decode tokens/s of the same requests unconstrained and under each constraint
kind (the grammar's token bitmask per sampled row, on the host), and the first compilation of each constraint.

Usage: bench/structured_outputs.py MODEL_DIR [--batch 1 8] [--tokens 64] [--repeats 3] [--threads 2]
Prints one Markdown table row per (constraint, batch): median tokens/s over the repeats (each a fresh generate over
the same prompts, the compiled grammar cached after the first), and the constrained / unconstrained ratio.
Greedy with ignore_eos off: a constrained output may end early (its grammar complete), so tokens/s counts the tokens
each run produced.
"""
import argparse
import statistics
import time

from ssmserve import LLM, SamplingParams
from ssmserve.sampling_params import StructuredOutputsParams

PROMPTS = ["It is a truth universally acknowledged", "And the LORD said unto Moses,", "The",
           "Emma Woodhouse, handsome, clever, and rich", "Call me Ishmael.", "In the beginning",
           "Happy families are all alike;", "It was the best of times,"]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                            "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}}},
          "required": ["name", "age", "tags"]}

CONSTRAINTS = {
    "none": None,
    "json schema": dict(json=SCHEMA, disable_any_whitespace=True),
    "json_object": dict(json_object=True, disable_any_whitespace=True),
    "regex": dict(regex=r"([A-Z][a-z]{1,12} ){4,40}[a-z]+\."),
    "choice (4)": dict(choice=["yes", "no", "maybe", "it depends on the weather"]),
}


def run(llm, prompts, so, tokens):
    sp = SamplingParams(temperature=0.0, max_tokens=tokens,
                        structured_outputs=StructuredOutputsParams(**so) if so else None)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return n, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    llm = LLM(model=a.model, num_threads=a.threads)  # (kwargs: EngineConfig fields, as the CLI's flags)
    print(f"| constraint | batch | first call (compile + run) s | tokens/s (median of {a.repeats}) | vs none |")
    print("|---|---:|---:|---:|---:|")
    base = {}
    for name, so in CONSTRAINTS.items():
        for b in a.batch:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(b)]
            n0, first = run(llm, prompts, so, a.tokens)
            rates = []
            for _ in range(a.repeats):
                n, dt = run(llm, prompts, so, a.tokens)
                rates.append(n / dt)
            r = statistics.median(rates)
            if so is None:
                base[b] = r
            print(f"| {name} | {b} | {first:.3f} | {r:,.0f} | {r / base[b]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
