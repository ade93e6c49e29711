#!/usr/bin/env bash
# Kernel timelines of batch-1 decode graph replays (tools/cupti_trace) on dummy-weight models, on the GPU machine:
# builds the CUPTI injection library there (g++ and CUDA's CUPTI), runs `ssmserve bench latency` once per model with it,
# and writes per model the trace (OUTDIR/trace_<model>.csv.xz) and its summary (OUTDIR/timeline_<model>.txt:
# tools/cupti_trace/analyze.py with a 60-kernel timeline of the last replay). Tracing slows the host side of a step,
# not the GPU's timeline (docs/benchmarks.md, session 49).
# Usage: scripts/gpu-timeline.sh OUTDIR MODEL...   (MODEL: a folder under configs/, e.g. granite-4.0-h-tiny)
#   SSMSERVE_PREBUILT=DIR  executables in DIR (scripts/gpu-package.sh), else build-gpu/;
#   TL_INPUT_LEN=2048  TL_OUTPUT_LEN=64  TL_STEPS=3 (replays kept); other SSMSERVE_* variables pass to the runs.
set -uo pipefail
out=${1:?usage: scripts/gpu-timeline.sh OUTDIR MODEL...}
shift
[ $# -ge 1 ] || { echo "no models given" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
prebuilt=${SSMSERVE_PREBUILT:-}
[ -n "$prebuilt" ] && { prebuilt=$(cd "$prebuilt" && pwd) || exit 2; }
cd "$(dirname "$0")/.."
bin=${prebuilt:-build-gpu}
cuda=${CUDA_HOME:-/usr/local/cuda}
for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib" "$cuda/extras/CUPTI/lib64"; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
[ -d "$bin/lib" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$bin/lib"
[ -x "$bin/ssmserve" ] || { echo "no $bin/ssmserve (build with SSMSERVE_CUDA=ON or set SSMSERVE_PREBUILT)" >&2; exit 2; }
lib=$out/libcupti_trace.so
g++ -O2 -shared -fPIC -I"$cuda/include" -I"$cuda/extras/CUPTI/include" tools/cupti_trace/cupti_trace.cpp \
  -L"$cuda/lib64" -L"$cuda/extras/CUPTI/lib64" -lcupti -o "$lib" || { echo "building the CUPTI library failed" >&2; exit 2; }
export SSMSERVE_SOURCE_DIR="$PWD"
for m in "$@"; do
  csv=$out/trace_$m.csv
  CUDA_INJECTION64_PATH=$lib CUPTI_TRACE_OUT=$csv CUPTI_TRACE_STEPS=${TL_STEPS:-3} "$bin/ssmserve" bench latency \
    --model "configs/$m" --load-format dummy --device cuda --batch-size 1 --input-len "${TL_INPUT_LEN:-2048}" \
    --output-len "${TL_OUTPUT_LEN:-64}" --num-iters 2 --num-iters-warmup 1 >"$out/bench_$m.log" 2>&1 ||
    { echo "$m: bench failed (see $out/bench_$m.log)" >&2; continue; }
  python3 tools/cupti_trace/analyze.py "$csv" --timeline 60 >"$out/timeline_$m.txt" && xz -f -T4 "$csv"
  echo "== $m: $(grep -E '^decode:' "$out/bench_$m.log" | head -1)"
  sed -n '/^per replay/,/^advance total/p' "$out/timeline_$m.txt" | head -25
done
