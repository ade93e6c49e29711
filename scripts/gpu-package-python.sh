#!/usr/bin/env bash
# Builds the Python module with the CUDA backend (SSMSERVE_PYTHON_CUDA=ON, without -march=native) for the GPU
# machine's Python and packs it into DIR/python/ssmserve with the non-system shared libraries it needs in DIR/lib,
# for scripts/gpu-python-check.sh there. PYTHON: an interpreter of the GPU machine's minor version (the H200 machine
# has Python 3.12), with pybind11 (pip install pybind11). Usage: scripts/gpu-package-python.sh DIR [PYTHON] [BUILD_DIR]
set -euo pipefail
dir=${1:?usage: scripts/gpu-package-python.sh DIR [PYTHON] [BUILD_DIR]}
py=${2:-python3}
build=${3:-build-gpu-py}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
cd "$(dirname "$0")/.."
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSMSERVE_CUDA=ON -DSSMSERVE_NATIVE=OFF \
  -DSSMSERVE_PYTHON=ON -DSSMSERVE_PYTHON_CUDA=ON -DPython_EXECUTABLE="$(command -v "$py")" \
  -Dpybind11_DIR="$("$py" -c 'import pybind11; print(pybind11.get_cmake_dir())')" >/dev/null
cmake --build "$build" -j2 --target _ssmserve
mkdir -p "$dir/python/ssmserve" "$dir/lib"
cp python/ssmserve/*.py "$dir/python/ssmserve/"
so=$(ls "$build"/python/_ssmserve*.so)
cp "$so" "$dir/python/ssmserve/"
# Everything but glibc, libstdc++/libgcc and CUDA's own libraries (present on the GPU machine).
ldd "$so" | awk '/=> \//{print $3}' |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcublas|libcublasLt|libcudart)\.so' |
  xargs -r -I{} cp -L {} "$dir/lib/"
ls -la "$dir/python/ssmserve" "$dir/lib"
