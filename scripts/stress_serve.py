#!/usr/bin/env python3
"""Hostile-load stress test of `ssmserve serve` (issue 34), loopback only.

Starts its own servers and runs four scenarios, printing one JSON object (and a Markdown table with --markdown):
  slow_readers: N streaming clients that never read (max_tokens, logprobs 20): server RSS growth while they stall,
                and after they close.
  flood:        idle connections plus clients sending one byte a second (reopened whenever the server closes
                them), while a well-behaved client measures request latency (GET /health and a 1-token completion).
  big_small:    one maximal request (--max-num-waiting sequences) and small streaming requests: the small ones'
                time to first token against their unloaded value.
  echo:         a prompt-scoring request (30 x 1,000-token prompts, echo + logprobs 20; then 8,000 tokens x n 16)
                while 4-token completions run one after another: their latency, and the big request's time and size.
  shutdown:     SIGTERM with half-open connections and a stalled stream: seconds to exit vs --shutdown-timeout.

Usage: scripts/stress_serve.py [--binary build/ssmserve] [--model models/tiny-mamba] [--quick] [--markdown]
--quick runs small, bounded versions (the e2e suite's test_server_stress uses it). Full figures: no --quick.
"""
import argparse
import json
import os
import re
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Server:
    def __init__(self, binary, model, *args, threads=1):
        cmd = [binary, "serve", "--model", model, "--port", "0", "--threads", str(threads), *map(str, args)]
        self.log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"stress-serve-{os.getpid()}-{time.monotonic_ns()}.log"), "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, OMP_WAIT_POLICY="passive"))
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline and self.port is None:
            self.log.flush()
            with open(self.log.name) as f:
                m = re.search(r"on http://[^:]+:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
            elif self.proc.poll() is not None:
                raise RuntimeError("server exited")
            else:
                time.sleep(0.05)
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("server not healthy")

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path, timeout=30):
        with urllib.request.urlopen(self.url(path), timeout=timeout) as r:
            return r.status, r.read()

    def post(self, path, body, timeout=120):
        req = urllib.request.Request(self.url(path), data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def metric(self, name):
        text = self.get("/metrics")[1].decode()
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))] if xs else float("nan")


def request_bytes(body, path="/v1/completions"):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            .encode() + data)


def slow_readers(srv, n, max_tokens, hold_s):
    """n streams that never read: RSS growth (MiB) while they stall, then after they close."""
    base = srv.rss_mib()
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(request_bytes({"prompt": f"Stream {i} of the stalled", "max_tokens": max_tokens, "ignore_eos": True,
                                 "logprobs": 20, "stream": True}))
        socks.append(s)
    peak = base
    gen0 = srv.metric("ssmserve:generation_tokens_total")
    t0 = time.time()
    while time.time() - t0 < hold_s:
        peak = max(peak, srv.rss_mib())
        time.sleep(0.25)
    generated = srv.metric("ssmserve:generation_tokens_total") - gen0
    for s in socks:
        s.close()
    t1 = time.time()
    while time.time() - t1 < 30 and srv.metric("ssmserve:state_blocks_used") > 0:
        time.sleep(0.2)
    freed_s = time.time() - t1
    time.sleep(1.0)
    after = srv.rss_mib()
    return {"clients": n, "max_tokens": max_tokens, "hold_s": hold_s, "tokens_generated": int(generated),
            "rss_base_mib": round(base, 1), "rss_peak_mib": round(peak, 1), "rss_growth_mib": round(peak - base, 1),
            "rss_after_close_mib": round(after, 1), "blocks_freed_s": round(freed_s, 2)}


class Flood:
    """Idle connections and one-byte-a-second clients, each reopened when the server closes it."""

    def __init__(self, port, idle, slow):
        self.port, self.sel = port, selectors.DefaultSelector()
        self.slow = set()
        self.reopened = 0
        self.failed_connects = 0
        for _ in range(idle):
            self.open(False)
        for _ in range(slow):
            self.open(True)

    def open(self, slow):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            self.failed_connects += 1
            return
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, slow)
        if slow:
            self.slow.add(s)

    def step(self, send):
        """Sends one byte on every slow connection (when `send`); reopens connections the server closed."""
        for s in list(self.slow) if send else []:
            try:
                s.send(b"G")
            except OSError:
                pass
        for key, _ in self.sel.select(timeout=0):
            s, slow = key.fileobj, key.data
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.sel.unregister(s)
                self.slow.discard(s)
                s.close()
                self.reopened += 1
                self.open(slow)

    def close(self):
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def flood(srv, idle, slow, duration_s):
    t0 = time.time()
    f = Flood(srv.port, idle, slow)
    open_s = time.time() - t0
    lat_health, lat_completion = [], []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t = time.time()
            srv.get("/health")
            lat_health.append(time.time() - t)
            t = time.time()
            srv.post("/v1/completions", {"prompt": "Hello", "max_tokens": 1})
            lat_completion.append(time.time() - t)
            time.sleep(0.05)

    th = threading.Thread(target=probe)
    th.start()
    t1 = last_send = time.time()
    while time.time() - t1 < duration_s:
        send = time.time() - last_send >= 1.0
        if send:
            last_send = time.time()
        f.step(send)
        time.sleep(0.02)
    stop.set()
    th.join()
    conns = srv.metric("ssmserve:http_connections")
    f.close()
    ms = lambda x: round(x * 1000, 1)
    return {"idle": idle, "slow": slow, "duration_s": duration_s, "open_s": round(open_s, 1), "reopened": f.reopened,
            "failed_connects": f.failed_connects, "server_connections": int(conns), "probes": len(lat_health),
            "health_p50_ms": ms(pct(lat_health, 50)), "health_p99_ms": ms(pct(lat_health, 99)),
            "health_max_ms": ms(max(lat_health)), "completion_p50_ms": ms(pct(lat_completion, 50)),
            "completion_p99_ms": ms(pct(lat_completion, 99)), "completion_max_ms": ms(max(lat_completion))}


def ttft_streams(srv, n, max_tokens=8):
    """n concurrent small streaming requests: each one's time to its first token (s)."""
    out = [None] * n
    barrier = threading.Barrier(n)

    def run(i):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=300)
        barrier.wait()
        t = time.time()
        s.sendall(request_bytes({"prompt": f"Small request {i}", "max_tokens": max_tokens, "stream": True}))
        buf = b""
        while b'"text"' not in buf:
            c = s.recv(65536)
            if not c:
                break
            buf += c
        if b'"text"' not in buf:
            print("small request failed:", buf[:300], file=sys.stderr)
        out[i] = time.time() - t
        while c:
            c = s.recv(65536)
        s.close()

    ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return [x for x in out if x is not None]


def big_small(srv, seqs, small):
    alone = ttft_streams(srv, small)
    prompts = max(1, seqs // 16)
    big = threading.Thread(target=lambda: srv.post("/v1/completions", {
        "prompt": [f"Prompt number {i} of the big request" for i in range(prompts)], "n": 16, "max_tokens": 16,
        "ignore_eos": True, "temperature": 1.0}, timeout=600))
    big.start()
    time.sleep(0.5)
    loaded = ttft_streams(srv, small)
    big.join()
    ms = lambda x: round(x * 1000, 1)
    return {"big_sequences": prompts * 16, "small": small, "ttft_alone_p99_ms": ms(pct(alone, 99)),
            "ttft_loaded_p50_ms": ms(pct(loaded, 50)), "ttft_loaded_p99_ms": ms(pct(loaded, 99)),
            "ratio_p99": round(pct(loaded, 99) / max(1e-9, pct(alone, 99)), 2)}


def echo_scoring(srv, prompts, prompt_tokens, n, probe_s):
    """A prompt-scoring request (`prompts` prompts of ~prompt_tokens tokens, echo + logprobs 20 + prompt_logprobs 20,
    n) while a well-behaved client sends 4-token completions one after another: their latency while it runs."""
    alone = []
    for _ in range(5):
        t = time.time()
        srv.post("/v1/completions", {"prompt": "A small request", "max_tokens": 4, "ignore_eos": True})
        alone.append(time.time() - t)
    words = " ".join(f"w{i % 97}" for i in range(prompt_tokens))  # ~prompt_tokens tokens each ("w12" -> 2 tokens)
    ids = [int(x) for x in range(prompt_tokens)]
    res = {}

    def big():
        t = time.time()
        st, body = srv.post("/v1/completions", {"prompt": [[(i * 7 + j) % 50000 + 100 for i in ids] for j in range(prompts)],
                                                "max_tokens": 1, "echo": True, "logprobs": 20, "n": n}, timeout=900)
        res["big_s"] = time.time() - t
        res["big_bytes"] = len(body)
        res["big_status"] = st

    th = threading.Thread(target=big)
    th.start()
    time.sleep(0.3)
    loaded = []
    t_end = time.time() + probe_s
    while th.is_alive() and time.time() < t_end:
        t = time.time()
        srv.post("/v1/completions", {"prompt": "A small request", "max_tokens": 4, "ignore_eos": True}, timeout=900)
        loaded.append(time.time() - t)
    th.join()
    ms = lambda x: round(x * 1000, 1)
    return {"prompts": prompts, "prompt_tokens": prompt_tokens, "n": n, "small_alone_p50_ms": ms(pct(alone, 50)),
            "small_loaded_p50_ms": ms(pct(loaded, 50)), "small_loaded_max_ms": ms(max(loaded)), "probes": len(loaded),
            "big_s": round(res.get("big_s", -1), 2), "big_mb": round(res.get("big_bytes", 0) / 1e6, 2),
            "rss_mib": round(srv.rss_mib(), 1)}


def shutdown(binary, model, timeout_s):
    srv = Server(binary, model, "--shutdown-timeout", timeout_s, "--http-header-timeout", 60, "--http-read-timeout", 60)
    socks = []
    for _ in range(5):
        c = socket.create_connection(("127.0.0.1", srv.port))
        c.sendall(b"POST /v1/compl")
        socks.append(c)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", srv.port))
    s.sendall(request_bytes({"prompt": "Stalled", "max_tokens": 8000, "ignore_eos": True, "logprobs": 20, "stream": True}))
    socks.append(s)
    time.sleep(1.0)
    t = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(timeout=timeout_s + 60)
    took = time.time() - t
    for c in socks:
        c.close()
    srv.stop()
    return {"shutdown_timeout_s": timeout_s, "exit_s": round(took, 2), "rc": rc}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "ssmserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-mamba"))
    ap.add_argument("--quick", action="store_true", help="small bounded run (the e2e suite)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--big-small-args", default="", help="extra server flags for big_small (e.g. --max-num-seqs-per-request 64)")
    ap.add_argument("--only", default="slow_readers,flood,big_small,echo,shutdown")
    a = ap.parse_args()
    fds = raise_fd_limit()
    q = a.quick
    only = set(a.only.split(","))
    res = {"fd_limit": fds}
    if "slow_readers" in only:
        srv = Server(a.binary, a.model, "--max-num-seqs", 128)
        res["slow_readers"] = slow_readers(srv, 8 if q else 64, 8000, 8 if q else 40)
        srv.stop()
    if "flood" in only:
        idle, slow = (1000, 100) if q else (10000, 1000)
        idle = min(idle, max(0, fds - slow - 200))
        srv = Server(a.binary, a.model)
        res["flood"] = flood(srv, idle, slow, 8 if q else 30)
        srv.stop()
    if "big_small" in only:
        srv = Server(a.binary, a.model, "--max-num-seqs", 256, *a.big_small_args.split())
        res["big_small"] = big_small(srv, 256 if q else 1024, 16 if q else 64)
        srv.stop()
    if "echo" in only:
        srv = Server(a.binary, a.model)
        res["echo"] = echo_scoring(srv, 4 if q else 30, 1000, 1, 20 if q else 120)
        if not q:
            res["echo_n16"] = echo_scoring(srv, 1, 8000, 16, 300)
        srv.stop()
    if "shutdown" in only:
        res["shutdown"] = shutdown(a.binary, a.model, 2 if q else 5)
    print(json.dumps(res, indent=1))
    if a.markdown:
        for name, r in res.items():
            if isinstance(r, dict):
                print(f"\n**{name}**: " + ", ".join(f"{k} {v}" for k, v in r.items()))


if __name__ == "__main__":
    sys.exit(main())
