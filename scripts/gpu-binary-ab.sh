#!/usr/bin/env bash
# Old-vs-new binary A/B on the GPU (issue 27: a refactor must not cost speed): per model shape, `ssmserve bench
# latency` (batch-1 decode, input 32 -> 128 tokens; prefill, 1 x 8192 -> 2) and `bench throughput` (N prompts of
# 512 -> 256 tokens), each binary in turn, the pair repeated AB_REPEATS times (interleaved, so run-to-run drift hits
# both alike). Writes OUTDIR/ab.tsv (model, metric, binary, repeat, tokens/s) and prints the medians and new/old.
# Usage: scripts/gpu-binary-ab.sh OUTDIR OLD_DIR NEW_DIR
#   OLD_DIR / NEW_DIR hold an `ssmserve` built with SSMSERVE_CUDA=ON (and lib/ for gpu-package.sh packages);
#   AB_MODELS="mamba-2.8b mamba2-2.7b minimax-bench"  AB_REPEATS=3  AB_TPUT_PROMPTS=256  AB_METRICS="decode prefill tput".
set -uo pipefail
out=${1:?usage: scripts/gpu-binary-ab.sh OUTDIR OLD_DIR NEW_DIR}
old=$(cd "${2:?old dir}" && pwd) || exit 2
new=$(cd "${3:?new dir}" && pwd) || exit 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
tsv="$out/ab.tsv"
printf 'model\tmetric\tbinary\trepeat\ttokens_per_s\n' >"$tsv"
run() {  # model metric binary-name binary-dir repeat
  local m=$1 metric=$2 name=$3 dir=$4 r=$5 json="$out/$m-$2-$3-$5.json"
  local lp="$dir/lib"
  case $metric in
    decode) LD_LIBRARY_PATH="$lp:$LD_LIBRARY_PATH" timeout 300 "$dir/ssmserve" bench latency --model "configs/$m" --load-format dummy \
              --device cuda --batch-size 1 --input-len 32 --output-len 128 --num-iters 3 --num-iters-warmup 1 --output-json "$json" ;;
    prefill) LD_LIBRARY_PATH="$lp:$LD_LIBRARY_PATH" timeout 300 "$dir/ssmserve" bench latency --model "configs/$m" --load-format dummy \
               --device cuda --batch-size 1 --input-len 8192 --output-len 2 --num-iters 3 --num-iters-warmup 1 --output-json "$json" ;;
    tput) LD_LIBRARY_PATH="$lp:$LD_LIBRARY_PATH" timeout 300 "$dir/ssmserve" bench throughput --model "configs/$m" --load-format dummy \
            --device cuda --num-prompts "${AB_TPUT_PROMPTS:-256}" --input-len 512 --output-len 256 --max-num-seqs 256 \
            --max-num-batched-tokens 8192 --output-json "$json" ;;
  esac >"$out/$m-$metric-$name-$r.log" 2>&1
  python3 - "$json" "$metric" <<'PY' | sed "s/^/$m\t$metric\t$name\t$r\t/" >>"$tsv"
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception:
    print("nan"); sys.exit()
key = {"decode": "decode_tokens_per_s", "prefill": "prefill_tokens_per_s", "tput": "output_tokens_per_second"}[sys.argv[2]]
print(j.get(key, "nan"))
PY
}
for m in ${AB_MODELS:-mamba-2.8b mamba2-2.7b minimax-bench}; do
  [ -f "configs/$m/config.json" ] || continue
  for metric in ${AB_METRICS:-decode prefill tput}; do
    for r in $(seq 1 "${AB_REPEATS:-3}"); do
      run "$m" "$metric" old "$old" "$r"
      run "$m" "$metric" new "$new" "$r"
    done
  done
done
python3 - "$tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
keys = sorted({(r["model"], r["metric"]) for r in rows}, key=lambda k: (k[0], k[1]))
print(f"{'model':16} {'metric':8} {'old (median)':>14} {'new (median)':>14} {'new/old':>8}  runs")
for m, metric in keys:
    med = {}
    for b in ("old", "new"):
        v = [float(r["tokens_per_s"]) for r in rows if r["model"] == m and r["metric"] == metric and r["binary"] == b]
        v = [x for x in v if x == x]
        med[b] = (statistics.median(v) if v else float("nan"), len(v))
    ratio = med["new"][0] / med["old"][0] if med["old"][0] else float("nan")
    print(f"{m:16} {metric:8} {med['old'][0]:14.1f} {med['new'][0]:14.1f} {ratio:8.3f}  {med['old'][1]}/{med['new'][1]}")
PY
