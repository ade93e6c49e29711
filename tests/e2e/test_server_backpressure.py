# Output streaming with backpressure (issue 34): a streaming client that stops reading has its output coalesced,
# not copied per step; past --max-pending-output-bytes its request is aborted (state block freed) and, when it reads
# again, its stream ends with a 429 error event and [DONE]. Also usage.prompt_tokens_details.cached_tokens and the
# prefix-cache counters (issue 28).
import json
import socket
import time

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME, Server


def wait_for(pred, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def stalled_stream(port, body):
    """Opens a streaming request on a socket with a tiny receive buffer and returns it unread."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_unread_stream_is_aborted_past_the_cap_with_an_error_event():
    s = Server("--max-pending-output-bytes", 65536, threads=1)
    try:
        before = s.metrics()
        # n = 8 choices with logprobs 20: the socket buffers fill (and the cap is reached) within a few hundred steps.
        sock = stalled_stream(s.port, {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 8000, "ignore_eos": True,
                                       "logprobs": 20, "n": 8, "stream": True})
        # The client reads nothing: the socket buffers fill, the output coalesces up to the cap, then it is aborted.
        assert wait_for(lambda: s.metrics()["ssmserve:request_success_total:abort"]
                        == before["ssmserve:request_success_total:abort"] + 8, timeout=120), s.metrics()
        assert wait_for(lambda: s.metrics()["ssmserve:state_blocks_used"] == 0)
        assert s.metrics()["ssmserve:generation_tokens_total"] < before["ssmserve:generation_tokens_total"] + 8 * 8000
        # Reading again: everything sent so far, then the error event and [DONE].
        sock.settimeout(30)
        data = b""
        while not data.endswith(b"data: [DONE]\n\n") and b"0\r\n\r\n" not in data[-16:]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        sock.close()
        events = [line for line in data.split(b"\n") if line.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]"
        err = json.loads(events[-2][len(b"data: "):])["error"]
        assert err["code"] == 429 and "--max-pending-output-bytes" in err["message"], err
        # The server still serves.
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
    finally:
        s.stop()


def test_coalesced_stream_is_complete_after_a_pause():
    # A client that pauses (below the cap) gets every token, in order, merged into fewer chunks.
    s = Server(threads=1)
    try:
        body = {"model": MODEL_NAME, "prompt": "Call me Ishmael.", "max_tokens": 300, "ignore_eos": True,
                "temperature": 0, "logprobs": 2}
        full = httpx.post(s.base_url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        sock = stalled_stream(s.port, dict(body, stream=True))
        time.sleep(1.0)  # generation runs ahead of the reader
        sock.settimeout(30)
        f = sock.makefile("rb")
        import http.client

        class _Sock:
            def makefile(self, *_):
                return f

        resp = http.client.HTTPResponse(_Sock(), method="POST")
        resp.begin()
        assert resp.status == 200
        text, tokens = "", []
        for line in resp.read().split(b"\n"):
            if line.startswith(b"data: {"):
                c = json.loads(line[6:])["choices"][0]
                text += c["text"]
                tokens += (c["logprobs"] or {}).get("tokens", [])
        sock.close()
        assert text == full["text"] and tokens == full["logprobs"]["tokens"]
    finally:
        s.stop()


def test_usage_reports_cached_tokens_and_metrics_prefix_cache(server):
    # A repeated long prompt continues from its cached prefix (prefix caching is on by default): the second
    # response reports cached prompt tokens, and the counters move.
    before = server.metrics()
    prompt = " ".join(["In the beginning God created the heaven and the earth."] * 80)
    usages = [httpx.post(server.base_url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2},
                         timeout=60).json()["usage"] for _ in range(2)]
    assert usages[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert 0 < usages[1]["prompt_tokens_details"]["cached_tokens"] < usages[1]["prompt_tokens"]
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert "cached_tokens" in r.json()["usage"]["prompt_tokens_details"]
    m = server.metrics()
    assert m["ssmserve:prefix_cache_queries_total"] >= before["ssmserve:prefix_cache_queries_total"] + 2 * usages[0]["prompt_tokens"]
    assert m["ssmserve:prefix_cache_hits_total"] >= before["ssmserve:prefix_cache_hits_total"] + usages[1]["prompt_tokens_details"]["cached_tokens"]
