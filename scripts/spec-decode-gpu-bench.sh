#!/usr/bin/env bash
# Speculative decoding against the acceptance rate (issue 29's benchmark): dummy weights at bench shapes, the
# benchmark-only replay drafter (`bench latency --speculative-config '{"method":"replay",...}'
# --replay-acceptance-rates ...`: a plain greedy pass records each prompt's continuation, then one run per rate drafts
# the recorded token with that probability per position). Per model and k, one `bench latency` run covers every batch
# size and rate. Writes OUT/spec-decode-<device>.md (model, batch, k, rate, plain tok/s, spec tok/s, speedup,
# acceptance, mean length), the JSON and logs per run, and prints per model whether the issue's targets are met:
# k = 4, batch 1, rate 1: >= 3x the plain decode rate; rate 0: at most 10% slower.
#
# Usage: scripts/spec-decode-gpu-bench.sh --bin PATH/ssmserve --out DIR [--models "mamba-2.8b mamba2-2.7b minimax-bench"]
#          [--batches "1 8"] [--ks "2 4 8"] [--rates "0 0.5 1"] [--device cuda|cpu] [--input-len 32] [--output-len 128]
#          [--num-iters 3] [--threads N] [--no-adaptive] [--quick]
# --bin may be a scripts/gpu-package.sh folder's ssmserve (its lib/ goes on LD_LIBRARY_PATH). A model is a folder (with
# config.json, relative to the repository root) or a name under configs/. --quick: k = 4, rates 0 and 1, 64 output tokens,
# 2 iterations (the two targets only). --no-adaptive: "adaptive_draft_length": false (every draft verified, vLLM's
# behaviour; outputs named *-fixed*), else the engine's default adaptive draft length.
set -uo pipefail
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
bin="" out="" models="mamba-2.8b mamba2-2.7b minimax-bench" batches="1 8" ks="2 4 8" rates="0 0.5 1" device=cuda
input_len=32 output_len=128 num_iters=3 threads="" quick=0 adaptive=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --ks) ks=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --input-len) input_len=$2; shift 2 ;;
    --output-len) output_len=$2; shift 2 ;;
    --num-iters) num_iters=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --no-adaptive) adaptive=0; shift ;;
    -h|--help) usage 0 ;;
    *) echo "error: unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$bin" ] && [ -n "$out" ] || { echo "error: --bin and --out are required" >&2; usage; }
[ -x "$bin" ] || { echo "error: --bin $bin is not an executable" >&2; exit 2; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
# A scripts/gpu-package.sh folder keeps its shared libraries in lib/ next to the executables.
[ -d "$(dirname "$bin")/lib" ] && export LD_LIBRARY_PATH="$(dirname "$bin")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$out" && out=$(cd "$out" && pwd)
suffix="" extra=""
[ "$adaptive" = 0 ] && suffix="-fixed" extra=',"adaptive_draft_length":false'
if [ "$quick" = 1 ]; then ks=4 rates="0 1" output_len=64 num_iters=2; fi
cd "$(dirname "$0")/.."
model_dir() { if [ -f "$1/config.json" ]; then echo "$1"; else echo "configs/$1"; fi; }
for m in $models; do  # every model checked before the first run
  [ -f "$(model_dir "$m")/config.json" ] || { echo "error: model $m: neither $m/config.json nor configs/$m/config.json exists (paths are relative to the repository root)" >&2; exit 2; }
done
start=$(date +%s)
for m in $models; do
  dir=$(model_dir "$m")
  name=$(basename "$dir")
  for k in $ks; do
    tag="$name-k$k$suffix"
    # shellcheck disable=SC2086
    timeout 600 "$bin" bench latency --model "$dir" --load-format dummy --device "$device" ${threads:+--threads $threads} \
      --input-len "$input_len" --output-len "$output_len" --num-iters "$num_iters" --num-iters-warmup 1 \
      --batch-size $batches --speculative-config "{\"method\":\"replay\",\"num_speculative_tokens\":$k,\"seed\":29$extra}" \
      --replay-acceptance-rates $rates --output-json "$out/$tag.json" >"$out/$tag.log" 2>&1
    rc=$?
    echo "$tag rc=$rc ($(($(date +%s) - start)) s so far)"
    [ $rc -eq 0 ] || tail -5 "$out/$tag.log"
    grep -E '^ +(plain|rate|note)' "$out/$tag.log" | sed "s/^/  /"
  done
done
python3 - "$out" "$device" "$models" "$ks" "$suffix" <<'PY'
import json, os, sys
out, device, models, ks, suffix = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
rows = []
for m in models:
    name = os.path.basename(m.rstrip("/"))
    for k in ks:
        p = os.path.join(out, f"{name}-k{k}{suffix}.json")
        if not os.path.exists(p):
            rows.append((name, None, int(k), None, None))
            continue
        for r in json.load(open(p))["results"]:
            for x in r["replay"]:
                rows.append((name, r["batch_size"], r["num_speculative_tokens"], x, r))
adaptive = "off (every draft verified)" if suffix else "on (the engine's default)"
md = [f"Speculative decoding with the replay drafter, device {device}, dummy weights, adaptive draft length {adaptive} "
      f"(scripts/spec-decode-gpu-bench.sh); decode tokens/s, median of the timed iterations.", "",
      "| model | batch | k | rate | plain tok/s | spec tok/s | speedup | acceptance | mean length |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for name, b, k, x, r in rows:
    if x is None:
        md.append(f"| {name} | | {k} | (run failed: see {name}-k{k}{suffix}.log) | | | | | |")
        continue
    md.append(f"| {name} | {b} | {k} | {x['rate']:g} | {r['plain_decode_tokens_per_s']:.1f} | {x['decode_tokens_per_s']:.1f} | "
              f"{x['speedup']:.2f}x | {100 * x['acceptance_rate']:.1f}% | {x['mean_acceptance_length']:.2f} |")
open(os.path.join(out, f"spec-decode-{device}{suffix}.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
print()
print("targets (k = 4, batch 1): rate 1 >= 3x plain; rate 0 at most 10% slower")
for m in models:
    name = os.path.basename(m.rstrip("/"))
    got = {x["rate"]: x for n, b, k, x, r in rows if x and n == name and b == 1 and k == 4}
    parts = []
    if 1 in got:
        s = got[1]["speedup"]
        parts.append(f"k=4 b=1 rate 1: {s:.2f}x ({'met' if s >= 3 else 'NOT met'}; acceptance {100 * got[1]['acceptance_rate']:.1f}%)")
    else:
        parts.append("k=4 b=1 rate 1: not measured")
    if 0 in got:
        d = 100 * (got[0]["speedup"] - 1)
        parts.append(f"rate 0: {d:+.1f}% ({'met' if d >= -10 else 'NOT met'})")
    else:
        parts.append("rate 0: not measured")
    print(f"{name}: " + ", ".join(parts))
    div = sum(x.get("num_diverged_requests", 0) for n, b, k, x, r in rows if x and n == name)
    if div:
        print(f"  note: {div} {name} requests left their recorded continuation (the speculative run's greedy tokens "
              "differ from the plain pass's): acceptance is below the rate there (see the logs)")
PY
echo "wrote $out/spec-decode-$device$suffix.md ($(($(date +%s) - start)) s)"
