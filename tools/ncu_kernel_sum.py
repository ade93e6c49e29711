#!/usr/bin/env python3
"""Per-kernel totals of an Nsight Compute timing run (docs/benchmarks.md's "where a step went" tables).

  ncu --metrics gpu__time_duration.sum --csv --log-file OUT.csv --cache-control none --clock-control none \
      ssmserve bench latency ...                       # a whole run (add --profile-from-start off and
                                                       # SSMSERVE_PROFILE_REPLAY=5 for one decode graph replay)
  python3 tools/ncu_kernel_sum.py OUT.csv [--top N] [--sequence N]

Prints the number of kernels and their summed duration, then one line per kernel name (template arguments kept,
argument lists and namespaces dropped), largest total first: total us, calls, us per call. --sequence N also prints
the first N kernels in launch order. ncu runs the kernels one at a time, so the sum exceeds the step's wall time
where kernels overlapped (PDL, a second graph branch).
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

_UNIT_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def short_name(name: str) -> str:
    """The kernel's name without its argument list, return type or namespaces (template arguments kept)."""
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)  # ncu may abbreviate "(anonymous namespace)" to an unbalanced "unnamed>"
        elif ch == "(" and depth == 0:
            cut = i
            break
    base = name[:cut].strip()
    base = re.sub(r"^void\s+", "", base)
    base = re.sub(r"(\b\w+::)*(\(anonymous namespace\)|<?unnamed>)::", "", base)
    return re.sub(r"\bssmserve::(cuda::)?", "", base)


def read(path: str):
    """(kernel short name, us) per profiled kernel, in launch order."""
    out, header = [], None
    with open(path, newline="", errors="replace") as f:
        for row in csv.reader(f):
            if "Kernel Name" in row and "Metric Value" in row:
                header = row
                continue
            if header is None or len(row) != len(header):
                continue
            d = dict(zip(header, row))
            if d.get("Metric Name") != "gpu__time_duration.sum":
                continue
            scale = _UNIT_TO_US.get(d.get("Metric Unit", "ns"), 1e-3)
            out.append((short_name(d["Kernel Name"]), float(d["Metric Value"].replace(",", "")) * scale))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40, help="kernel names to print (largest totals)")
    ap.add_argument("--sequence", type=int, default=0, help="also print the first N kernels in launch order")
    a = ap.parse_args()
    seq = read(a.csv)
    if not seq:
        print(f"{a.csv}: no gpu__time_duration.sum rows", file=sys.stderr)
        return 1
    agg: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for n, us in seq:
        agg[n][0] += 1
        agg[n][1] += us
    print(f"kernels {len(seq)} total {sum(us for _, us in seq):.1f} us")
    for n, (calls, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{us:11.1f} us {calls:5d} x {us / calls:9.2f}  {n[:150]}")
    if a.sequence:
        print("--- launch order ---")
        for n, us in seq[: a.sequence]:
            print(f"{us:9.2f}  {n[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
