# Serving under load and over a request's life: 64 concurrent streaming clients, client disconnects freeing state
# blocks (seen in /metrics), 503 when the waiting queue is full, graceful SIGTERM.
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME, Server

WORDS = ["In the beginning", "Emma Woodhouse", "Call me Ishmael.", "It was the best of times", "The LORD is my",
         "Happy families are", "Whan that Aprille", "Of Man's first disobedience"]


def wait_for(pred, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_64_concurrent_streaming_clients(server, client):
    expected = {p: client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=16, temperature=0).choices[0].text
                for p in WORDS}
    prompts = [WORDS[i % len(WORDS)] for i in range(64)]
    barrier = threading.Barrier(64)

    def run(prompt):
        barrier.wait()
        stream = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with ThreadPoolExecutor(64) as pool:
        texts = list(pool.map(run, prompts))
    assert texts == [expected[p] for p in prompts]
    assert server.metrics()["ssmserve:num_requests_running"] == 0


def test_disconnect_aborts_and_frees_blocks(server):
    before = server.metrics()
    with httpx.stream("POST", server.base_url + "/v1/completions",
                      json={"prompt": "Once upon a time", "max_tokens": 8000, "ignore_eos": True, "stream": True,
                            "temperature": 0}) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert all(g == "" or g.startswith("data: ") for g in got)
        m = server.metrics()
        assert m["ssmserve:state_blocks_used"] >= 1 and m["ssmserve:num_requests_running"] >= 1
    # The client closed the connection mid-stream.
    assert wait_for(lambda: server.metrics()["ssmserve:state_blocks_used"] == 0), server.metrics()
    after = server.metrics()
    assert after["ssmserve:num_requests_running"] == 0
    assert after["ssmserve:request_success_total:abort"] == before["ssmserve:request_success_total:abort"] + 1
    assert after["ssmserve:generation_tokens_total"] < before["ssmserve:generation_tokens_total"] + 8000


def test_queue_full_gives_503_then_recovers():
    s = Server("--max-num-seqs", 1, "--max-num-waiting", 1, threads=1)
    try:
        body = {"prompt": "Long", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.base_url + "/v1/completions", json=body) as a:
            a_lines = a.iter_lines()  # keep the generator: dropping it closes the response
            next(a_lines)
            with httpx.stream("POST", s.base_url + "/v1/completions", json=body) as b:
                assert wait_for(lambda: s.metrics()["ssmserve:num_requests_waiting"] == 1)
                r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 503 and r.headers["retry-after"]
                assert r.json()["error"]["type"] == "server_error"
                assert b.status_code == 200
        assert wait_for(lambda: s.metrics()["ssmserve:num_requests_running"] == 0)
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        s.stop()


def test_sigterm_finishes_running_requests_then_exits():
    s = Server(threads=1)
    try:
        with httpx.stream("POST", s.base_url + "/v1/completions",
                          json={"prompt": "Hello", "max_tokens": 48, "ignore_eos": True, "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            s.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert s.proc.wait(timeout=30) == 0
    finally:
        s.stop()
