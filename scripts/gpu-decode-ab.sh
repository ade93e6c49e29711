#!/usr/bin/env bash
# Batch-1 decode A/B on the GPU (issue 7): the copy roofline, then `ssmserve bench latency` on a dummy-weight
# model once per variant, the variants interleaved and the whole list repeated, so run-to-run drift (~3% on the
# H200) does not masquerade as a difference. A variant is a space-separated list of VAR=value settings, no quotes
# inside ("-" for the defaults); the same variant may be given twice (an A/A check of the noise). A variant's
# SSMSERVE_PREBUILT=DIR word runs that variant on DIR's executables (a build-switch A/B, e.g. two packages); an
# ARGS=--flag=value word adds that command-line option to the variant's bench (e.g. ARGS=--num-scheduler-steps=8).
# Results: OUTDIR/ab.tsv (variant, repeat, tokens/s) and a median table on stdout.
# Usage: scripts/gpu-decode-ab.sh OUTDIR VARIANT...
#   SSMSERVE_PREBUILT=DIR  executables in DIR (scripts/gpu-package.sh), else build-gpu/;
#   AB_MODEL=configs/mamba-2.8b  AB_BATCH=1  AB_REPEATS=2  AB_INPUT_LEN=32  AB_OUTPUT_LEN=256  AB_ROOFLINE=0 (skip the
#   copy roofline).
# Example: scripts/gpu-decode-ab.sh out - "SSMSERVE_SKINNY_PRELOAD=0" "SSMSERVE_SKINNY_PREFETCH_MB=8"
set -uo pipefail
out=${1:?usage: scripts/gpu-decode-ab.sh OUTDIR VARIANT...}
shift
[ $# -ge 1 ] || { echo "no variants given" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
prebuilt=${SSMSERVE_PREBUILT:-}
[ -n "$prebuilt" ] && { prebuilt=$(cd "$prebuilt" && pwd) || exit 2; }  # relative to the caller's directory
cd "$(dirname "$0")/.."
export SSMSERVE_SOURCE_DIR="$PWD"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
bin=${prebuilt:-build-gpu}
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$bin/lib"
[ -x "$bin/ssmserve" ] || { echo "no $bin/ssmserve (build with SSMSERVE_CUDA=ON or set SSMSERVE_PREBUILT)" >&2; exit 2; }
model=${AB_MODEL:-configs/mamba-2.8b}
if [ "${AB_ROOFLINE:-1}" != 0 ] && [ -x "$bin/test_cuda_decode_bench" ]; then
  SSMSERVE_CHAIN_QUICK=1 "$bin/test_cuda_decode_bench" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaDecodeBench.DISABLED_RooflinesAndGemms' >"$out/roofline.log" 2>&1
  grep -E "^roofline copy" "$out/roofline.log"
fi
for v in "$@"; do  # VAR=value words only (quotes or a leading '-' would reach env as values / options)
  [ "$v" = "-" ] && continue
  for word in $v; do
    [[ "$word" =~ ^[A-Za-z_][A-Za-z0-9_]*=[^\"\']*$ ]] || { echo "bad variant word '$word' in '$v' (VAR=value, no quotes)" >&2; exit 2; }
  done
done
printf 'index\tvariant\trepeat\ttokens_per_s\n' >"$out/ab.tsv"
for r in $(seq 1 "${AB_REPEATS:-2}"); do
  i=0
  for v in "$@"; do
    i=$((i + 1))
    envs=()
    [ "$v" != "-" ] && read -r -a envs <<<"$v"
    vbin=$bin
    vargs=()
    for word in "${envs[@]}"; do
      [[ "$word" == SSMSERVE_PREBUILT=* ]] && vbin=${word#SSMSERVE_PREBUILT=}
      [[ "$word" == ARGS=* ]] && vargs+=("${word#ARGS=}")
    done
    log="$out/v$i-r$r.log"
    env "${envs[@]}" "$vbin/ssmserve" bench latency --model "$model" --load-format dummy --device cuda \
      --batch-size "${AB_BATCH:-1}" --input-len "${AB_INPUT_LEN:-32}" --output-len "${AB_OUTPUT_LEN:-256}" --num-iters 5 \
      --num-iters-warmup 1 "${vargs[@]}" >"$log" 2>&1
    tps=$(sed -nE 's/^decode: +([0-9.]+) tokens\/s.*/\1/p' "$log" | head -1)
    printf '%s\t%s\t%s\t%s\n' "$i" "$v" "$r" "${tps:-FAILED}" >>"$out/ab.tsv"
  done
done
python3 - "$out/ab.tsv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t", quoting=csv.QUOTE_NONE))
for i in dict.fromkeys(r["index"] for r in rows):
    mine = [r for r in rows if r["index"] == i]
    vals = [float(r["tokens_per_s"]) for r in mine if r["tokens_per_s"] != "FAILED"]
    runs = " / ".join(r["tokens_per_s"] for r in mine)
    med = statistics.median(vals) if vals else float("nan")
    print(f"{i:>2} {mine[0]['variant']:58s} median {med:8.1f} tok/s  ({runs})")
EOF
