# Fixtures for the end-to-end server tests: start `ssmserve serve` on a free port with the bundled model, wait until
# /health answers, and stop it (SIGTERM) afterwards. SSMSERVE_BINARY overrides the binary (default build/ssmserve).
import os
import re
import signal
import subprocess
import time
from pathlib import Path

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("SSMSERVE_BINARY", ROOT / "build" / "ssmserve"))
MODEL = ROOT / "models" / "tiny-mamba"
MODEL_NAME = "tiny-mamba"


class Server:
    """A running `ssmserve serve` process."""

    def __init__(self, *extra_args, threads=2, env=None, model=MODEL, model_name=MODEL_NAME, positional=False):
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ssmserve-e2e-{os.getpid()}-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "w+")
        model_args = [str(model)] if positional else ["--model", str(model)]  # `serve MODEL` (vLLM's form) or --model
        cmd = [str(BINARY), "serve", *model_args, "--served-model-name", model_name, "--port", "0",
               "--threads", str(threads), *map(str, extra_args)]
        env = dict(os.environ, OMP_WAIT_POLICY="passive", **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.port = self._wait_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not become healthy: " + self.output())

    def _wait_port(self):
        deadline = time.time() + 60
        while time.time() < deadline:
            m = re.search(r"on http://[^:]+:(\d+)", self.output())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.output())
            time.sleep(0.05)
        raise RuntimeError("server did not start: " + self.output())

    def output(self):
        self.log.flush()
        return self.log_path.read_text()

    def metrics(self):
        """The Prometheus gauges/counters as {name: value} (labels dropped; histogram buckets skipped)."""
        text = httpx.get(self.base_url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or "_bucket" in line:
                continue
            name, value = line.rsplit(" ", 1)
            key = name.split("{")[0]
            if "finished_reason=" in name:
                key += ":" + name.split('finished_reason="')[1].split('"')[0]
            out[key] = float(value)
        return out

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        self.log_path.unlink(missing_ok=True)
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    if not BINARY.exists():
        pytest.fail(f"{BINARY} not found: build first (cmake --build build)")
    s = Server("--max-num-seqs", 128)
    yield s
    rc = s.stop()
    assert rc == 0, "server did not shut down cleanly"


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def cli_generate(prompts, max_tokens, model=MODEL):
    """Greedy `ssmserve generate --json` outputs for `prompts` (the reference for server outputs)."""
    import json

    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
    out = subprocess.run([str(BINARY), "generate", "--model", str(model), "--prompts-file", "-", "--json",
                          "--max-tokens", str(max_tokens), "--threads", "2"],
                         input=lines, capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    return [json.loads(line) for line in out.stdout.splitlines()]
