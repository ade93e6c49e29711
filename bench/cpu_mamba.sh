#!/usr/bin/env bash
# CPU benchmark report for a Mamba-1 shape: roofline probe, ssmserve bench latency at a few batch sizes, and the
# transformers peer (when torch is installed) in the same run. Usage: bench/cpu_mamba.sh [CONFIG_DIR] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
cfg=${1:-configs/mamba-130m}
out=${2:-bench/out}
mkdir -p "$out"
cmake --build build -j"$(nproc)" --target ssmserve bench_roofline >/dev/null
./build/bench_roofline | tee "$out/roofline.json"
for b in 1 4 16; do
  ./build/ssmserve bench latency --model "$cfg" --load-format dummy --input-len 512 --output-len 128 --batch-size "$b" \
    --num-iters 5 --output-json "$out/ssmserve-b$b.json" 2>/dev/null | tail -2
done
if python3 -c "import torch, transformers" 2>/dev/null; then
  python3 bench/peer_transformers.py "$cfg" --input-len 512 --output-len 128 2>/dev/null | tee "$out/peer-transformers.json"
fi
