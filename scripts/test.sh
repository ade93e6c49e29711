#!/usr/bin/env bash
# Builds ssmserve and runs the whole test suite: the GoogleTest suite (Release build), the server's end-to-end
# pytest suite, and the corrupt-checkpoint
# tests again under AddressSanitizer + UBSan. Installs its own dependencies. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
jobs=$(nproc)
phase() { echo "== scripts/test.sh: $1 at $SECONDS s"; }

# Compiler cache: the pip build below compiles the same engine sources as the main build (Release, -fPIC, Ninja, a
# build folder one level down: identical commands once ccache makes paths relative to the checkout), so it takes them
# from the cache instead of compiling them twice. A caller's own ccache settings win.
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
  # One compiler name for both builds: ccache hashes it, and pip's CMake picked g++ where the main build's picked c++.
  if [ -z "${CXX:-}" ] && command -v g++ >/dev/null; then export CXX=$(command -v g++); fi
  if [ -z "${CC:-}" ] && command -v gcc >/dev/null; then export CC=$(command -v gcc); fi
  for lang in C CXX CUDA; do
    var=CMAKE_${lang}_COMPILER_LAUNCHER
    [ -n "${!var:-}" ] || export "$var=ccache"
  done
fi
# Ninja for fresh build folders (an existing folder keeps the generator it was configured with).
[ -f build/CMakeCache.txt ] || [ -n "${CMAKE_GENERATOR:-}" ] || ! command -v ninja >/dev/null || export CMAKE_GENERATOR=Ninja

phase build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null
cmake --build build -j"$jobs"
phase ctest
ctest --test-dir build --output-on-failure -j"$jobs"

# End-to-end tests (pytest, tests/e2e/): `ssmserve serve` driven by the real `openai` client, `bench serve`, and the
# Python package, built by `pip install .` (engine libraries, module and the `ssmserve` command, Release), here without
# the CUDA backend (the build above already compiled it; this keeps the suite's time down on machines with nvcc).
phase "pip install ."
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore openai anthropic pytest
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
  -C cmake.define.SSMSERVE_CUDA=OFF -C build-dir=build-pip .
phase pytest
SSMSERVE_BINARY="$PWD/build/ssmserve" python3 -m pytest -q tests/e2e

# Request-parser fuzzing for a bounded time: libFuzzer with clang, else a mutation driver; both under ASan + UBSan.
phase fuzz
fuzz_cxx=$(command -v clang++ || command -v c++)
cmake -S tests/fuzz -B build-fuzz -DCMAKE_CXX_COMPILER="$fuzz_cxx" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-fuzz -j"$jobs"
rm -rf build-fuzz/corpus && cp -r tests/fuzz/corpus build-fuzz/corpus  # libFuzzer adds to the corpus it is given
./build-fuzz/fuzz_request -max_total_time="${SSMSERVE_FUZZ_SECONDS:-30}" -max_len=4096 -timeout=10 -print_final_stats=1 build-fuzz/corpus 2>&1 | tail -3

# Hostile-input tests under sanitizers: a corrupt checkpoint or config, or a hostile (deeply nested) chat template,
# must end in a clear error, never a signal.
# Builds the checkpoint/config/CLI tests, the binary the CLI tests run, and any other test executable that defines
# a suite the -R filter selects (so none of them is left "not built").
asan_filter='Checkpoint|Config|Corrupt|ServerJinja'
asan_targets=(test_checkpoint test_model_config test_corrupt_cli ssmserve)
for src in tests/unit/test_*.cpp tests/model/test_*.cpp; do
  [ -f "$src" ] || continue
  t=$(basename "$src" .cpp)
  if grep -Eq "TEST(_F|_P)?\(\s*[A-Za-z0-9_]*($asan_filter)" "$src" && [[ " ${asan_targets[*]} " != *" $t "* ]]; then
    asan_targets+=("$t")
  fi
done
phase "sanitizer build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSSMSERVE_SANITIZE=address,undefined -DSSMSERVE_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target "${asan_targets[@]}"
phase "sanitizer tests"
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -R "$asan_filter"
phase done
