#!/usr/bin/env bash
# cuda-minimax device run: harness, model tests, sanitizers (memcheck, racecheck) on the lightning / attention
# kernels, op benchmarks (and the per-kernel profile) and the model benchmark.
# Usage (from the carried folder, binaries in pkg/): bash bench/gpu_minimax_run.sh OUT [model]
out=$1; model=${2:-}
mkdir -p "$out/r"; r="$out/r"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break; done
export PATH="/usr/local/cuda/bin:$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/pkg/lib" SSMSERVE_MODELS_DIR="$PWD/models"
b=$PWD/pkg
step() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout "$lim" "$@" > "$r/$name.log" 2>&1; echo "$name rc=$? $((SECONDS-t0))s" | tee -a "$r/summary.txt"; }
san() { local name=$1 tool=$2 filter=$3; shift 3; step "$name" 150 env SSMSERVE_CUDA_TEST_QUICK=1 "$@" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 3 "$b/test_cuda_minimax_ops" --gtest_filter="$filter"; }
date -u | tee "$r/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >> "$r/summary.txt"
step ops 150 "$b/test_cuda_minimax_ops"
step model 120 env SSMSERVE_SOURCE_DIR="$PWD" "$b/test_cuda_minimax_model"
san memcheck memcheck 'CudaLightning.*:CudaPagedAttention*'
san racecheck racecheck 'CudaLightning.Bf16*:CudaPagedAttention.*'
step bench-ops 120 "$b/bench_cuda_minimax_ops" 790
step profile 60 env SSMSERVE_KERNEL_PROFILE=1 "$b/bench_cuda_minimax_ops" 790 lightning
if [ -n "$model" ]; then
  step bench-model "${MODEL_LIM:-200}" env SSMSERVE_BENCH_LINEAR_CONTEXTS="${LIN_CTX:-1024 16384 65536}" "$b/bench_cuda_minimax_model" configs/minimax-bench ${CTX:-1024 4096 16384 65536}
fi
for f in ops model memcheck racecheck; do
  echo "== $f" >> "$r/summary.txt"
  grep -hE "^\[  (PASSED|FAILED) |Failure|rel_err|Expected|Which is|ERROR SUMMARY|RACECHECK SUMMARY" "$r/$f.log" | head -20 >> "$r/summary.txt"
done
for f in bench-ops profile bench-model; do
  [ -f "$r/$f.log" ] && { echo "== $f" >> "$r/summary.txt"; grep -vE "^\s*$" "$r/$f.log" | head -80 >> "$r/summary.txt"; }
done
tar czf "$out/results.tgz" -C "$out" r
cp "$r/summary.txt" "$out/summary.txt"
