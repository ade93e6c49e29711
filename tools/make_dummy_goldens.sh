#!/usr/bin/env bash
# Goldens for the architectures without a small trained checkpoint: for each tests/data/tiny-hybrids/<name>/config.json,
# writes ssmserve's dummy weights (--load-format dummy) as a checkpoint (tools/save_dummy_checkpoint.cpp) with the
# tiny-mamba tokenizer, then runs tools/make_goldens.py on it with transformers. The tests load the same weights with
# --load-format dummy (tests/model/test_golden.cpp). A config with a quantization_config (tiny-qwen3_next-fp8) is written
# as an FP8 checkpoint, which transformers dequantizes (it needs `accelerate`, and `compressed-tensors` for that format;
# torch 2.11 CPU + transformers 5.17 in a venv on this machine make them too); the test writes the same file again.
# Usage: tools/make_dummy_goldens.sh BUILD_DIR [PYTHON] [NAME...]   (BUILD_DIR holds save_dummy_checkpoint)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "$1" && pwd)"; py="${2:-python3}"; shift $(( $# >= 2 ? 2 : 1 ))
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for d in "$root"/tests/data/tiny-hybrids/*/; do names+=("$(basename "$d")"); done
fi
for name in "${names[@]}"; do
  out="$build/dummy-ckpt/$name"
  mkdir -p "$out"
  cp "$root/tests/data/tiny-hybrids/$name/config.json" "$out/"
  cp "$root"/models/tiny-mamba/{tokenizer.json,tokenizer_config.json} "$out/"
  "$build/save_dummy_checkpoint" "$out" "$out/model.safetensors"
  "$py" "$root/tools/make_goldens.py" "$out" "$root/tests/data/goldens/$name.json"
done
