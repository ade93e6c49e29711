# bad_words (vLLM's) on /v1/completions and /v1/chat/completions: the banned words' tokens (as given and with a leading
# space) never appear where the unconstrained greedy output had them, the output is unchanged before that point,
# streaming equals non-streaming; bad values are a 400 naming the field.
import json

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME

PROMPT = "It is a truth universally acknowledged"
MESSAGES = [{"role": "user", "content": "Tell me of the flood."}]
# One token as given and with a leading space each (vLLM then bans both variants).
WORDS = ["am", "sure", "the"]
BANNED = {w2 for w in WORDS for w2 in (w, " " + w)}


def _tokens(server, route, **body):
    r = httpx.post(server.base_url + route, json={"model": MODEL_NAME, "max_tokens": 24, "temperature": 0, **body},
                   timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if route == "/v1/completions":
        return choice["logprobs"]["tokens"], choice["text"]
    return [t["token"] for t in choice["logprobs"]["content"]], choice["message"]["content"]


def _check_banned(before, after):
    """after holds no banned token and equals before up to before's first banned token."""
    first = next(i for i, t in enumerate(before) if t in BANNED)  # the unconstrained output has one
    assert not BANNED & set(after), after
    assert after[:first] == before[:first] and after[first] != before[first], (before, after)


def test_completions_never_generate_a_bad_word(server):
    before, _ = _tokens(server, "/v1/completions", prompt=PROMPT, logprobs=0)
    after, text = _tokens(server, "/v1/completions", prompt=PROMPT, logprobs=0, bad_words=WORDS)
    _check_banned(before, after)
    stream = httpx.post(server.base_url + "/v1/completions",
                        json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                              "bad_words": WORDS, "stream": True}, timeout=60)
    assert stream.status_code == 200
    chunks = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(c["text"] for c in map(json.loads, chunks) for c in c["choices"]) == text


def test_chat_never_generates_a_bad_word(server):
    before, _ = _tokens(server, "/v1/chat/completions", messages=MESSAGES, logprobs=True)
    after, _ = _tokens(server, "/v1/chat/completions", messages=MESSAGES, logprobs=True, bad_words=WORDS)
    _check_banned(before, after)


def test_empty_or_null_bad_words_change_nothing(server):
    before, _ = _tokens(server, "/v1/completions", prompt=PROMPT, logprobs=0)
    assert _tokens(server, "/v1/completions", prompt=PROMPT, logprobs=0, bad_words=[])[0] == before
    assert _tokens(server, "/v1/completions", prompt=PROMPT, logprobs=0, bad_words=None)[0] == before


def test_bad_values_are_a_400_naming_the_field(server):
    cases = [("room", "list of strings"), ([1], "list of strings"), ({"a": 1}, "list of strings"),
             ([""], "empty string"), ([" \t"], "at least one token"), (["w%d" % i for i in range(129)], "at most 128"),
             (["x" * 1025], "at most 1024 bytes"), ([p + " room" * 200 for p in ("", "x", "y")], "tokens after tokenization")]
    for route, body in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": MESSAGES})):
        for value, words in cases:
            r = httpx.post(server.base_url + route, json={**body, "max_tokens": 2, "bad_words": value}, timeout=30)
            assert r.status_code == 400, (route, value, r.text)
            err = r.json()["error"]
            assert err["param"] == "bad_words" and words in err["message"], (route, err)
