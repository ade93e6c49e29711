#!/usr/bin/env bash
# Builds ssmserve and runs the whole test suite: the GoogleTest suite (Release build) and the corrupt-checkpoint
# tests again under AddressSanitizer + UBSan. Installs its own dependencies. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

# Hostile-input tests under sanitizers: a corrupt checkpoint or config must end in a clear error, never a signal.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSSMSERVE_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$jobs" --target test_checkpoint ssmserve
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-asan --output-on-failure -R 'Checkpoint|Config|Corrupt'
