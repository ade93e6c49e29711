# vLLM's return_token_ids (completions and chat): the generated ids beside the text (`token_ids` on each choice) and
# the prompt's (`prompt_token_ids`: on each completions choice, at the top of a chat response); streamed, each chunk's
# own ids and the prompt's in a choice's first chunk; the ids are the text's, the streamed ones the whole ones.
import json

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME

PROMPT = "It is a truth universally acknowledged"
MESSAGES = [{"role": "user", "content": "Call me Ishmael."}]


def events(r):
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]


def detokenize(base, ids):
    return httpx.post(base + "/detokenize", json={"model": MODEL_NAME, "tokens": ids}).json()["prompt"]


def test_completions_ids_whole_and_streamed(server):
    base = server.base_url
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "n": 2, "return_token_ids": True}
    r = httpx.post(base + "/v1/completions", json=body, timeout=60).json()
    prompt_ids = httpx.post(base + "/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}).json()["tokens"]
    for ch in r["choices"]:
        assert list(ch)[-2:] == ["token_ids", "prompt_token_ids"], list(ch)  # vLLM's field order
        assert ch["prompt_token_ids"] == prompt_ids and len(ch["token_ids"]) == 12
        assert detokenize(base, ch["token_ids"]) == ch["text"]
    assert r["usage"]["completion_tokens"] == 24
    # Streamed: each chunk's ids, the prompt's once per choice, together the whole response's.
    streamed = {0: [], 1: []}
    prompt_seen = {0: 0, 1: 0}
    with httpx.stream("POST", base + "/v1/completions", json=dict(body, stream=True), timeout=60) as s:
        for e in events(s):
            ch = e["choices"][0]
            streamed[ch["index"]] += ch["token_ids"]
            prompt_seen[ch["index"]] += "prompt_token_ids" in ch
            if "prompt_token_ids" in ch:
                assert ch["prompt_token_ids"] == prompt_ids
    assert streamed == {0: r["choices"][0]["token_ids"], 1: r["choices"][1]["token_ids"]}
    assert prompt_seen == {0: 1, 1: 1}
    # Echo streams the prompt first, its ids with it.
    with httpx.stream("POST", base + "/v1/completions", json=dict(body, stream=True, echo=True, n=1), timeout=60) as s:
        first = events(s)[0]["choices"][0]
    assert first["text"] == PROMPT and first["prompt_token_ids"] == prompt_ids and first["token_ids"] == []
    # Off (absent or false): no id fields.
    plain = httpx.post(base + "/v1/completions", json=dict(body, return_token_ids=False)).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain
    bad = httpx.post(base + "/v1/completions", json=dict(body, return_token_ids="maybe"))
    assert bad.status_code == 400 and "return_token_ids" in bad.text


def test_chat_ids_whole_and_streamed(server):
    base = server.base_url
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 10, "temperature": 0, "return_token_ids": True}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()
    prompt_ids = httpx.post(base + "/tokenize", json={"model": MODEL_NAME, "messages": MESSAGES}).json()["tokens"]
    assert r["prompt_token_ids"] == prompt_ids and list(r)[-1] == "prompt_token_ids"
    ch = r["choices"][0]
    assert len(ch["token_ids"]) == 10 and detokenize(base, ch["token_ids"]) == ch["message"]["content"]
    ids, firsts = [], []
    with httpx.stream("POST", base + "/v1/chat/completions", json=dict(body, stream=True), timeout=60) as s:
        for e in events(s):
            firsts.append("prompt_token_ids" in e)
            if "prompt_token_ids" in e:
                assert e["prompt_token_ids"] == prompt_ids
            ids += e["choices"][0].get("token_ids", [])
    assert firsts[0] and sum(firsts) == 1 and ids == ch["token_ids"]
    plain = httpx.post(base + "/v1/chat/completions", json=dict(body, return_token_ids=None)).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
