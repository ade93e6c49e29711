# vLLM's prompt options on both endpoints: truncate_prompt_tokens (keep the prompt's last k tokens, -1 = the
# context) and add_special_tokens (a bool; the default differs per endpoint).
try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import Server


def _err(r, param, *words):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err


def test_truncate_prompt_tokens_keeps_the_last_tokens():
    s = Server("--max-model-len", 64)
    try:
        url = s.base_url + "/v1/completions"
        ids = [100 + 37 * i % 5000 for i in range(40)]
        base = {"max_tokens": 4, "temperature": 0}
        cut = httpx.post(url, json={**base, "prompt": ids, "truncate_prompt_tokens": 7, "echo": True}, timeout=60).json()
        tail = httpx.post(url, json={**base, "prompt": ids[-7:], "echo": True}, timeout=60).json()
        whole = httpx.post(url, json={**base, "prompt": ids, "echo": True}, timeout=60).json()
        assert cut["usage"]["prompt_tokens"] == 7 and whole["usage"]["prompt_tokens"] == 40
        assert cut["choices"][0]["text"] == tail["choices"][0]["text"] != whole["choices"][0]["text"]
        # A text prompt and the rendered chat prompt are cut after tokenization.
        text = " ".join(["word"] * 30)
        r = httpx.post(url, json={**base, "prompt": text, "truncate_prompt_tokens": 5}, timeout=60).json()
        assert r["usage"]["prompt_tokens"] == 5
        chat = s.base_url + "/v1/chat/completions"
        msgs = [{"role": "user", "content": text}]
        r = httpx.post(chat, json={**base, "messages": msgs, "truncate_prompt_tokens": 6}, timeout=60).json()
        assert r["usage"]["prompt_tokens"] == 6
        # Shorter prompts are unchanged; -1 is the context (64): a 40-token prompt stays whole.
        r = httpx.post(url, json={**base, "prompt": ids, "truncate_prompt_tokens": 50}, timeout=60)
        assert r.json()["usage"]["prompt_tokens"] == 40
        r = httpx.post(url, json={**base, "prompt": ids, "truncate_prompt_tokens": -1}, timeout=60)
        assert r.json()["usage"]["prompt_tokens"] == 40
        # -1 on a prompt longer than the context keeps 64 tokens: no room left, the context error as vLLM.
        _err(httpx.post(url, json={**base, "prompt": ids * 2, "truncate_prompt_tokens": -1}, timeout=60), "prompt",
             "maximum context length")
        r = httpx.post(url, json={"prompt": ids * 2, "truncate_prompt_tokens": 60, "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 60, r.text
        for bad, words in ((0, ("-1",)), (-2, ()), (65, ("max_model_len",)), ("7", ()), (1.5, ())):
            _err(httpx.post(url, json={**base, "prompt": ids, "truncate_prompt_tokens": bad}, timeout=30),
                 "truncate_prompt_tokens", *words)
    finally:
        s.stop()


def test_add_special_tokens_is_a_bool_on_both_endpoints():
    s = Server()
    try:
        for route, body in (("/v1/completions", {"prompt": "Hello"}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]})):
            for v in (True, False):
                r = httpx.post(s.base_url + route, json={**body, "max_tokens": 1, "add_special_tokens": v}, timeout=60)
                assert r.status_code == 200, r.text
            _err(httpx.post(s.base_url + route, json={**body, "max_tokens": 1, "add_special_tokens": "yes"}, timeout=30),
                 "add_special_tokens")
    finally:
        s.stop()
