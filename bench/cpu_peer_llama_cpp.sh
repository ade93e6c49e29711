#!/usr/bin/env bash
# CPU peer run: llama.cpp's llama-bench against ssmserve bench latency on one config at batch 1, the two run one
# after the other (never at once), ROUNDS times, with bench_roofline's read bandwidth and the load average before
# each run: this VM's memory bandwidth moves between minutes, and decode is bound by it.
# Needs: a llama.cpp CPU build (LLAMA_BENCH) and a GGUF of the same shape (GGUF), e.g. the config's dummy weights
# (tools/save_dummy_checkpoint) converted with llama.cpp's convert_hf_to_gguf.py --outtype bf16.
# Usage: LLAMA_BENCH=... GGUF=... [SSM_BUILD=build] [ROUNDS=2] [THREADS=2] bench/cpu_peer_llama_cpp.sh [CONFIG_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
cfg=${1:-configs/granite-4.0-h-micro}
build=${SSM_BUILD:-build}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
: "${LLAMA_BENCH:?set LLAMA_BENCH to llama.cpp's build/bin/llama-bench}"
: "${GGUF:?set GGUF to the model's .gguf}"
probe() { echo "## $1 | $(uptime | sed 's/.*load/load/') | $("$build"/bench_roofline | grep -o '"read_bandwidth_GBps": [0-9.]*')"; }
for r in $(seq "$rounds"); do
  probe "round $r llama.cpp"
  "$LLAMA_BENCH" -m "$GGUF" -t "$threads" -p 256 -n 16 -r 3 2>/dev/null | grep -E 'pp256|tg16'
  probe "round $r ssmserve"
  "$build"/ssmserve bench latency --model "$cfg" --tokenizer models/tiny-mamba --load-format dummy --device cpu \
    --threads "$threads" --batch-size 1 --input-len 256 --output-len 16 --num-iters 3 --num-iters-warmup 1 2>/dev/null |
    grep -E 'prefill|decode'
done
probe "end"
