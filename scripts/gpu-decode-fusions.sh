#!/usr/bin/env bash
# The decode fusions written in session 32 without a GPU (docs/architecture.md §5, "Decode fusions"; all off by
# default), checked and measured in one GPU run: their op tests and the model tests that compare each fusion on
# against off, then batch-1 decode A/B (every fusion off, every fusion on, and each one alone) on the hybrids' real
# shapes with scripts/gpu-decode-ab.sh. Results under OUTDIR: one log per test, OUTDIR/ab-<config>/ (ab.tsv and
# the medians). Turn a fusion's default on only after its tests pass and its A/B wins.
# Usage: scripts/gpu-decode-fusions.sh OUTDIR [CONFIG...]
#   SSMSERVE_PREBUILT=DIR  executables in DIR (scripts/gpu-package.sh DIR packs them), else build-gpu/;
#   configs default: falcon-h1-7b nemotron-nano-9b-v2 granite-4.0-h-tiny nemotron-3-nano-30b-a3b qwen3.5-9b
#   qwen3.5-35b-a3b; AB_REPEATS (default 2), AB_ONE_BY_ONE=0 skips the single-fusion variants.
set -uo pipefail
out=${1:?usage: scripts/gpu-decode-fusions.sh OUTDIR [CONFIG...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
prebuilt=${SSMSERVE_PREBUILT:-}
[ -n "$prebuilt" ] && { prebuilt=$(cd "$prebuilt" && pwd) || exit 2; }
cd "$(dirname "$0")/.."
export SSMSERVE_SOURCE_DIR="$PWD"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
bin=${prebuilt:-build-gpu}
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$bin/lib"
fail=0
run_test() {  # name, then the command; a missing executable is reported, not fatal
  local name=$1
  shift
  if [ ! -x "$1" ]; then echo "== $name: $1 missing"; return; fi
  timeout 600 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/$name.log" | head -20
  [ $rc -eq 0 ] || fail=1
}
run_test skinny_fused "$bin/test_cuda_skinny_fused"
run_test moe_router "$bin/test_cuda_moe_router"
run_test gdn_decode_prep "$bin/test_cuda_gated_delta_decode_prep"
run_test decode_ops env SSMSERVE_CUDA_TEST_QUICK=1 "$bin/test_cuda_decode_ops"
run_test hybrid_fused "$bin/test_cuda_hybrid_models" --gtest_filter='*Fused*:*ParallelMixerBranch*:*MoeShared*'
ALL="SSMSERVE_FUSE_MLP_ACT=1 SSMSERVE_FUSE_GATED_NORM=1 SSMSERVE_FUSE_CONV_EPILOGUE=1 SSMSERVE_FUSE_F32_INPUT=1"
ALL="$ALL SSMSERVE_FUSE_ROUTER_ROUTE=1 SSMSERVE_FUSE_PAIR_RESIDUAL=1 SSMSERVE_FUSE_GDN_PREPARE=1"
# Batch invariance with every fusion on (the engine reads the switches from the environment).
run_test batch_invariance_fused env $ALL SSMSERVE_CUDA_TEST_QUICK=1 "$bin/test_cuda_batch_invariance"
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(falcon-h1-7b nemotron-nano-9b-v2 granite-4.0-h-tiny nemotron-3-nano-30b-a3b qwen3.5-9b qwen3.5-35b-a3b)
for c in "${configs[@]}"; do
  variants=(- "$ALL")
  if [ "${AB_ONE_BY_ONE:-1}" != 0 ]; then
    for v in $ALL; do variants+=("$v"); done
  fi
  echo "== decode A/B: $c"
  AB_MODEL=configs/$c AB_ROOFLINE=0 SSMSERVE_PREBUILT=$bin scripts/gpu-decode-ab.sh "$out/ab-$c" "${variants[@]}"
done
exit $fail
