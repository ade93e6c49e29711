#!/usr/bin/env bash
# Runs the Python API on the GPU (tests/e2e/test_python_cuda.py: device="cuda" == device="cpu" greedy, batched,
# streamed, seeded) with the module that scripts/gpu-package-python.sh packed into DIR. Usage:
# scripts/gpu-python-check.sh DIR [PYTHON]
set -euo pipefail
dir=${1:?usage: scripts/gpu-python-check.sh DIR [PYTHON]}
py=${2:-python3}
dir=$(cd "$dir" && pwd)
cd "$(dirname "$0")/.."
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && break
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir/lib" PYTHONPATH="$dir/python${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'import ssmserve, sys; print("ssmserve from", ssmserve.__file__, "has_cuda", ssmserve.has_cuda, sys.version.split()[0])'
if "$py" -c 'import pytest' 2>/dev/null; then
  "$py" -m pytest -q -p no:cacheprovider tests/e2e/test_python_cuda.py -rs
else
  "$py" tests/e2e/test_python_cuda.py
fi
