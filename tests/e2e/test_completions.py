# /v1/completions, /v1/models, /tokenize, /detokenize through the real `openai` client: greedy outputs equal
# `ssmserve generate`, streaming equals non-streaming, usage, logprobs, n, echo, stop strings.
import json

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME, cli_generate

PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged", "Call me Ishmael."]


def test_models_and_health(server, client):
    assert httpx.get(server.base_url + "/health").status_code == 200
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_greedy_equals_cli(client):
    expected = cli_generate(PROMPTS, 24)
    for prompt, ref in zip(PROMPTS, expected):
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0)
        assert r.choices[0].text == ref["text"]
        assert r.choices[0].finish_reason == ref["finish_reason"]
        assert r.usage.prompt_tokens == len(ref["prompt_token_ids"])
        assert r.usage.completion_tokens == len(ref["token_ids"])


def test_batch_prompt_list_and_token_ids(client):
    expected = cli_generate(PROMPTS, 12)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [e["text"] for e in expected]
    r = client.completions.create(model=MODEL_NAME, prompt=expected[0]["prompt_token_ids"], max_tokens=12, temperature=0)
    assert r.choices[0].text == expected[0]["text"]


def test_stream_equals_non_stream(client):
    ref = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=32, temperature=0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=32, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [ref.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ref.usage.completion_tokens


def test_continuous_usage_stats(server):
    # vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries the usage so far.
    body = {"prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert all("usage" in e for e in events) and counts == sorted(counts) and counts[-1] == 6
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"] for e in events)
    # Two prompts, n = 2: each chunk carries its own choice's counts and its prompt's tokens (vLLM), the last
    # (choices []) the request's totals.
    lens = [len(httpx.post(server.base_url + "/tokenize", json={"prompt": p}).json()["tokens"]) for p in PROMPTS[:2]]
    multi = dict(body, prompt=PROMPTS[:2], n=2)
    with httpx.stream("POST", server.base_url + "/v1/completions", json=multi, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    per_choice = {}
    for e in events[:-1]:
        (c,) = e["choices"]
        per_choice.setdefault(c["index"], []).append(e["usage"]["completion_tokens"])
        assert e["usage"]["prompt_tokens"] == lens[c["index"] // 2]
    assert all(counts == sorted(counts) and counts[-1] == 6 for counts in per_choice.values()) and len(per_choice) == 4
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 24
    assert events[-1]["usage"]["prompt_tokens"] == sum(lens)  # each prompt once (vLLM)
    body["stream_options"] = {"continuous_usage_stats": True}  # without include_usage: none (as vLLM)
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        assert not any("usage" in json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {"))


def test_raw_sse_format(server):
    with httpx.stream("POST", server.base_url + "/v1/completions",
                      json={"prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}) as r:
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


def test_n_seed_logprobs_echo_stop(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=8, temperature=0, n=2)
    assert len(r.choices) == 2 and r.choices[0].text == r.choices[1].text
    a = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7)
    b = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=7)
    assert a.choices[0].text == b.choices[0].text
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5 and all(x <= 0 for x in lp.token_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(1 <= len(t) <= 4 for t in lp.top_logprobs)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=5, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPTS[0])
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0).choices[0].text
    stop = full[6:9]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == full[:full.index(stop)]


def test_many_choices(client):
    # pass@k evaluations ask for many samples of one prompt (vLLM has no bound on n): 40 seeded choices, each its own.
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, temperature=1.0, n=40, seed=3)
    assert sorted(c.index for c in r.choices) == list(range(40))
    assert len({c.text for c in r.choices}) > 1 and r.usage.completion_tokens <= 160


def test_tokenize_detokenize(server):
    t = httpx.post(server.base_url + "/tokenize", json={"model": MODEL_NAME, "prompt": "Hello world"}).json()
    assert t["count"] == len(t["tokens"]) > 0
    d = httpx.post(server.base_url + "/detokenize", json={"model": MODEL_NAME, "tokens": t["tokens"]}).json()
    assert d["prompt"] == "Hello world"


def test_logit_bias(server, client):
    """logit_bias (token id -> bias added to the logits before sampling) steers greedy decoding; -100 bans a token."""
    base = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=0)
    first = base.choices[0].logprobs.tokens[0]
    first_id = httpx.post(server.base_url + "/tokenize", json={"prompt": first}).json()["tokens"][0]
    banned = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=0,
                                       logit_bias={str(first_id): -100})
    assert banned.choices[0].logprobs.tokens[0] != first
    forced = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=3, temperature=0,
                                       logit_bias={"1000": 1e6})  # clamped to 100: still dominates
    assert forced.choices[0].text == httpx.post(server.base_url + "/detokenize", json={"tokens": [1000] * 3}).json()["prompt"]
    stream = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=3, temperature=0,
                                       logit_bias={"1000": 100}, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == forced.choices[0].text


def test_allowed_token_ids(server):
    """allowed_token_ids (vLLM) restricts sampling to the listed ids, greedy and sampled; out-of-vocabulary ids are a
    400 naming the field (bad_words: test_bad_words.py)."""
    url = server.base_url + "/v1/completions"
    allowed = {httpx.post(server.base_url + "/detokenize", json={"tokens": [t]}).json()["prompt"] for t in (1000, 2000)}
    for temperature in (0, 0.8):
        r = httpx.post(url, json={"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 6, "temperature": temperature,
                                  "seed": 3, "logprobs": 0, "allowed_token_ids": [1000, 2000]})
        assert r.status_code == 200, r.text
        tokens = r.json()["choices"][0]["logprobs"]["tokens"]
        assert len(tokens) == 6 and set(tokens) <= allowed, (tokens, allowed)
    r = httpx.post(url, json={"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 2, "allowed_token_ids": [10**9]})
    assert r.status_code == 400 and "allowed_token_ids" in r.text, r.text


def test_text_offset_is_monotonic_character_offsets(server, client):
    """text_offset counts characters of the returned text (not bytes), never goes backwards, also with echo and
    tokens that hold part of a UTF-8 character."""
    prompt = "naïve café 日本語 🙂 ok"
    for echo in (False, True):
        r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=1, echo=echo)
        text, lp = r.choices[0].text, r.choices[0].logprobs
        offs = lp.text_offset
        assert offs == sorted(offs) and offs[-1] <= len(text), (echo, offs, len(text))
        if echo:
            assert offs[0] == 0 and len(offs) > 12
        for tok, off in zip(lp.tokens, offs):
            if "\ufffd" not in tok:
                assert text[off:off + len(tok)] == tok, (tok, off, text)
    offs = []
    for c in client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=1,
                                       echo=True, stream=True):
        if c.choices and c.choices[0].logprobs:
            offs += c.choices[0].logprobs.text_offset
    assert offs == sorted(offs) and offs[0] == 0 and len(offs) > 12  # the prompt's logprobs come first


def test_echo_with_max_tokens_0_scores_the_prompt(client):
    # vLLM's prompt scoring (lm-eval-harness loglikelihood): echo + max_tokens 0 returns the prompt and its logprobs
    # only, equal to the prompt part of echo + max_tokens 1.
    one = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=1, temperature=0, echo=True, logprobs=1)
    zero = client.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=0, temperature=0, echo=True, logprobs=1)
    c0, c1 = zero.choices[0], one.choices[0]
    assert c0.text == PROMPTS[0] and c0.finish_reason == "length"
    n = len(c1.logprobs.tokens) - 1  # the prompt's tokens
    assert c0.logprobs.tokens == c1.logprobs.tokens[:n] and c0.logprobs.token_logprobs == c1.logprobs.token_logprobs[:n]
    assert c0.logprobs.token_logprobs[0] is None and c0.logprobs.text_offset == c1.logprobs.text_offset[:n]
    assert zero.usage.completion_tokens == 0 and zero.usage.prompt_tokens == n
    assert client.completions.create(model=MODEL_NAME, prompt=[PROMPTS[0], PROMPTS[1]], max_tokens=0,
                                     echo=True).choices[1].text == PROMPTS[1]
    for extra in ({}, {"stream": True}, {"min_tokens": 1}):  # needs echo, no stream, no min_tokens
        r = httpx.post(str(client.base_url) + "completions", timeout=30,
                       json={"prompt": "hi", "max_tokens": 0, "echo": "stream" in extra or "min_tokens" in extra, **extra})
        assert r.status_code == 400, r.text


def test_stream_echo_logprobs_equal_non_stream(client):
    # Streaming echo + logprobs sends the prompt's logprobs too (they were missing: only the generated tokens').
    kw = dict(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True, logprobs=2)
    ref = client.completions.create(**kw).choices[0]
    text, tokens, lps, offsets = "", [], [], []
    for ch in client.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        text += ch.choices[0].text
        if ch.choices[0].logprobs:
            tokens += ch.choices[0].logprobs.tokens
            lps += ch.choices[0].logprobs.token_logprobs
            offsets += ch.choices[0].logprobs.text_offset
    assert text == ref.text and tokens == ref.logprobs.tokens and lps == ref.logprobs.token_logprobs
    assert offsets == ref.logprobs.text_offset and lps[0] is None


def test_response_id_from_x_request_id_or_request_id(server):
    # vLLM: the response id is "cmpl-" / "chatcmpl-" + the X-Request-Id header, else the body's request_id; the same
    # id twice is fine (engine requests keep ids of their own).
    url = server.base_url
    for _ in range(2):
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers={"X-Request-Id": "abc"})
        assert r.status_code == 200 and r.json()["id"] == "cmpl-abc", r.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "request_id": "r-1"}
    r = httpx.post(url + "/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-r-1", r.text
    with httpx.stream("POST", url + "/v1/chat/completions", json={**chat, "stream": True}) as r:
        ids = {json.loads(line[6:])["id"] for line in r.iter_lines() if line.startswith("data: {")}
    assert ids == {"chatcmpl-r-1"}
    assert httpx.post(url + "/v1/completions", json={"prompt": "hi", "request_id": 5}).status_code == 400
