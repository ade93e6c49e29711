# Admission and logprob limits against a hostile client (issue 34): --max-num-waiting counts sequences (prompts x n)
# and refuses one request larger than it with 400; --max-logprobs bounds logprobs / prompt_logprobs / top_logprobs;
# prompt_logprobs is returned as vLLM does (per completion choice; at a chat response's top level);
# allowed_token_ids [] is refused.
import time

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME, Server

PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged"]


def wait_for(pred, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def assert_400(r, param, *words):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == 400, err
    for w in words:
        assert w in err["message"], err


def test_max_num_waiting_counts_sequences_and_max_logprobs():
    s = Server("--max-num-seqs", 1, "--max-num-waiting", 4, "--max-logprobs", 3, threads=1)
    try:
        url = s.base_url + "/v1/completions"
        # 1. One request of 3 prompts x n 2 = 6 sequences can never fit in 4: 400 naming the limit.
        r = httpx.post(url, json={"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2}, timeout=30)
        assert_400(r, None, "6 sequences", "--max-num-waiting 4")
        r = httpx.post(url, json={"prompt": "a", "n": 5, "max_tokens": 2}, timeout=30)
        assert_400(r, None, "5 sequences", "--max-num-waiting")
        # Exactly the limit fits.
        r = httpx.post(url, json={"prompt": ["a", "b"], "n": 2, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == 4, r.text
        # 2. A request that fits the limit but not the queue now gets 503: 3 sequences wait behind a running one,
        # 2 more would make 5 (the old count of requests let it in: 1 request < 4).
        long = {"prompt": "Long", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url, json=long, timeout=60) as a:
            a_lines = a.iter_lines()
            next(a_lines)
            with httpx.stream("POST", url, json={**long, "n": 3}, timeout=60) as b:
                assert wait_for(lambda: s.metrics()["ssmserve:num_requests_waiting"] == 3)
                r = httpx.post(url, json={"prompt": "hi", "n": 2, "max_tokens": 2}, timeout=30)
                assert r.status_code == 503 and r.headers["retry-after"], r.text
                assert r.json()["error"]["type"] == "server_error" and "--max-num-waiting 4" in r.text
                r = httpx.post(url, json={"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2}, timeout=30)
                assert r.status_code == 400, r.text  # too large on its own: 400 even with the queue full
                assert b.status_code == 200
        assert wait_for(lambda: s.metrics()["ssmserve:num_requests_running"] == 0)
        # 3. --max-logprobs 3: logprobs, prompt_logprobs and chat's top_logprobs above it are 400s naming the flag.
        for body, param in (({"logprobs": 4}, "logprobs"), ({"prompt_logprobs": 4}, "prompt_logprobs"),
                            ({"prompt_logprobs": -1}, "prompt_logprobs"), ({"echo": True, "logprobs": 20}, "logprobs")):
            r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2, **body}, timeout=30)
            assert_400(r, param, "--max-logprobs")
        r = httpx.post(s.base_url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": True, "top_logprobs": 4})
        assert_400(r, "top_logprobs", "--max-logprobs")
        r = httpx.post(url, json={"prompt": "hi", "max_tokens": 2, "logprobs": 3, "prompt_logprobs": 3}, timeout=30)
        assert r.status_code == 200, r.text
        assert all(len(t) <= 4 for t in r.json()["choices"][0]["logprobs"]["top_logprobs"])  # the sampled token + top 3
        assert all(len(e) <= 4 for e in r.json()["choices"][0]["prompt_logprobs"][1:])
    finally:
        assert s.stop() == 0


def test_max_logprobs_flag_range(tmp_path):
    import subprocess

    from conftest import BINARY, MODEL

    for bad in ("-1", "21"):
        p = subprocess.run([str(BINARY), "serve", "--model", str(MODEL), "--port", "0", "--max-logprobs", bad],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and "--max-logprobs" in p.stderr, p.stderr


def test_prompt_logprobs_as_vllm(server):
    url = server.base_url + "/v1/completions"
    body = {"model": MODEL_NAME, "prompt": PROMPTS, "n": 2, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 4
    # The reference: echo + logprobs lists each prompt token's logprob.
    echo = httpx.post(url, timeout=60, json={"model": MODEL_NAME, "prompt": PROMPTS, "max_tokens": 1, "temperature": 0,
                                             "echo": True, "logprobs": 2}).json()["choices"]
    ids = [httpx.post(server.base_url + "/tokenize", json={"prompt": p}).json()["tokens"] for p in PROMPTS]
    for i, c in enumerate(choices):
        plp = c["prompt_logprobs"]
        prompt_ids = ids[i // 2]
        assert len(plp) == len(prompt_ids) and plp[0] is None
        ref = echo[i // 2]["logprobs"]["token_logprobs"]
        for t, entry in enumerate(plp[1:], start=1):
            tok = str(prompt_ids[t])
            assert tok in entry and 1 <= len(entry) <= 3, entry
            e = entry[tok]
            assert abs(e["logprob"] - ref[t]) < 1e-5 and isinstance(e["decoded_token"], str)
            others = [v for k, v in entry.items() if k != tok]
            # The top-k are ranked 1..k; the prompt token, listed once, has its own rank (1 + tokens more likely).
            ranks = sorted(v["rank"] for v in entry.values())
            assert ranks == ([1, 2] if e["rank"] <= 2 else [1, 2, e["rank"]]), entry
            assert e["rank"] > 2 or e["rank"] == 1 + sum(v["logprob"] > e["logprob"] for v in others), entry
            assert all(v["logprob"] <= 0 for v in entry.values())
    # prompt_logprobs 0: the prompt token alone.
    r = httpx.post(url, json={"prompt": PROMPTS[0], "max_tokens": 1, "prompt_logprobs": 0}, timeout=60).json()
    assert all(len(e) == 1 for e in r["choices"][0]["prompt_logprobs"][1:])
    # Without prompt_logprobs the field is absent; with stream it is refused, not ignored.
    assert "prompt_logprobs" not in httpx.post(url, json={"prompt": "hi", "max_tokens": 1}, timeout=30).json()["choices"][0]
    assert_400(httpx.post(url, json={"prompt": "hi", "max_tokens": 1, "stream": True, "prompt_logprobs": 1}, timeout=30),
               "prompt_logprobs", "stream")


def test_chat_prompt_logprobs_as_vllm(server):
    # vLLM's chat response: the rendered prompt's logprobs at the top level, the same as /v1/completions gives for the
    # same token ids; one list for n choices; absent without the field; refused with stream.
    chat = server.base_url + "/v1/chat/completions"
    messages = [{"role": "user", "content": "In the beginning God created"}]
    r = httpx.post(chat, timeout=60, json={"messages": messages, "n": 2, "max_tokens": 2, "temperature": 0,
                                           "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["choices"]) == 2 and all("prompt_logprobs" not in c for c in out["choices"])
    plp = out["prompt_logprobs"]
    ids = httpx.post(server.base_url + "/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    assert len(plp) == len(ids) == out["usage"]["prompt_tokens"] and plp[0] is None
    ref = httpx.post(server.base_url + "/v1/completions", timeout=60,
                     json={"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}).json()
    ref_plp = ref["choices"][0]["prompt_logprobs"]
    for t in range(1, len(ids)):
        assert str(ids[t]) in plp[t] and plp[t].keys() == ref_plp[t].keys(), (plp[t], ref_plp[t])
        for k, v in plp[t].items():
            assert abs(v["logprob"] - ref_plp[t][k]["logprob"]) < 1e-5 and v["rank"] == ref_plp[t][k]["rank"]
    plain = httpx.post(chat, timeout=30, json={"messages": messages, "max_tokens": 1}).json()
    assert "prompt_logprobs" not in plain
    r = httpx.post(chat, timeout=30, json={"messages": messages, "max_tokens": 1, "stream": True, "prompt_logprobs": 1})
    assert_400(r, "prompt_logprobs", "stream")


def test_empty_allowed_token_ids_is_refused(server):
    for route, body in (("/v1/completions", {"prompt": "hi"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = httpx.post(server.base_url + route, json={**body, "max_tokens": 2, "allowed_token_ids": []}, timeout=30)
        assert_400(r, "allowed_token_ids", "empty")
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "allowed_token_ids": None},
                   timeout=30)
    assert r.status_code == 200, r.text
