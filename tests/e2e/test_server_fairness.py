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


def _post_in_thread(s, body, done):
    def run():
        r = httpx.post(s.base_url + "/v1/completions", timeout=300, json=body)
        done.append((time.monotonic(), r.status_code, r.json()))

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_request_holds_a_quarter_of_the_seats_and_its_fair_share_once_others_come():
    # Default --max-num-seqs-per-request: a quarter of --max-num-seqs (16 -> 4), so steps that a newcomer shares
    # with an older large request stay within about 2x of its cost alone.
    s = Server("--max-num-seqs", 16, threads=1)
    try:
        done = []
        t = _post_in_thread(s, {"prompt": [f"Prompt {i}" for i in range(4)], "n": 8, "max_tokens": 24, "ignore_eos": True}, done)
        peak = 0
        while t.is_alive():
            peak = max(peak, s.metrics()["ssmserve:num_requests_running"])
            time.sleep(0.01)
        t.join()
        assert done[0][1] == 200 and len(done[0][2]["choices"]) == 32
        assert 1 <= peak <= 4, peak
    finally:
        s.stop()


def test_long_prompts_of_one_request_do_not_hold_a_small_one_behind_them():
    # Prompt tokens of one request not yet prefilled in the engine are capped at 2 x --max-num-batched-tokens, so a
    # small request sent after 64 x 400-token prompts (100 steps of 256 tokens) runs before they are all prefilled.
    # (With 16 prompts, 25 fast CPU steps could end before the small request arrived: the test was timing-bound.)
    s = Server("--max-num-batched-tokens", 256, threads=1)
    try:
        done = []
        prompts = [[100 + (7 * i + j) % 5000 for i in range(400)] for j in range(64)]
        t = _post_in_thread(s, {"prompt": prompts, "max_tokens": 1}, done)
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["ssmserve:num_requests_running"] < 1:
            time.sleep(0.01)
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Small", "max_tokens": 2}, timeout=120)
        small_done = time.monotonic()
        assert r.status_code == 200
        assert not done, "the small request waited for every prompt of the large one"
        t.join(timeout=300)
        assert done and done[0][1] == 200 and done[0][0] > small_done
    finally:
        s.stop()


def test_prompt_scoring_is_spread_over_steps():
    # echo + logprobs scores every prompt token (a logits row and a top-k each): --max-num-scored-tokens caps them
    # per step, so a small request sent meanwhile finishes first; the scores equal those of an unsplit run.
    prompts = [[100 + (7 * i + j) % 5000 for i in range(300)] for j in range(8)]
    body = {"prompt": prompts, "max_tokens": 1, "echo": True, "logprobs": 2, "temperature": 0}
    s = Server("--max-num-scored-tokens", 32, "--no-enable-prefix-caching", threads=1)
    try:
        done = []
        t = _post_in_thread(s, body, done)
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["ssmserve:num_requests_running"] < 1:
            time.sleep(0.01)
        r = httpx.post(s.base_url + "/v1/completions", json={"prompt": "Small", "max_tokens": 2}, timeout=120)
        small_done = time.monotonic()
        assert r.status_code == 200
        t.join(timeout=300)
        assert done and done[0][1] == 200 and done[0][0] > small_done
        split = done[0][2]
    finally:
        s.stop()
    s = Server("--max-num-scored-tokens", 0, "--no-enable-prefix-caching", threads=1)
    try:
        whole = httpx.post(s.base_url + "/v1/completions", json=body, timeout=300).json()
    finally:
        s.stop()
    for a, b in zip(split["choices"], whole["choices"]):
        la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
        assert len(la) == len(lb) == 301 and la[0] is None and lb[0] is None
        assert max(abs(x - y) for x, y in zip(la[1:], lb[1:])) < 1e-4
        assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
