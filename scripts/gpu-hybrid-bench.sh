#!/usr/bin/env bash
# The Mamba-hybrid benchmarks of docs/benchmarks.md (issue 30) on one GPU, dummy weights at real shapes: per config,
# ssmserve batch-1 prefill + decode at 2k / 8k / 32k prompt tokens (bench latency), offline throughput (bench
# throughput: N prompts of 512 in / 256 out), and the reference numbers of tools/bench_hybrids_reference.py (roofline
# inputs; transformers eager prefill and batch-1 decode in the same run).
# Usage: scripts/gpu-hybrid-bench.sh OUTDIR BIN_DIR [CONFIG...]   (env: NUM_PROMPTS=1000, LENS="2048 8192 32768")
set -uo pipefail
out=${1:?usage: scripts/gpu-hybrid-bench.sh OUTDIR BIN_DIR [CONFIG...]}
bin=${2:?bin dir}
shift 2
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(granite-4.0-h-tiny nemotron-nano-9b-v2 nemotron-3-nano-30b-a3b falcon-h1-7b)
cd "$(dirname "$0")/.."
mkdir -p "$out"
for c in "${configs[@]}"; do
  for len in ${LENS:-2048 8192 32768}; do
    timeout 300 "$bin/ssmserve" bench latency --model "configs/$c" --tokenizer models/tiny-mamba --load-format dummy --device cuda \
      --batch-size 1 --input-len "$len" --output-len 64 --num-iters 3 --max-num-batched-tokens 8192 \
      --output-json "$out/$c-latency-$len.json" >"$out/$c-latency-$len.log" 2>&1
    echo "$c latency $len rc=$? $(grep -E '^(prefill|decode)' "$out/$c-latency-$len.log" | tr '\n' ' ')"
  done
  if [ "${NUM_PROMPTS:-1000}" -gt 0 ]; then
    timeout 400 "$bin/ssmserve" bench throughput --model "configs/$c" --tokenizer models/tiny-mamba --load-format dummy --device cuda \
      --num-prompts "${NUM_PROMPTS:-1000}" --input-len 512 --output-len 256 --max-num-batched-tokens 8192 --max-num-seqs 256 \
      --output-json "$out/$c-throughput.json" >"$out/$c-throughput.log" 2>&1
    echo "$c throughput rc=$? $(tail -3 "$out/$c-throughput.log" | tr '\n' ' ')"
  fi
  timeout 300 python3 tools/bench_hybrids_reference.py "configs/$c" "$out/$c-reference.json" ${EAGER:+--eager} >"$out/$c-reference.log" 2>&1
  echo "$c reference rc=$? $(tail -c 600 "$out/$c-reference.log")"
done
