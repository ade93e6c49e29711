#!/usr/bin/env bash
# CPU benchmark for the MiniMax hybrid (tiny-minimax): prefill/decode tokens/s, and decode time per step against
# context length for the hybrid (real weights) next to all-lightning and all-softmax variants of the same shape
# (dummy weights), which separate the linear layers' constant cost from the softmax layers' growing cost.
# Usage: [THREADS=n] bench/cpu_minimax.sh [MODEL_DIR] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-${SSMSERVE_MODELS_DIR:-../shared/models}/tiny-minimax}
out=${2:-bench/out/minimax}
threads=${THREADS:-0}
mkdir -p "$out/all-linear" "$out/all-softmax"
cmake --build build -j"$(nproc)" --target ssmserve >/dev/null
# Variants: the same config with every layer lightning / every layer softmax (weights are random: timing only).
python3 - "$model/config.json" "$out" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
for kind, name in (("linear_attention", "all-linear"), ("full_attention", "all-softmax")):
    c = dict(cfg, layer_types=[kind] * cfg["num_hidden_layers"])
    json.dump(c, open(f"{sys.argv[2]}/{name}/config.json", "w"), indent=1)
PY
uptime
./build/ssmserve bench latency --model "$model" --input-len 512 --output-len 128 --num-iters 5 --threads "$threads" \
  --output-json "$out/tput.json" 2>/dev/null | tail -2
for L in 128 512 1024 2048 4096 8128; do
  for m in "$model" "$out/all-linear" "$out/all-softmax"; do
    fmt=auto; [ "$m" = "$model" ] || fmt=dummy
    echo -n "context $L $(basename "$m"): "
    ./build/ssmserve bench latency --model "$m" --load-format $fmt --input-len $L --output-len 33 --num-iters 2 --threads "$threads" \
      --max-num-batched-tokens 8192 --output-json "$out/ctx$L-$(basename "$m").json" 2>/dev/null | tail -1
  done
done
uptime
