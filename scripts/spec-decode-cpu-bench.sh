#!/usr/bin/env bash
# Speculative decoding on the CPU (issue 29): offline throughput with and without the n-gram proposer on the small
# real checkpoints, on a workload that quotes its prompt ("repeat the passage" prompts from LAMBADA), batch 1 and 8,
# median of 3 repeats. Usage: scripts/spec-decode-cpu-bench.sh [BINARY] [SHARED_MODELS_DIR]
# With --replay: the replay-drafter sweep of scripts/spec-decode-gpu-bench.sh on the CPU (decode tokens/s against the
# acceptance rate, dummy weights at tiny shapes): scripts/spec-decode-cpu-bench.sh --replay --bin BINARY --out DIR
# [more spec-decode-gpu-bench.sh options, e.g. --models "mamba-130m" --quick].
set -euo pipefail
if [ "${1:-}" = "--replay" ]; then
  shift
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}  # shared cores: OpenMP threads sleep instead of spinning
  exec "$(dirname "$0")/spec-decode-gpu-bench.sh" --device cpu --threads 2 --batches "1 8" --ks "2 4" --output-len 32 \
    --models "models/tiny-mamba tests/data/tiny-hybrids/tiny-mamba2-dummy tests/data/tiny-hybrids/tiny-minimax-dummy" "$@"
fi
BIN=${1:-build/ssmserve}
SHARED=${2:-../shared/models}
DATA=$(mktemp -d)/quote.jsonl
python3 - "$DATA" <<'PY'
import json, sys
out = open(sys.argv[1], "w")
for i, line in enumerate(open("../shared/data/lambada_test.jsonl")):
    if i >= 16:
        break
    t = json.loads(line)["text"][:600]
    out.write(json.dumps({"prompt": "Repeat the passage.\n\n" + t + "\n\nRepeat: " + t[: len(t) // 3]}) + "\n")
PY
NGRAM='{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":5}'
for model in models/tiny-mamba "$SHARED/tiny-mamba2" "$SHARED/tiny-minimax"; do
  for seqs in 1 8; do
    for spec in "" "$NGRAM"; do
      vals=()
      for rep in 1 2 3; do
        out=$("$BIN" bench throughput --model "$model" --dataset "$DATA" --num-prompts 8 --output-len 64 --max-num-seqs $seqs \
              --threads 2 --no-enable-prefix-caching ${spec:+--speculative-config "$spec"} 2>/dev/null)
        vals+=("$(echo "$out" | sed -n 's/.*total tokens\/s, \([0-9.]*\) output tokens\/s.*/\1/p')")
        acc=$(echo "$out" | sed -n 's/speculative decoding: acceptance rate \([0-9.]*%\).*mean acceptance length \([0-9.]*\).*/\1 \2/p')
      done
      med=$(printf '%s\n' "${vals[@]}" | sort -n | sed -n 2p)
      label=plain
      [ -n "$spec" ] && label="ngram k=4"
      echo "$(basename "$model") max-num-seqs $seqs $label: output tok/s median $med (${vals[*]}) ${spec:+acceptance, mean length: $acc}"
    done
  done
done
