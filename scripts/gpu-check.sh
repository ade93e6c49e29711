#!/usr/bin/env bash
# GPU check of the CUDA backend in one command (issue 7): builds (or takes prebuilt binaries), runs the op harness,
# compute-sanitizer memcheck + racecheck on it, and the GPU goldens / benchmarks when their executables exist,
# writing every log into OUTDIR and a short summary last.
# Usage: scripts/gpu-check.sh OUTDIR
#   SSMSERVE_PREBUILT=DIR  use the executables in DIR (and shared libraries in DIR/lib) instead of building:
#                          for a GPU machine without the build dependencies (see scripts/gpu-package.sh).
#   SSMSERVE_GPU_BUILD=DIR build directory (default build-gpu); SSMSERVE_GPU_QUICK=1 skips the full-size harness;
#   SSMSERVE_STEP_TIMEOUT=S limit per step (default 300 s; rc 124 = timed out).
# Building on the device machine (offline): carry `.deps` (xgrammar's source archive, cmake/xgrammar.cmake), else the
# build goes without structured outputs and their tests skip.
set -uo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
# Prebuilt test binaries find the goldens / configs / models of this checkout, not their build machine's.
export SSMSERVE_SOURCE_DIR="$PWD"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
status=0

# cuBLASLt and friends: the toolkit's, or the ones beside PyTorch's wheel.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
export PATH="/usr/local/cuda/bin:$PATH"

if [ -n "${SSMSERVE_PREBUILT:-}" ]; then
  bin=$(cd "$SSMSERVE_PREBUILT" && pwd)
  [ -d "$bin/lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$bin/lib"
  note "binaries: prebuilt in $bin"
else
  bin=${SSMSERVE_GPU_BUILD:-build-gpu}
  if ! { cmake -S . -B "$bin" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSMSERVE_CUDA=ON &&
         cmake --build "$bin" -j"$(nproc)"; } >"$out/build.log" 2>&1; then
    note "BUILD FAILED (see build.log)"
    tail -30 "$out/build.log"
    exit 1
  fi
  bin=$(cd "$bin" && pwd)
  note "binaries: built in $bin"
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true; } |
  sed 's/^/gpu: /' | tee -a "$summary"

# 1. Op harness at full size.
run_step() {  # name, log, command...
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  timeout "${SSMSERVE_STEP_TIMEOUT:-300}" "$@" >"$out/$log" 2>&1
  local rc=$?
  note "$(printf '%-28s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$log")"
  [ $rc -ne 0 ] && status=1
  return $rc
}
if [ "${SSMSERVE_GPU_QUICK:-0}" = 1 ]; then
  run_step "op harness (quick)" ops.log env SSMSERVE_CUDA_TEST_QUICK=1 "$bin/test_cuda_ops"
  run_step "scan op harness (quick)" scan-ops.log env SSMSERVE_CUDA_TEST_QUICK=1 "$bin/test_cuda_scan_ops"
else
  run_step "op harness" ops.log "$bin/test_cuda_ops"
  run_step "scan op harness" scan-ops.log "$bin/test_cuda_scan_ops"
fi
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel_err|Expected|seed" "$out/ops.log" "$out/scan-ops.log" | head -60 >>"$summary"

# 2. compute-sanitizer on the small shapes (memcheck: out-of-bounds / misaligned accesses and leaks;
#    racecheck: shared-memory hazards).
if command -v compute-sanitizer >/dev/null; then
  export SSMSERVE_CUDA_TEST_QUICK=1
  run_step "memcheck" memcheck.log compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 "$bin/test_cuda_ops"
  run_step "memcheck (scan ops)" memcheck-scan.log compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 3 "$bin/test_cuda_scan_ops"
  run_step "racecheck" racecheck.log compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 3 \
    "$bin/test_cuda_ops" --gtest_filter='-CudaGemm.*'
  run_step "racecheck (scan ops)" racecheck-scan.log compute-sanitizer --tool racecheck --report-api-errors no \
    --error-exitcode 3 "$bin/test_cuda_scan_ops"
  unset SSMSERVE_CUDA_TEST_QUICK
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/memcheck.log" "$out/memcheck-scan.log" "$out/racecheck.log" \
    "$out/racecheck-scan.log" >>"$summary"
else
  note "compute-sanitizer not found: skipped"
fi

# 3. GPU model runners against the CPU backend (tiny-mamba greedy / logits, Mamba-2 dummy shapes), memcheck on
#    the small ones, and the CLI end to end (--device cuda vs cpu, greedy).
if [ -x "$bin/test_cuda_model" ]; then
  run_step "gpu model tests" model.log "$bin/test_cuda_model"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel err|Expected|graph capture failed" "$out/model.log" | head -50 >>"$summary"
  if command -v compute-sanitizer >/dev/null; then
    run_step "memcheck (model, small)" memcheck-model.log env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer \
      --tool memcheck --report-api-errors no --error-exitcode 3 "$bin/test_cuda_model" \
      --gtest_filter='CudaMambaModel.LogitsMatchCpuWithBf16Weights:CudaMamba2Model.TinyShapeDummyWeightsBf16'
    grep -hE "ERROR SUMMARY" "$out/memcheck-model.log" >>"$summary"
  fi
fi
# 3a. Device sampling (issue 7): sample_rows against the CPU sampler, engine device vs host sampling, memcheck +
#     racecheck on small rows.
if [ -x "$bin/test_cuda_sampling" ]; then
  run_step "sampling tests" sampling.log env SSMSERVE_SOURCE_DIR="$PWD" "$bin/test_cuda_sampling"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|sample_rows V=|engine .*identical" "$out/sampling.log" | head -30 >>"$summary"
  if command -v compute-sanitizer >/dev/null; then
    run_step "memcheck (sampling)" sampling-memcheck.log env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer --tool memcheck \
      --report-api-errors no --error-exitcode 3 "$bin/test_cuda_sampling" --gtest_filter='CudaSampling.*'
    run_step "racecheck (sampling)" sampling-racecheck.log env SSMSERVE_CUDA_TEST_QUICK=2 compute-sanitizer --tool racecheck \
      --report-api-errors no --error-exitcode 3 "$bin/test_cuda_sampling" --gtest_filter='CudaSampling.*'
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sampling-memcheck.log" "$out/sampling-racecheck.log" >>"$summary"
  fi
fi
# 3b. MiniMax hybrid (issue 8): op harnesses (lightning attention; RoPE and paged attention), the GPU runner against
#     the CPU model (dummy weights, tiny-minimax shape; decode graphs == eager), memcheck + racecheck on the small
#     shapes, and the op benchmark.
if [ -x "$bin/test_cuda_minimax_ops" ]; then
  run_step "minimax op harness" minimax-ops.log "$bin/test_cuda_minimax_ops"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|seed" "$out/minimax-ops.log" | head -30 >>"$summary"
  if [ -x "$bin/test_cuda_paged_attention" ]; then
    run_step "paged attention op harness" paged-attention.log "$bin/test_cuda_paged_attention"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|seed" "$out/paged-attention.log" | head -30 >>"$summary"
  fi
  if [ -x "$bin/test_cuda_minimax_model" ]; then
    run_step "minimax model tests" minimax-model.log env SSMSERVE_SOURCE_DIR="$PWD" "$bin/test_cuda_minimax_model"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel err|Expected" "$out/minimax-model.log" | head -30 >>"$summary"
  fi
  if command -v compute-sanitizer >/dev/null; then
    run_step "memcheck (minimax)" minimax-memcheck.log env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer --tool memcheck \
      --report-api-errors no --error-exitcode 3 "$bin/test_cuda_minimax_ops"
    run_step "racecheck (minimax)" minimax-racecheck.log env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer --tool racecheck \
      --report-api-errors no --error-exitcode 3 "$bin/test_cuda_minimax_ops"
    [ -x "$bin/test_cuda_minimax_model" ] &&
      run_step "memcheck (minimax model)" minimax-memcheck-model.log env SSMSERVE_SOURCE_DIR="$PWD" compute-sanitizer \
        --tool memcheck --report-api-errors no --error-exitcode 3 "$bin/test_cuda_minimax_model" \
        --gtest_filter='CudaMiniMaxModel.TinyShapeDummyWeightsBf16'
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out"/minimax-memcheck*.log "$out/minimax-racecheck.log" >>"$summary"
  fi
  [ -x "$bin/bench_cuda_minimax_ops" ] && run_step "minimax op benchmark" minimax-bench.log "$bin/bench_cuda_minimax_ops" 790 &&
    cat "$out/minimax-bench.log" >>"$summary"
  # End to end at configs/minimax-bench (dummy weights; about 30 s to load per variant), SSMSERVE_GPU_BENCH=0 skips.
  [ "${SSMSERVE_GPU_BENCH:-1}" = 1 ] && [ -x "$bin/bench_cuda_minimax_model" ] &&
    run_step "minimax model benchmark" minimax-bench-model.log "$bin/bench_cuda_minimax_model" configs/minimax-bench \
      1024 4096 16384 65536 && cat "$out/minimax-bench-model.log" >>"$summary"
fi
# 3c. A hybrid built from a config alone (issue 27: Mamba-2 + attention + MoE on the one GPU runner) against the CPU
#     decoder, decode graphs == eager, device greedy == argmax; memcheck on it.
if [ -x "$bin/test_cuda_hybrid" ]; then
  run_step "hybrid decoder tests" hybrid.log "$bin/test_cuda_hybrid"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel err|Expected" "$out/hybrid.log" | head -30 >>"$summary"
  if command -v compute-sanitizer >/dev/null; then
    run_step "memcheck (hybrid)" hybrid-memcheck.log compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 \
      "$bin/test_cuda_hybrid" --gtest_filter='CudaHybrid.MatchesCpuDecoderBf16'
    grep -hE "ERROR SUMMARY" "$out/hybrid-memcheck.log" >>"$summary"
  fi
fi
if [ -x "$bin/ssmserve" ] && [ -f models/tiny-mamba/config.json ]; then
  cli() { "$bin/ssmserve" generate --model models/tiny-mamba --prompt "The capital of France is" --max-tokens 24 \
            --ignore-eos --json --device "$1"; }
  { echo "== cpu"; cli cpu; echo "== cuda"; cli cuda; } >"$out/cli.log" 2>&1
  if diff <(sed -n '/^== cpu/,/^== cuda/p' "$out/cli.log" | sed '1d;$d') <(sed -n '/^== cuda/,$p' "$out/cli.log" | sed '1d') >/dev/null; then
    note "cli generate --device cuda == cpu: yes"
  else
    note "cli generate --device cuda == cpu: NO (see cli.log)"
  fi
fi
if [ -x "$bin/bench_cuda_ops" ]; then
  run_step "op benchmarks (prefill per-op profile)" ops-bench.log "$bin/bench_cuda_ops"
fi
# 4. End-to-end latency on the GPU with dummy bf16 weights at real shapes (SSMSERVE_GPU_BENCH=0 skips it):
#    batch-1 decode (input 32, output 128) and a 2k-token prefill (output 2).
if [ "${SSMSERVE_GPU_BENCH:-1}" = 1 ] && [ -x "$bin/ssmserve" ]; then
  : >"$out/bench.log"
  for m in ${SSMSERVE_GPU_BENCH_MODELS:-mamba-2.8b mamba2-2.7b}; do
    [ -f "configs/$m/config.json" ] || continue
    for shape in "1 32 128" "1 2048 2"; do
      set -- $shape
      echo "== $m batch $1 input $2 output $3" >>"$out/bench.log"
      t0=$SECONDS
      timeout "${SSMSERVE_STEP_TIMEOUT:-300}" "$bin/ssmserve" bench latency --model "configs/$m" --load-format dummy \
        --device cuda --batch-size "$1" --input-len "$2" --output-len "$3" --num-iters 3 --num-iters-warmup 1 \
        >>"$out/bench.log" 2>&1
      note "$(printf 'bench %-12s b=%s in=%-5s out=%-4s rc=%-3s %4ss' "$m" "$1" "$2" "$3" "$?" "$((SECONDS - t0))")"
    done
  done
  grep -vE "^\s*$" "$out/bench.log" | tail -40 >>"$summary"
fi

# 5. Decode path (issue 7): skinny GEMM / fused decode kernels against the CPU, batch invariance on the GPU,
#    memcheck on them, GEMM timings and rooflines (gemm.log), decode tokens/s vs batch size for mamba-2.8b
#    (decode_sweep.json -> decode_vs_batch.png), batch-1 decode for the four shapes, and offline throughput
#    (bench throughput, SSMSERVE_GPU_TPUT_PROMPTS prompts of 512 -> 256 tokens). SSMSERVE_GPU_DECODE=0 skips it;
#    SSMSERVE_GPU_DECODE_MODELS / SSMSERVE_GPU_TPUT_MODELS pick the shapes (empty: none).
if [ "${SSMSERVE_GPU_DECODE:-1}" = 1 ] && [ -x "$bin/test_cuda_skinny_gemm" ]; then
  for t in skinny_gemm decode_ops decode_overlap dataflow_decode batch_invariance; do
    [ -x "$bin/test_cuda_$t" ] && run_step "decode tests ($t)" "decode-$t.log" "$bin/test_cuda_$t"
  done
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|batch invariance" "$out"/decode-*.log | head -30 >>"$summary"
  if command -v compute-sanitizer >/dev/null; then
    san=(env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer --report-api-errors no --error-exitcode 3)
    run_step "memcheck (skinny gemm)" memcheck-skinny.log "${san[@]}" --tool memcheck "$bin/test_cuda_skinny_gemm"
    run_step "memcheck (decode ops)" memcheck-decode.log "${san[@]}" --tool memcheck "$bin/test_cuda_decode_ops"
    [ -x "$bin/test_cuda_dataflow_decode" ] &&
      run_step "memcheck (dataflow decode)" memcheck-dataflow.log "${san[@]}" --tool memcheck "$bin/test_cuda_dataflow_decode"
    run_step "racecheck (skinny gemm)" racecheck-skinny.log "${san[@]}" --tool racecheck "$bin/test_cuda_skinny_gemm" \
      --gtest_filter='CudaSkinnyGemm.MatchesCpuLinear'
    run_step "racecheck (decode ops)" racecheck-decode.log "${san[@]}" --tool racecheck "$bin/test_cuda_decode_ops"
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out"/memcheck-skinny.log "$out"/memcheck-decode.log "$out"/memcheck-dataflow.log \
      "$out"/racecheck-skinny.log "$out"/racecheck-decode.log >>"$summary"
  fi
  run_step "gemm + roofline bench" gemm.log "$bin/test_cuda_decode_bench" --gtest_also_run_disabled_tests \
    --gtest_filter='CudaDecodeBench.*'
  grep -E "^roofline" "$out/gemm.log" | tee -a "$summary"
  bw=$(awk '/^roofline copy_bandwidth_TBps/{print $3}' "$out/gemm.log"); bw=${bw:-4.3}
  rate=$(awk '/^roofline bf16_gemm_TFLOPs/{print $3}' "$out/gemm.log"); rate=${rate:-790}
  if [ -x "$bin/ssmserve" ]; then
    lat=("$bin/ssmserve" bench latency --load-format dummy --device cuda --input-len 32
         --output-len "${SSMSERVE_GPU_DECODE_LEN:-128}" --num-iters 3 --num-iters-warmup 1)
    : >"$out/decode.bench.log"
    if [ -n "${SSMSERVE_GPU_SWEEP_MODEL-mamba-2.8b}" ]; then
      m=${SSMSERVE_GPU_SWEEP_MODEL-mamba-2.8b}
      run_step "decode sweep $m" decode_sweep.log "${lat[@]}" --model "configs/$m" --output-json "$out/decode_sweep.json" \
        --batch-size 1 2 4 8 16 32 64 128 256
      grep -E "^(batch|decode)" "$out/decode_sweep.log" | paste - - | tee -a "$summary"
    fi
    for m in ${SSMSERVE_GPU_DECODE_MODELS-mamba-130m mamba-1.4b mamba-2.8b mamba2-2.7b}; do
      run_step "decode b1 $m" "decode_b1_$m.log" "${lat[@]}" --model "configs/$m" --output-json "$out/decode_b1_$m.json"
      grep -E "^decode" "$out/decode_b1_$m.log" | sed "s/^/$m /" | tee -a "$summary"
    done
    for m in ${SSMSERVE_GPU_TPUT_MODELS-mamba-130m mamba-1.4b mamba-2.8b mamba2-2.7b}; do
      run_step "throughput $m" "tput_$m.log" "$bin/ssmserve" bench throughput --model "configs/$m" --load-format dummy \
        --device cuda --num-prompts "${SSMSERVE_GPU_TPUT_PROMPTS:-1000}" --input-len 512 --output-len 256 \
        --max-num-seqs 256 --max-num-batched-tokens "${SSMSERVE_GPU_TPUT_BUDGET:-8192}" --output-json "$out/tput_$m.json"
      grep -iE "tokens/s|requests/s" "$out/tput_$m.log" | sed "s/^/$m /" | tee -a "$summary"
    done
    if [ -f "$out/decode_sweep.json" ] && python3 -c "import matplotlib" 2>/dev/null; then
      python3 bench/plot_decode_vs_batch.py "$out/decode_vs_batch.png" --params 2.768e9 --bandwidth "$bw" \
        --gemm-tflops "$rate" --series "ssmserve mamba-2.8b (dummy bf16)=$out/decode_sweep.json" \
        --title "mamba-2.8b decode on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" >>"$out/decode.bench.log" 2>&1 &&
        note "plot: decode_vs_batch.png"
    fi
  fi
fi

# 6. Prefill at scale against the compute roofline (issue 7 target: 8k-token prefill >= 40% of the measured bf16
#    GEMM rate): the GEMM / copy-bandwidth probe, bench latency with 1 x 8192 and 16 x 2048 prompt tokens (output 2)
#    per model shape, the transformers eager peer on the same GPU, and the table (bench/prefill_report.py).
#    SSMSERVE_GPU_PREFILL=0 skips it; SSMSERVE_GPU_PREFILL_MODELS / SSMSERVE_GPU_PEER=0 narrow it.
if [ "${SSMSERVE_GPU_PREFILL:-1}" = 1 ] && [ -x "$bin/ssmserve" ]; then
  [ -x "$bin/bench_cuda_gemm" ] && run_step "gemm roofline probe (prefill)" gemm-prefill.log "$bin/bench_cuda_gemm"
  models=${SSMSERVE_GPU_PREFILL_MODELS:-mamba-130m mamba-1.4b mamba-2.8b mamba2-2.7b}
  : >"$out/prefill.log"
  for m in $models; do
    [ -f "configs/$m/config.json" ] || continue
    for shape in "1 8192" "16 2048"; do
      set -- $shape
      echo "== $m batch $1 input $2" >>"$out/prefill.log"
      t0=$SECONDS
      timeout "${SSMSERVE_STEP_TIMEOUT:-300}" "$bin/ssmserve" bench latency --model "configs/$m" --load-format dummy \
        --device cuda --batch-size "$1" --input-len "$2" --output-len 2 --num-iters 3 --num-iters-warmup 1 \
        --output-json "$out/prefill-$m-${1}x$2.json" >>"$out/prefill.log" 2>&1
      note "$(printf 'prefill %-12s %2s x %-5s rc=%-3s %4ss' "$m" "$1" "$2" "$?" "$((SECONDS - t0))")"
    done
  done
  if [ "${SSMSERVE_GPU_PEER:-1}" = 1 ] && python3 -c "import torch, transformers" 2>/dev/null; then
    peer_cfgs=""
    for m in ${SSMSERVE_GPU_PEER_MODELS:-$models}; do peer_cfgs="$peer_cfgs configs/$m"; done
    # Eager transformers runs Mamba-1's scan one token at a time: 1 x 2048 stands in for 1 x 8192 (the table says
    # so); throughput is a batched forward loop over SSMSERVE_GPU_PEER_TPUT_PROMPTS prompts (512 -> 256).
    run_step "transformers peer (gpu)" peer.log python3 bench/peer_transformers_gpu.py $peer_cfgs \
      --prefill ${SSMSERVE_GPU_PEER_PREFILL:-1x2048 16x2048} --decode-len 16 \
      --throughput "${SSMSERVE_GPU_PEER_TPUT_PROMPTS:-64}" --tput-batch 64 \
      --time-limit "${SSMSERVE_GPU_PEER_TIME_LIMIT:-60}"
  fi
  python3 bench/prefill_report.py "$out" configs >"$out/prefill-table.md" 2>&1
  cat "$out/prefill-table.md" >>"$summary"
fi

echo "---- summary ($out/summary.txt)"
cat "$summary"
exit $status
