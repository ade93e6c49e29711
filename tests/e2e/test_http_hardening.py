# The HTTP layer against hostile or unusual clients: engine errors as real 5xx statuses, disconnects of waiting
# clients aborting their requests, body limits for chunked bodies, bodies without Content-Type, framing attacks
# (request smuggling), wrong methods, pipelining, slowloris, and SIGTERM draining. Raw sockets where httpx would
# normalize what is sent.
import http.client
import json
import signal
import socket
import threading
import time

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME, Server


def wait_for(pred, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def connect(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


class _NoClose:
    """A socket file that HTTPResponse cannot close, so several responses can be read from it (pipelining)."""

    def __init__(self, f):
        self.f = f

    def __getattr__(self, name):
        return getattr(self.f, name)

    def close(self):
        pass


class _FileSock:
    def __init__(self, f):
        self.f = _NoClose(f)

    def makefile(self, *_):
        return self.f


def read_response(f, method="POST"):
    r = http.client.HTTPResponse(_FileSock(f), method=method)
    r.begin()
    return r, r.read()


def raw(server, data):
    """Sends raw bytes on a new connection; returns (response, body bytes)."""
    with connect(server) as s:
        s.sendall(data)
        return read_response(s.makefile("rb"))


def request_bytes(path, body, headers=()):
    head = [f"POST {path} HTTP/1.1", "Host: localhost", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def assert_openai_error(resp, body, status):
    assert resp.status == status, body
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"] == status
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return err


# 1. An engine error after admission is a 5xx status with the OpenAI body, never 200.
def test_engine_error_after_admission_is_500():
    s = Server(env={"SSMSERVE_FAULT_STEP": "2"})
    try:
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8, "ignore_eos": True}, timeout=60)
        assert r.status_code == 500, r.text
        assert r.json()["error"]["type"] == "server_error" and "injected fault" in r.json()["error"]["message"]
        # Only the 2nd step failed: the server keeps serving.
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        s.stop()


# 2. A non-streaming client that goes away while waiting is aborted and its state block freed.
def test_nonstreaming_disconnect_aborts_and_frees_blocks(server):
    before = server.metrics()
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True}).encode()
    s = connect(server)
    s.sendall(request_bytes("/v1/completions", body, ["Content-Type: application/json", f"Content-Length: {len(body)}"]))
    assert wait_for(lambda: server.metrics()["ssmserve:num_requests_running"] >= 1)
    s.close()
    assert wait_for(lambda: server.metrics()["ssmserve:state_blocks_used"] == 0), server.metrics()
    after = server.metrics()
    assert after["ssmserve:num_requests_running"] == 0
    assert after["ssmserve:request_success_total:abort"] == before["ssmserve:request_success_total:abort"] + 1
    assert after["ssmserve:generation_tokens_total"] < before["ssmserve:generation_tokens_total"] + 8000


# 3. A streaming client that goes away before its first token (here: while queued behind another request) is
# aborted then, not at its first write.
def test_streaming_disconnect_before_first_token_aborts():
    s = Server("--max-num-seqs", 1, threads=1)
    try:
        long = {"prompt": "Long", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.base_url + "/v1/completions", json=long, timeout=60) as a:
            lines = a.iter_lines()
            next(lines)
            before = s.metrics()
            with httpx.stream("POST", s.base_url + "/v1/completions", json=long, timeout=60) as b:
                assert b.status_code == 200
                assert wait_for(lambda: s.metrics()["ssmserve:num_requests_waiting"] == 1)
            # b closed without ever getting a token: it leaves the queue while a still runs.
            assert wait_for(lambda: s.metrics()["ssmserve:num_requests_waiting"] == 0, timeout=10)
            m = s.metrics()
            assert m["ssmserve:request_success_total:abort"] == before["ssmserve:request_success_total:abort"] + 1
            assert m["ssmserve:num_requests_running"] == 1
    finally:
        s.stop()


# 4. Chunked request bodies obey the body limit (413), and small chunked bodies work.
def test_chunked_body_limit(server):
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    resp, data = raw(server, request_bytes("/v1/completions", chunked, ["Transfer-Encoding: chunked"]))
    assert resp.status == 200, data
    assert json.loads(data)["usage"]["completion_tokens"] == 2

    piece = b"x" * (1 << 20)
    with connect(server) as s:
        s.sendall(request_bytes("/v1/completions", b"", ["Transfer-Encoding: chunked"]))
        try:
            for _ in range(40):  # 40 MiB > the 32 MiB limit
                s.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        except OSError:
            pass  # the server stopped reading after the limit
        resp, data = read_response(s.makefile("rb"))
    assert_openai_error(resp, data, 413)
    assert resp.getheader("Connection") == "close"


# 5. SIGTERM: new requests get 503 + Retry-After while draining; at the timeout open streams end with an error
# event and [DONE]; the process exits cleanly.
def test_sigterm_drain_answers_503_and_ends_streams_cleanly():
    s = Server("--shutdown-timeout", 3, threads=1)
    try:
        with httpx.stream("POST", s.base_url + "/v1/completions", timeout=60,
                          json={"prompt": "Hello", "max_tokens": 6000, "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            for path, method in [("/v1/completions", "POST"), ("/health", "GET")]:
                n = httpx.request(method, s.base_url + path, json={"prompt": "hi"} if method == "POST" else None, timeout=10)
                assert n.status_code == 503 and n.headers["retry-after"], n.text
                assert n.json()["error"]["type"] == "server_error"
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][len("data: "):])["error"]
        assert err["code"] == 503 and "shutting down" in err["message"]
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()


# 6. A JSON body without Content-Type (or with curl -d's form type) is accepted up to the normal limit; errors use
# OpenAI types.
def test_body_without_content_type_and_openai_error_types(server):
    body = json.dumps({"prompt": "word " * 4000, "max_tokens": 1}).encode()
    assert len(body) > 16384
    for headers in ([], ["Content-Type: application/x-www-form-urlencoded"]):
        resp, data = raw(server, request_bytes("/v1/completions", body, headers + [f"Content-Length: {len(body)}"]))
        assert resp.status == 200, data
    resp, data = raw(server, request_bytes("/v1/completions", b"", ["Content-Length: 40000000"]))
    assert "HTTP" not in assert_openai_error(resp, data, 413)["message"]
    r = httpx.get(server.base_url + "/nothing/here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


# 10. Pipelined requests on one connection are all answered, in order.
def test_pipelined_requests_answered_in_order(server):
    reqs = b""
    for text in ["Hello", "world", "again"]:
        body = json.dumps({"prompt": text}).encode()
        reqs += request_bytes("/tokenize", body, [f"Content-Length: {len(body)}"])
    reqs += b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with connect(server) as s:
        s.sendall(reqs)
        f = s.makefile("rb")
        counts = [json.loads(read_response(f)[1])["count"] for _ in range(3)]
        resp, _ = read_response(f, method="GET")
    expected = [httpx.post(server.base_url + "/tokenize", json={"prompt": t}).json()["count"] for t in ["Hello", "world", "again"]]
    assert counts == expected and resp.status == 200


# 11. Ambiguous framing is refused with 400 (request smuggling), as are malformed lengths.
def test_conflicting_framing_is_400(server):
    body = b'{"prompt": "hi", "max_tokens": 1}'
    cases = [
        [f"Content-Length: {len(body)}", "Transfer-Encoding: chunked"],
        [f"Content-Length: {len(body)}", f"Content-Length: {len(body) + 1}"],
        [f"Content-Length: {len(body)}", f"Content-Length: {len(body)}"],
        ["Content-Length: -5"],
        ["Content-Length: 12abc"],
        [f"Content-Length: {len(body)}, {len(body)}"],
        ["Transfer-Encoding: gzip, chunked"],
    ]
    for headers in cases:
        resp, data = raw(server, request_bytes("/v1/completions", body, headers))
        assert_openai_error(resp, data, 400)
        assert resp.getheader("Connection") == "close", headers
    assert httpx.get(server.base_url + "/health").status_code == 200


# 12. A wrong method on a known route is 405 with Allow.
def test_malformed_request_line_is_answered_once_and_closed(server):
    # httplib cannot parse the request: one 400 with the OpenAI body, then the connection closes (the rest of the
    # bytes must not be read as further requests, each answered again, on a kept-alive connection).
    for junk in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\nHost: x\n\n\n"):
        with connect(server) as s:
            s.sendall(junk)
            s.settimeout(3)
            data = b""
            start = time.monotonic()
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            assert time.monotonic() - start < 2.5, data  # closed by the server, not by the 5 s keep-alive timeout
        assert data.count(b"HTTP/1.1 ") == 1, data
        assert data.startswith(b"HTTP/1.1 400") and b"Connection: close" in data, data


def test_wrong_method_is_405_with_allow(server):
    for method, path, allow in [("GET", "/v1/completions", "POST"), ("PUT", "/v1/chat/completions", "POST"),
                                ("POST", "/health", "GET, HEAD"), ("DELETE", "/v1/models", "GET, HEAD")]:
        r = httpx.request(method, server.base_url + path)
        assert r.status_code == 405 and r.headers["allow"] == allow, (method, path, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(server.base_url + "/v1/models").status_code == 200


# 13. Slowloris: clients trickling headers are dropped at the read timeout and cannot starve the worker pool.
def test_slow_clients_are_dropped_and_cannot_starve_the_pool():
    s = Server("--http-threads", 4, "--http-read-timeout", 1, threads=1)
    stop = threading.Event()
    dropped = []

    def trickle():
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        start = time.time()
        try:
            while not stop.is_set() and time.time() - start < 20:
                sock.sendall(b"X-Slow: 1\r\n")
                time.sleep(0.2)
        except OSError:
            pass
        dropped.append(time.time() - start)
        sock.close()

    try:
        threads = [threading.Thread(target=trickle) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.time()
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200 and time.time() - t0 < 15
        for t in threads:
            t.join(timeout=25)
        assert len(dropped) == 6 and max(dropped) < 15, dropped
    finally:
        stop.set()
        s.stop()
