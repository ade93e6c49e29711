#!/usr/bin/env bash
# Builds ssmserve and runs the whole test suite: the GoogleTest suite (Release build), the server's end-to-end
# pytest suite, and the corrupt-checkpoint
# tests again under AddressSanitizer + UBSan. Installs its own dependencies. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

# End-to-end server tests: `ssmserve serve` driven by the real `openai` client (pytest, tests/e2e/).
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore openai pytest
SSMSERVE_BINARY="$PWD/build/ssmserve" python3 -m pytest -q tests/e2e

# Hostile-input tests under sanitizers: a corrupt checkpoint or config must end in a clear error, never a signal.
# Builds the checkpoint/config/CLI tests, the binary the CLI tests run, and any other test executable that defines
# a suite the -R filter selects (so none of them is left "not built").
asan_filter='Checkpoint|Config|Corrupt'
asan_targets=(test_checkpoint test_model_config test_corrupt_cli ssmserve)
for src in tests/unit/test_*.cpp tests/model/test_*.cpp; do
  [ -f "$src" ] || continue
  t=$(basename "$src" .cpp)
  if grep -Eq "TEST(_F|_P)?\(\s*[A-Za-z0-9_]*($asan_filter)" "$src" && [[ " ${asan_targets[*]} " != *" $t "* ]]; then
    asan_targets+=("$t")
  fi
done
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSSMSERVE_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$jobs" --target "${asan_targets[@]}"
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -R "$asan_filter"
