#!/usr/bin/env python3
"""Reads tools/cupti_trace's CSV (one row per kernel of the last graph replays) and prints, per replay (decode step),
its span and the sum of its kernels' times, then per kernel name over the replays: launches, mean time, and the mean
'advance' (how far the kernel moved the step's latest end: end - max(end of every kernel that started before it), 0
for a kernel that ends under another, e.g. on a second graph branch); the advances add up to the step's span minus
its first kernel's start gap. --timeline N prints the first N kernels of the last replay with start offsets, times and
the gap from the previous end (negative: PDL overlap)."""
import argparse
import collections
import csv
import lzma
import sys


def read(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("start_ns", "end_ns", "grid", "block", "regs"):
            r[k] = int(r[k])
    steps = collections.OrderedDict()
    for r in sorted(rows, key=lambda r: r["start_ns"]):
        steps.setdefault(r["corr"], []).append(r)
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--timeline", type=int, default=0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    steps = read(a.csv)
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])  # name -> launches, time us, advance us
    spans = []
    for corr, ks in steps.items():
        t0 = ks[0]["start_ns"]
        span = (max(k["end_ns"] for k in ks) - t0) / 1e3
        busy = sum(k["end_ns"] - k["start_ns"] for k in ks) / 1e3
        spans.append(span)
        print(f"replay {corr}: {len(ks)} kernels, span {span:.1f} us, kernel time summed {busy:.1f} us")
        latest = t0
        for k in ks:
            key = f"{k['name'][:90]} [{k['grid']}x{k['block']}]"
            adv = max(0, k["end_ns"] - latest) / 1e3
            latest = max(latest, k["end_ns"])
            e = agg[key]
            e[0] += 1
            e[1] += (k["end_ns"] - k["start_ns"]) / 1e3
            e[2] += adv
    n = len(steps)
    print(f"\nper replay (mean of {n}); advance = how much the kernel moved the step's end")
    print(f"{'launches':>8} {'time us':>9} {'advance us':>10}  kernel [grid x block]")
    tot_adv = 0.0
    for key, (c, t, adv) in sorted(agg.items(), key=lambda kv: -kv[1][2])[: a.top]:
        print(f"{c / n:8.1f} {t / n:9.1f} {adv / n:10.1f}  {key}")
    tot_adv = sum(v[2] for v in agg.values()) / n
    print(f"advance total {tot_adv:.1f} us of span {sum(spans) / n:.1f} us")
    if a.timeline:
        ks = list(steps.values())[-1]
        t0 = ks[0]["start_ns"]
        prev_end = t0
        print(f"\n{'start':>9} {'time':>7} {'gap':>7}  kernel (last replay, us)")
        for k in ks[: a.timeline]:
            print(f"{(k['start_ns'] - t0) / 1e3:9.2f} {(k['end_ns'] - k['start_ns']) / 1e3:7.2f} "
                  f"{(k['start_ns'] - prev_end) / 1e3:7.2f}  {k['name'][:80]} [{k['grid']}x{k['block']}]")
            prev_end = max(prev_end, k["end_ns"]) if k is not ks[0] else k["end_ns"]


if __name__ == "__main__":
    sys.exit(main())
