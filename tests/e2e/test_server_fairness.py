# Fair admission (issue 34): a request's sequences enter the engine at most --max-num-seqs-per-request at a time
# (default half of --max-num-seqs) and requests take turns, so a small request sent after a large one is served
# while the large one still runs, instead of waiting for all its sequences.
import threading
import time

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import Server


def test_small_request_is_not_starved_by_a_large_one():
    s = Server("--max-num-seqs", 4, threads=1)
    try:
        big_done = []

        def big():
            r = httpx.post(s.base_url + "/v1/completions", timeout=300, json={
                "prompt": [f"Prompt {i}" for i in range(8)], "n": 8, "max_tokens": 40, "ignore_eos": True})
            big_done.append((time.monotonic(), r.status_code, len(r.json()["choices"])))

        t = threading.Thread(target=big)
        t.start()
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["ssmserve:num_requests_running"] < 1:
            time.sleep(0.02)
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Small", "max_tokens": 2}, timeout=120)
        small_done = time.monotonic()
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert not big_done, "the small request waited for all 64 sequences of the large one"
        t.join(timeout=300)
        assert big_done and big_done[0][1] == 200 and big_done[0][2] == 64 and big_done[0][0] > small_done
    finally:
        s.stop()
