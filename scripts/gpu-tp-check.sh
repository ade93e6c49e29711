#!/usr/bin/env bash
# GPU tensor-parallel check (issue 9) on a machine with 2+ GPUs, in one command: the NCCL TP = 2 runners against
# TP = 1 (test_cuda_tp_collectives: collectives; test_cuda_tp: logits of ragged prefill + decode steps, greedy
# generation; test_cuda_tp_spec: speculative verify rows and decoding), the collectives'
# microseconds per call (ours: one-shot peer-to-peer and NCCL; torch.distributed as the peer), then `bench latency` (batch 1, 16,
# 64; 2048-token prompts, 128 decode steps: prefill and decode tok/s) for mamba-2.8b and codestral-mamba-7b at TP 1 and 2.
# Usage: scripts/gpu-tp-check.sh OUTDIR   (SSMSERVE_PREBUILT=DIR as in gpu-check.sh; SSMSERVE_TP_BENCH_MODELS,
# SSMSERVE_TP_SIZES, SSMSERVE_TP_BATCHES override the models / sizes / batches). NVLink multicast stays off (KINDS.md: mandatory on shared hosts).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:?usage: scripts/gpu-tp-check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export SSMSERVE_SOURCE_DIR="$PWD"  # prebuilt test binaries find this checkout's models and configs
summary="$out/tp-summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
if [ -z "${SSMSERVE_NCCL_LIB:-}" ]; then  # libnccl from the pip wheel beside PyTorch, if the loader has none
  lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))" 2>/dev/null)
  [ -n "$lib" ] && [ -e "$lib" ] && export SSMSERVE_NCCL_LIB="$lib"
fi
note "nccl: ${SSMSERVE_NCCL_LIB:-loader path}"
if [ -n "${SSMSERVE_PREBUILT:-}" ]; then
  bin=$(cd "$SSMSERVE_PREBUILT" && pwd)
  [ -d "$bin/lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$bin/lib"
else
  bin=$(cd "${SSMSERVE_GPU_BUILD:-build-gpu}" && pwd)
fi
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; nvidia-smi topo -m; } >"$out/tp-topo.log" 2>&1
head -3 "$out/tp-topo.log" | sed 's/^/gpu: /' | tee -a "$summary"
step() {  # name, log, timeout, command...
  local name=$1 log=$2 lim=$3
  shift 3
  local t0=$SECONDS
  timeout "$lim" "$@" >>"$out/$log" 2>&1
  local rc=$?
  note "$(printf '%-36s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")"
}
step "test_cuda_tp_collectives" tp-test.log 300 "$bin/test_cuda_tp_collectives"
step "test_cuda_tp" tp-test.log 300 "$bin/test_cuda_tp"
step "test_cuda_tp_spec" tp-test.log 300 "$bin/test_cuda_tp_spec"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel err|max greedy|tp spec|Expected|error" "$out/tp-test.log" | head -80 >>"$summary"
# Collective microbenchmark: the one-shot peer-to-peer kernels vs NCCL (ours), and torch.distributed's NCCL (peer).
step "collective times" tp-collectives.log 120 "$bin/test_cuda_tp_collectives" --gtest_also_run_disabled_tests \
  --gtest_filter='*DISABLED_CollectiveTimes'
step "collective times (torch peer)" tp-collectives.log 120 python3 tools/tp_collective_peer.py
grep -E " floats: " "$out/tp-collectives.log" >>"$summary"
for m in ${SSMSERVE_TP_BENCH_MODELS:-mamba-2.8b codestral-mamba-7b}; do
  for bs in ${SSMSERVE_TP_BATCHES:-1 16 64}; do
    for tp in ${SSMSERVE_TP_SIZES:-1 2}; do
      echo "== $m tp $tp batch $bs" >>"$out/tp-bench.log"
      step "bench $m tp=$tp batch=$bs" tp-bench.log 150 "$bin/ssmserve" bench latency --model "configs/$m" \
        --load-format dummy --device cuda --tensor-parallel-size "$tp" --batch-size "$bs" --input-len 2048 \
        --output-len 128 --num-iters 3 --num-iters-warmup 1
    done
  done
done
grep -E "^== |prefill:|decode:|rror" "$out/tp-bench.log" >>"$summary"
echo "---- $summary"
cat "$summary"
