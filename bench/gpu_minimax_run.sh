#!/usr/bin/env bash
# cuda-minimax device run: harness, model tests, sanitizers (bf16 / tensor-core paths), op + model benchmarks, peer.
# Usage (from .gpu-minimax): bash run.sh OUT [peer]
out=$1; peer=${2:-}
mkdir -p "$out/r"; r="$out/r"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break; done
export PATH="/usr/local/cuda/bin:$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/pkg/lib"
b=$PWD/pkg
step() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout "$lim" "$@" > "$r/$name.log" 2>&1; echo "$name rc=$? $((SECONDS-t0))s" | tee -a "$r/summary.txt"; }
date -u | tee "$r/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >> "$r/summary.txt"
step ops 150 "$b/test_cuda_minimax_ops"
step model 120 env SSMSERVE_SOURCE_DIR="$PWD" "$b/test_cuda_minimax_model"
step memcheck 90 env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 3 "$b/test_cuda_minimax_ops" --gtest_filter='CudaLightning.*:CudaPagedAttention*'
[ -n "${NORACE:-}" ] || step racecheck 90 env SSMSERVE_CUDA_TEST_QUICK=1 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 3 "$b/test_cuda_minimax_ops" --gtest_filter='CudaLightning.Bf16*:CudaPagedAttention.*'
step bench-ops 90 "$b/bench_cuda_minimax_ops" 790
step bench-model 240 env SSMSERVE_BENCH_LINEAR_CONTEXTS="${LIN_CTX:-1024 16384 65536}" "$b/bench_cuda_minimax_model" configs/minimax-bench ${CTX:-1024 4096 16384 32768 65536}
if [ -n "$peer" ]; then
  step peer 200 python3 bench/peer_transformers_minimax_gpu.py configs/minimax-bench --contexts 1024,4096,16384,32768,65536 --decode-steps 8
fi
grep -hE "^\[  (PASSED|FAILED) |Failure|rel_err|Expected|Which is|ERROR SUMMARY|RACECHECK SUMMARY" "$r"/ops.log "$r"/model.log "$r"/memcheck.log "$r"/racecheck.log | head -60 >> "$r/summary.txt"
cat "$r/bench-ops.log" "$r/bench-model.log" >> "$r/summary.txt" 2>/dev/null
[ -f "$r/peer.log" ] && cat "$r/peer.log" >> "$r/summary.txt"
tar czf "$out/results.tgz" -C "$out" r
cp "$r/summary.txt" "$out/summary.txt"
