#!/usr/bin/env bash
# Packs the GPU executables and the non-system shared libraries they need into DIR, for scripts/gpu-check.sh on a
# GPU machine that lacks the build dependencies (SSMSERVE_PREBUILT=DIR). Builds them without -march=native so
# they run on any x86-64 host (the CPU kernels pick their AVX2 / AVX-512 variant at run time). Usage:
# scripts/gpu-package.sh DIR [BUILD_DIR]
# Carrying DIR to the device: a call carries at most 64 MiB with the working tree (~50 MB tracked, 34 of them the
# bundled tiny-mamba weights). `tar -cf - DIR | xz -9` packs every GPU executable in ~31 MB (session 34; the default
# xz level packs them in 68), so either carry only the executables the run needs or move
# models/tiny-mamba/model.safetensors out of the tree for the call (the tests that load it then fail).
set -euo pipefail
dir=${1:?usage: scripts/gpu-package.sh DIR [BUILD_DIR]}
build=${2:-build-gpu-pkg}
cd "$(dirname "$0")/.."
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSSMSERVE_CUDA=ON -DSSMSERVE_NATIVE=OFF >/dev/null
targets=(test_cuda_ops test_cuda_scan_ops)
all=$(ninja -C "$build" -t targets all)
for t in test_cuda_model test_cuda_tp test_cuda_tp_collectives test_cuda_tp_spec test_cuda_skinny_gemm test_cuda_decode_ops test_cuda_decode_overlap test_cuda_dataflow_decode test_cuda_batch_invariance test_cuda_decode_bench test_cuda_sampling bench_cuda_ops bench_cuda_gemm ssmserve test_cuda_minimax_ops test_cuda_paged_attention bench_cuda_minimax_ops bench_cuda_minimax_model test_cuda_minimax_model test_cuda_hybrid test_cuda_hybrid_models test_cuda_skinny_fused test_cuda_moe_router test_cuda_gated_delta_decode_prep; do
  if grep -q "^$t:" <<<"$all"; then targets+=("$t"); fi
done
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
