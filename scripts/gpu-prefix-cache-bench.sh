#!/usr/bin/env bash
# Prefix caching on the GPU (issue 28): the GPU exactness test, then `bench multiturn` (time to first token of a turn
# whose history is cached vs uncached, histories 1k-32k) and `bench throughput` with caching on and off on prompts
# that share nothing, at the mamba2-2.7b, mamba-2.8b and MiniMax bench shapes with dummy weights.
# Usage: scripts/gpu-prefix-cache-bench.sh BIN_DIR OUT_DIR   (BIN_DIR holds ssmserve and test_cuda_prefix_cache)
set -uo pipefail
bin=${1:?usage: scripts/gpu-prefix-cache-bench.sh BIN_DIR OUT_DIR}
out=${2:?usage: scripts/gpu-prefix-cache-bench.sh BIN_DIR OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export SSMSERVE_SOURCE_DIR="$PWD"
step() {  # log name, seconds, command...
  local log=$1 secs=$2
  shift 2
  echo "== $*" >>"$out/$log"
  timeout "$secs" "$@" >>"$out/$log" 2>&1
  echo "rc=$?" >>"$out/$log"
}
[ -x "$bin/test_cuda_prefix_cache" ] && step tests.log 300 "$bin/test_cuda_prefix_cache"
# Batch-invariant mode is read once per process: cached == uncached bit for bit (swap-ins included) in its own run.
[ -x "$bin/test_cuda_prefix_cache" ] && SSMSERVE_BATCH_INVARIANT=1 step tests-batch-invariant.log 300 \
  "$bin/test_cuda_prefix_cache" --gtest_filter='*SwapSpaceBatchInvariant*:*CachedEqualsUncached*'
for m in mamba2-2.7b mamba-2.8b minimax-bench; do
  step "multiturn-$m.log" 300 "$bin/ssmserve" bench multiturn --model "configs/$m" --load-format dummy --device cuda \
    --history-lens 1024 2048 4096 8192 16384 32768 --turn-tokens 200 --output-len 32 --num-iters 3 \
    --max-num-batched-tokens 8192 --max-num-seqs 16 --output-json "$out/multiturn-$m.json"
done
for m in mamba2-2.7b mamba-2.8b; do
  for flag in --enable-prefix-caching --no-enable-prefix-caching; do
    step "throughput-$m.log" 300 "$bin/ssmserve" bench throughput --model "configs/$m" --load-format dummy --device cuda \
      --num-prompts 256 --input-len 512 --output-len 128 --max-num-seqs 64 "$flag"
  done
done
