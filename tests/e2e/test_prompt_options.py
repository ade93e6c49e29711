# vLLM's prompt options on both endpoints: truncate_prompt_tokens (keep the prompt's last k tokens, -1 = the
# context), add_special_tokens (a bool; the default differs per endpoint) and return_tokens_as_token_ids (logprobs
# name tokens "token_id:<id>"; the server's --return-tokens-as-token-ids is the default).
import re

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
        for bad, words in ((0, ("-1",)), (-2, ()), (65, ("max_model_len",)), ("7x", ()), (1.5, ())):  # "7" is 7 (lax mode)
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
            _err(httpx.post(s.base_url + route, json={**body, "max_tokens": 1, "add_special_tokens": "maybe"}, timeout=30),
                 "add_special_tokens")
    finally:
        s.stop()


def test_return_tokens_as_token_ids():
    s = Server("--return-tokens-as-token-ids")
    try:
        url = s.base_url + "/v1/completions"
        body = {"prompt": "In the beginning", "max_tokens": 5, "temperature": 0, "logprobs": 2, "echo": True}
        ids_lp = httpx.post(url, json=body, timeout=60).json()["choices"][0]["logprobs"]
        text_lp = httpx.post(url, json={**body, "return_tokens_as_token_ids": False}, timeout=60).json()["choices"][0]["logprobs"]
        assert len(ids_lp["tokens"]) == len(text_lp["tokens"]) > 5
        ids = []
        for tok, text, top in zip(ids_lp["tokens"], text_lp["tokens"], ids_lp["top_logprobs"]):
            m = re.fullmatch(r"token_id:(\d+)", tok)
            assert m, tok
            ids.append(int(m.group(1)))
            assert top is None or all(re.fullmatch(r"token_id:\d+", k) for k in top), top
        detok = [httpx.post(s.base_url + "/detokenize", json={"tokens": [i]}, timeout=30).json()["prompt"] for i in ids]
        assert detok == text_lp["tokens"]
        assert ids_lp["token_logprobs"] == text_lp["token_logprobs"]
        chat = httpx.post(s.base_url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 1}).json()
        for c in chat["choices"][0]["logprobs"]["content"]:
            assert re.fullmatch(r"token_id:\d+", c["token"]) and c["bytes"] == list(c["token"].encode()), c
        _err(httpx.post(url, json={**body, "return_tokens_as_token_ids": "perhaps"}, timeout=30), "return_tokens_as_token_ids")
    finally:
        s.stop()
