#!/usr/bin/env bash
# The pip package on the GPU machine (issue 33), in one command:
#   1. installs ssmserve into PYTHON's environment: `pip install --no-build-isolation --no-deps .` from this
#      checkout (the build backend, scikit-build-core + pybind11, and the C++ dependencies already there), or the
#      wheel of --wheel DIR (`pip wheel .` made elsewhere; --libs DIR holds shared libraries the machine lacks);
#   2. checks ssmserve.has_cuda, and that LLM(model, device="cuda") gives the greedy tokens of the `ssmserve generate
#      --device cuda` command of that install on models/tiny-mamba (and tests/e2e/test_python_cuda.py: == the CPU);
#   3. starts `ssmserve serve --device cuda` from the install and asks it with the `openai` client (completion and
#      chat; the completion's text == LLM.generate's).
# --extra-wheels DIR: wheels to install first (e.g. openai and its dependencies, on a machine without a registry).
# Prints PASS / FAIL lines; exits non-zero on the first failure.
# Usage: scripts/gpu-python-check.sh [--wheel DIR] [--libs DIR] [--extra-wheels DIR] [--python PYTHON]
set -euo pipefail
wheel_dir="" libs="" extra="" py=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel_dir=$(cd "$2" && pwd); shift 2 ;;
    --libs) libs=$(cd "$2" && pwd); shift 2 ;;
    --extra-wheels) extra=$(cd "$2" && pwd); shift 2 ;;
    --python) py=$2; shift 2 ;;
    *) echo "usage: scripts/gpu-python-check.sh [--wheel DIR] [--libs DIR] [--extra-wheels DIR] [--python PYTHON]" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
root=$PWD
model=$root/models/tiny-mamba
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && break
done
[ -n "$libs" ] && export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1

# Installs into PYTHON's own environment (the GPU machine is bare and given back after the run).
vpy=$(command -v "$py")
bin=$("$vpy" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')  # where pip puts console commands
pip=("$vpy" -m pip install -q --disable-pip-version-check --no-index --no-deps --force-reinstall)
[ -n "$extra" ] && "${pip[@]}" "$extra"/*.whl
start=$(date +%s)
if [ -n "$wheel_dir" ]; then
  "${pip[@]}" "$wheel_dir"/ssmserve-*.whl
  echo "installed the wheel $(basename "$wheel_dir"/ssmserve-*.whl) in $(( $(date +%s) - start )) s"
else
  "$vpy" -c 'import scikit_build_core, pybind11' || { echo "FAIL: scikit-build-core / pybind11 missing for pip install ." ; exit 1; }
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "${pip[@]}" --no-build-isolation -C build-dir=/tmp/ssmserve-pip-build . 2>&1 |
    grep -E "ssmserve Python package|error" || true
  "$vpy" -c 'import ssmserve' || { echo "FAIL: pip install . did not give an importable package"; exit 1; }
  echo "pip install . took $(( $(date +%s) - start )) s"
fi
cd /tmp  # import the installed package, not the checkout's python/ folder

"$vpy" - "$model" "$bin/ssmserve" <<'PY'
import json, subprocess, sys
import ssmserve
model, cli = sys.argv[1], sys.argv[2]
print("ssmserve", ssmserve.__file__, "has_cuda", ssmserve.has_cuda, "python", sys.version.split()[0])
if not ssmserve.has_cuda:
    sys.exit("FAIL: ssmserve.has_cuda is False after pip install (nvcc not found at build time?)")
print("PASS: ssmserve.has_cuda")
prompts = ["And the LORD said unto Moses,", "It is a truth universally acknowledged", "Call me Ishmael.", "a"]
llm = ssmserve.LLM(model, device="cuda", max_num_seqs=8)
outs = llm.generate(prompts, ssmserve.SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
lines = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
res = subprocess.run([cli, "generate", "--model", model, "--device", "cuda", "--prompts-file", "-", "--json",
                      "--max-tokens", "32"], input=lines, capture_output=True, text=True)
if res.returncode != 0:
    sys.exit("FAIL: ssmserve generate --device cuda: " + res.stderr[-2000:])
ref = [json.loads(l) for l in res.stdout.splitlines()]
for o, r in zip(outs, ref):
    if o.outputs[0].token_ids != r["token_ids"]:
        sys.exit(f"FAIL: LLM(device='cuda') tokens {o.outputs[0].token_ids} != CLI {r['token_ids']} for {o.prompt!r}")
print(f"PASS: LLM(device='cuda') greedy tokens == `ssmserve generate --device cuda` ({len(prompts)} prompts x 32 tokens)")
json.dump({"completion": outs[0].outputs[0].text}, open("/tmp/ssmserve-expected.json", "w"))
PY
"$vpy" -m pytest -q -p no:cacheprovider "$root/tests/e2e/test_python_cuda.py" -rs 2>&1 | tail -3

log=/tmp/ssmserve-serve.log
"$bin/ssmserve" serve --model "$model" --served-model-name tiny-mamba --device cuda --port 0 > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
"$vpy" - "$log" <<'PY'
import json, re, sys, time
import openai
log = sys.argv[1]
port = None
for _ in range(600):
    m = re.search(r"on http://[^:]+:(\d+)", open(log).read())
    if m:
        port = int(m.group(1))
        break
    time.sleep(0.1)
if port is None:
    sys.exit("FAIL: ssmserve serve did not start: " + open(log).read()[-2000:])
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
for _ in range(300):
    try:
        client.models.list()
        break
    except openai.APIConnectionError:
        time.sleep(0.1)
want = json.load(open("/tmp/ssmserve-expected.json"))["completion"]
c = client.completions.create(model="tiny-mamba", prompt="And the LORD said unto Moses,", max_tokens=32, temperature=0)
if c.choices[0].text != want:
    sys.exit(f"FAIL: serve's completion {c.choices[0].text!r} != LLM.generate's {want!r}")
chat = client.chat.completions.create(model="tiny-mamba", messages=[{"role": "user", "content": "Hello"}],
                                      max_tokens=8, temperature=0)
assert chat.choices[0].message.content is not None
print(f"PASS: `ssmserve serve --device cuda` from the pip install answers the openai client {openai.__version__} "
      f"(completion == LLM.generate; chat: {chat.choices[0].message.content!r})")
PY
echo "PASS: all"
