#!/usr/bin/env bash
# Packs the GPU executables and the non-system shared libraries they need into DIR, for scripts/gpu-check.sh on a
# GPU machine that lacks the build dependencies (SSMSERVE_PREBUILT=DIR). Builds them without -march=native so
# they run on any x86-64 host (the CPU kernels pick their AVX2 / AVX-512 variant at run time), and with the
# component libraries shared (SSMSERVE_SHARED_LIBS=ON: the kernels live once, in DIR/lib/libssm_cuda.so, not in each
# of the ~110 executables). Usage: scripts/gpu-package.sh DIR [BUILD_DIR]
#   TARGETS="a b ..."  package only these targets (default: ssmserve and every test_cuda_* / bench_cuda_* target)
# Carrying DIR to the device: a call carries at most 64 MiB with the working tree (~50 MB tracked). Pack DIR with
# `tar -cf - DIR | xz -9 -T2 > build-carry/pkg.tar.xz` (build-carry/ is ignored; name it in carry) and unpack it there.
# (Statically linked, as before session 35, every GPU executable took 459 MB, 31 MB with xz -9: too much beside the
# tree.)
set -euo pipefail
dir=${1:?usage: scripts/gpu-package.sh DIR [BUILD_DIR]}
build=${2:-build-gpu-pkg}
cd "$(dirname "$0")/.."
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSMSERVE_CUDA=ON -DSSMSERVE_NATIVE=OFF \
  -DSSMSERVE_SHARED_LIBS=ON >/dev/null
if [ -n "${TARGETS:-}" ]; then
  read -r -a targets <<<"$TARGETS"
else
  mapfile -t targets < <(ninja -C "$build" -t targets all | sed -n 's/^\(ssmserve\|test_cuda_[a-z0-9_]*\|bench_cuda_[a-z0-9_]*\): .*/\1/p' | sort -u)
fi
cmake --build "$build" -j2 --target "${targets[@]}"
mkdir -p "$dir/lib"
for t in "${targets[@]}"; do
  cp "$build/$t" "$dir/"
  # Everything but glibc, libstdc++/libgcc and CUDA's own libraries (present on the GPU machine).
  ldd "$build/$t" | awk '/=> \//{print $3}' |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcublas|libcublasLt|libcudart)\.so' |
    xargs -r -I{} cp -L {} "$dir/lib/"
done
ls -la "$dir" "$dir/lib"
