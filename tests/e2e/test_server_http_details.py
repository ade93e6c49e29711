# HTTP details of the event-driven transport (issue 34): HTTP/1.0 streams without chunked encoding, HTTP/1.1
# without Host, chunked bodies with trailers, a short body answered 408 at the read timeout, shutdown within
# --shutdown-timeout whatever half-open connections do, --max-connections, 100-continue, the keep-alive timeout.
import json
import re
import signal
import socket
import time

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import Server


def exchange(port, data, timeout=10.0):
    """Sends raw bytes on a new connection and reads until the server closes it (or `timeout`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out, time.monotonic() - start


def post(path, body, version="1.1", headers=()):
    head = [f"POST {path} HTTP/{version}", *headers, f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_http10_stream_is_close_delimited_not_chunked(server):
    body = json.dumps({"prompt": "Hello", "max_tokens": 4, "stream": True}).encode()
    out, _ = exchange(server.port, post("/v1/completions", body, version="1.0"))
    head, _, payload = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding" not in head.lower() and b"Connection: close" in head, head
    events = [line for line in payload.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]" and len(events) >= 2
    # An HTTP/1.0 request without Host is fine; a non-streaming 1.0 response has a length.
    out, _ = exchange(server.port, b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and b"Content-Length:" in out


def test_http11_without_host_is_400(server):
    out, _ = exchange(server.port, b"GET /health HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400"), out
    assert b"Host" in out and b"Connection: close" in out
    out, _ = exchange(server.port, b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400"), out


def test_chunked_body_with_trailer_is_accepted(server):
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    chunked = f"{len(body) - 5:x}\r\n".encode() + body[:-5] + b"\r\n5\r\n" + body[-5:] + b"\r\n0\r\nX-Checksum: 1\r\n\r\n"
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked
    out, _ = exchange(server.port, req)
    head, _, payload = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out
    assert json.loads(payload)["usage"]["completion_tokens"] == 2


def test_content_length_longer_than_body_is_408_after_the_read_timeout():
    s = Server("--http-read-timeout", 1.5, threads=1)
    try:
        body = b'{"prompt": "Hi", "max_tokens": 2}'
        req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + body
        out, took = exchange(s.port, req)
        assert out.startswith(b"HTTP/1.1 408"), out
        assert json.loads(out.partition(b"\r\n\r\n")[2])["error"]["code"] == 408
        assert 1.0 < took < 5.0, took
    finally:
        s.stop()


def test_expect_100_continue(server):
    body = json.dumps({"prompt": "Hello"}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(f"POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode())
    assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")
    s.sendall(body)
    data = s.recv(65536)
    s.close()
    assert data.startswith(b"HTTP/1.1 200") and b'"count"' in data


def test_idle_connections_close_at_the_keep_alive_timeout_and_max_connections():
    # The keep-alive timeout is long enough that the idle connections are still open when the 21st arrives on a
    # loaded 2-core CI machine (with 1 s, a slow step let the server close some first and answer 200: CI, stop 59).
    keep_alive = 4.0
    s = Server("--http-keep-alive-timeout", keep_alive, "--max-connections", 20, threads=1)
    try:
        # The start-up health check's connection holds a slot until the server has seen it close: wait until the
        # server counts only the asking connection (closed by the server: Connection: close), so that the 20 idle
        # ones below all fit (on a loaded CI machine one of them got the 503: CI, stop 64).
        deadline = time.monotonic() + 20
        while True:
            out, _ = exchange(s.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if re.search(rb"\nssmserve:http_connections(\{[^}]*\})? 1(\.0)?\r?\n", out) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        time.sleep(0.3)
        opened = time.monotonic()
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(20)]
        time.sleep(0.3)
        # Over the limit: a 503 at once.
        out, took = exchange(s.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        if time.monotonic() - opened < keep_alive:  # else the server may rightly have closed idle ones already
            assert out.startswith(b"HTTP/1.1 503") and b"max-connections" in out and took < 2, out
        # The idle ones are closed by the server after the keep-alive timeout, freeing the slots.
        for c in idle:
            c.settimeout(15)
            assert c.recv(10) == b""
            c.close()
        closed_after = time.monotonic() - opened
        assert keep_alive - 0.5 < closed_after < keep_alive + 6, closed_after
        time.sleep(0.2)
        assert httpx.get(s.base_url + "/health", timeout=10).status_code == 200
    finally:
        s.stop()


def test_sigterm_exits_within_the_timeout_despite_half_open_connections():
    s = Server("--shutdown-timeout", 2, "--http-read-timeout", 60, "--http-header-timeout", 60, threads=1)
    socks = []
    try:
        for _ in range(5):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=10)
            c.sendall(b"POST /v1/compl")  # half a request line, never finished
            socks.append(c)
        body = json.dumps({"prompt": "Hi", "max_tokens": 8000, "ignore_eos": True, "stream": True}).encode()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", s.port))
        stalled.sendall(post("/v1/completions", body, headers=["Host: x"]))  # a stream that is never read
        socks.append(stalled)
        time.sleep(1.0)
        start = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0
        assert time.monotonic() - start < 2 + 4, time.monotonic() - start  # not the 60 s read timeouts; slack for a loaded CI
    finally:
        for c in socks:
            c.close()
        s.stop()


def test_mutated_requests_never_crash_the_server():
    # Hostile bytes at the HTTP layer: flipped bytes, truncations, odd chunk sizes, huge or binary headers. Each gets
    # an answer or a close; the server keeps serving.
    import random

    s = Server("--http-read-timeout", 1, "--http-header-timeout", 1, "--http-keep-alive-timeout", 1, threads=1)
    try:
        rng = random.Random(34)
        body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
        seeds = [
            post("/v1/completions", body, headers=["Host: x"]),
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n",
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        extras = [b"ffffffffffffffffffff\r\n", b"-1\r\n", b"\x00\xff\r\n\r\n", b"X: " + b"a" * 70000 + b"\r\n",
                  b"Content-Length: 99999999999999999999\r\n", b"\r\n\r\n\r\n", b"HTTP/9.9\r\n", b" \t\r\n"]
        for i in range(300):
            data = bytearray(rng.choice(seeds))
            op = rng.randrange(4)
            if op == 0:
                for _ in range(rng.randrange(1, 6)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == 1:
                data = data[: rng.randrange(len(data))]
            else:
                pos = rng.randrange(len(data))
                data[pos:pos] = rng.choice(extras)
            c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            try:
                c.sendall(bytes(data))
                c.settimeout(0.02 if i % 20 else 2)
                while c.recv(65536):
                    pass
            except OSError:
                pass
            c.close()
        assert s.proc.poll() is None, s.output()[-2000:]
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
    finally:
        s.stop()
