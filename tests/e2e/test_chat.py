# /v1/chat/completions through the `openai` client: the plain default template (the bundled model has none), greedy
# output equal to a completion of the rendered prompt, streaming equal to non-streaming.
import json
import subprocess

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import BINARY, MODEL, MODEL_NAME, Server

MESSAGES = [{"role": "system", "content": "You are a scribe."}, {"role": "user", "content": "Tell me of the flood."}]
RENDERED = "System: You are a scribe.\nUser: Tell me of the flood.\nAssistant:"


def test_default_template_rendering(server):
    t = httpx.post(server.base_url + "/tokenize", json={"messages": MESSAGES}).json()
    d = httpx.post(server.base_url + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert d["prompt"] == RENDERED


def _render(server, **kw):
    r = httpx.post(server.base_url + "/tokenize", json=kw)
    if r.status_code != 200:
        return r
    return httpx.post(server.base_url + "/detokenize", json={"tokens": r.json()["tokens"]}).json()["prompt"]


def test_continue_final_message(server):
    # vLLM's continue_final_message: the prompt ends inside the final (assistant) message; with add_generation_prompt
    # true (its default) it is a 400, as transformers raises.
    prefill = MESSAGES + [{"role": "assistant", "content": "In the days of"}]
    assert _render(server, messages=prefill, continue_final_message=True, add_generation_prompt=False) == \
        RENDERED[: -len("Assistant:")] + "Assistant: In the days of"
    for agp in ({}, {"add_generation_prompt": True}):
        bad = _render(server, messages=prefill, continue_final_message=True, **agp)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "continue_final_message"
    r = httpx.post(server.base_url + "/v1/chat/completions",
                   json={"messages": prefill, "continue_final_message": True, "add_generation_prompt": False,
                         "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_echo(server):
    # vLLM's chat echo: the last message's content starts each choice's message when that message is the assistant's
    # (non-streaming: prepended; streaming: a chunk of its own after the role chunk); nothing for another role.
    prefill = MESSAGES + [{"role": "assistant", "content": "In the days of"}]
    body = {"messages": prefill, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 4,
            "temperature": 0, "n": 2}
    plain = httpx.post(server.base_url + "/v1/chat/completions", json=body).json()
    echoed = httpx.post(server.base_url + "/v1/chat/completions", json=dict(body, echo=True)).json()
    for p, e in zip(plain["choices"], echoed["choices"]):
        assert e["message"]["content"] == "In the days of" + p["message"]["content"]
    with httpx.stream("POST", server.base_url + "/v1/chat/completions",
                      json=dict(body, echo=True, stream=True, n=1)) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0].get("role") == "assistant" and deltas[1] == {"content": "In the days of"}
    assert "".join(d.get("content") or "" for d in deltas) == echoed["choices"][0]["message"]["content"]
    user_last = httpx.post(server.base_url + "/v1/chat/completions",
                           json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "echo": True}).json()
    again = httpx.post(server.base_url + "/v1/chat/completions",
                       json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0}).json()
    assert user_last["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
    bad = httpx.post(server.base_url + "/v1/chat/completions", json=dict(body, echo="maybe"))  # "yes" is true (pydantic lax mode)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "echo"


def test_request_chat_template_needs_trust(server):
    # vLLM's per-request chat_template: a 400 unless the server runs with --trust-request-chat-template; then it
    # replaces the server's template (with the checkpoint's bos_token).
    tmpl = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"
    bad = _render(server, messages=MESSAGES, chat_template=tmpl)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template"
    s = Server("--trust-request-chat-template")
    try:
        assert _render(s, messages=MESSAGES, chat_template=tmpl) == \
            "<|endoftext|>[system] You are a scribe. [user] Tell me of the flood. "
        assert _render(s, messages=MESSAGES, chat_template="{% if %}").status_code == 400
    finally:
        s.stop()


def test_chat_template_kwargs_and_documents_reach_the_template():
    # vLLM's chat_template_kwargs (e.g. enable_thinking) and documents are template variables; wrong types are 400s.
    tmpl = ("{% if enable_thinking %}<think>{% endif %}{% for d in documents or [] %}[{{ d.title }}]{% endfor %}"
            "{% for m in messages %}{{ m.content }}{% endfor %}")
    s = Server("--trust-request-chat-template")
    try:
        base = dict(messages=MESSAGES, chat_template=tmpl)
        assert _render(s, **base) == "You are a scribe.Tell me of the flood."
        assert _render(s, **base, chat_template_kwargs={"enable_thinking": True}).startswith("<think>You are")
        assert _render(s, **base, documents=[{"title": "Genesis"}]).startswith("[Genesis]You are")
        bad = _render(s, **base, chat_template_kwargs=["enable_thinking"])
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs"
        bad = _render(s, **base, documents="Genesis")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents"
    finally:
        s.stop()


def test_reasoning_effort_reaches_the_template():
    # vLLM's reasoning_effort: a template variable over chat_template_kwargs' own, with enable_thinking = (effort !=
    # "none") unless chat_template_kwargs sets it; other values are a 400.
    tmpl = "RE={{ reasoning_effort | default('unset') }} ET={{ enable_thinking | default('unset') }}"
    s = Server("--trust-request-chat-template")
    try:
        base = dict(messages=MESSAGES, chat_template=tmpl)
        assert _render(s, **base) == "RE=unset ET=unset"
        assert _render(s, **base, reasoning_effort="high") == "RE=high ET=True"
        assert _render(s, **base, reasoning_effort="none") == "RE=none ET=False"
        assert _render(s, **base, reasoning_effort="low",
                       chat_template_kwargs={"enable_thinking": False, "reasoning_effort": "max"}) == "RE=low ET=False"
        assert _render(s, **base, reasoning_effort=None) == "RE=unset ET=unset"
        for bad in ("extreme", 3):
            r = _render(s, **base, reasoning_effort=bad)
            assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", bad
    finally:
        s.stop()


def test_chat_equals_completion_of_rendered_prompt(client):
    ref = client.completions.create(model=MODEL_NAME, prompt=RENDERED, max_tokens=20, temperature=0)
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.choices[0].text
    assert r.object == "chat.completion" and r.usage.completion_tokens == ref.usage.completion_tokens


def test_chat_stream(client):
    ref = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == ref.usage.completion_tokens


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)


def test_chat_template_comes_from_the_tokenizer_folder(tmp_path):
    # `--tokenizer DIR`: DIR's tokenizer_config.json chat template is used (it was read from the model folder).
    import json
    from conftest import MODEL, Server

    (tmp_path / "tokenizer.json").symlink_to(MODEL / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"}))
    s = Server("--tokenizer", tmp_path)
    try:
        t = httpx.post(s.base_url + "/tokenize", json={"messages": MESSAGES}).json()
        d = httpx.post(s.base_url + "/detokenize", json={"tokens": t["tokens"]}).json()
        assert d["prompt"] == "<system>You are a scribe.<user>Tell me of the flood."
    finally:
        s.stop()


def test_chat_template_content_format():
    # vLLM's --chat-template-content-format: "auto" gives a template that loops over a message's content the OpenAI
    # list of text parts (a string content too), else the parts joined with newlines; string / openai force it.
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
             {"role": "assistant", "content": "c"}]
    looping = ("{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}L:"
               "{% for p in m.content %}{{ p.text }};{% endfor %}{% endif %}|{% endfor %}")
    reading = "{% for m in messages %}{{ m.content }}|{% endfor %}"
    want = {("auto", looping): "L:a;b;|L:c;|", ("auto", reading): "a\nb|c|",
            ("string", looping): "S:a\nb|S:c|", ("openai", looping): "L:a;b;|L:c;|"}
    for fmt in ("auto", "string", "openai"):
        s = Server("--trust-request-chat-template", "--chat-template-content-format", fmt)
        try:
            for tmpl in (looping, reading):
                if (fmt, tmpl) in want:
                    assert _render(s, messages=parts, chat_template=tmpl) == want[(fmt, tmpl)], (fmt, tmpl)
            if fmt == "auto":  # the chat echo repeats the final message's text parts joined
                prefill = [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]
                r = httpx.post(s.base_url + "/v1/chat/completions",
                               json={"messages": prefill, "echo": True, "max_tokens": 2, "add_generation_prompt": False,
                                     "continue_final_message": True})
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("x\ny"), r.text
            # Content parts must be text.
            bad = _render(s, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
        finally:
            s.stop()
    r = subprocess.run([BINARY, "serve", "--model", MODEL, "--chat-template-content-format", "parts"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--chat-template-content-format" in r.stderr, r.stderr


def test_default_chat_template_kwargs():
    # vLLM's --default-chat-template-kwargs: every chat request's template variables unless its own set them;
    # reasoning_effort's enable_thinking overrides the default as a request's own would.
    tmpl = "ET={{ enable_thinking | default('unset') }} X={{ x | default('unset') }}"
    s = Server("--trust-request-chat-template", "--default-chat-template-kwargs", '{"enable_thinking": false, "x": 1}')
    try:
        base = dict(messages=MESSAGES, chat_template=tmpl)
        assert _render(s, **base) == "ET=False X=1"
        assert _render(s, **base, chat_template_kwargs={"x": 2}) == "ET=False X=2"
        assert _render(s, **base, reasoning_effort="high") == "ET=True X=1"
    finally:
        s.stop()
    r = subprocess.run([BINARY, "serve", "--model", MODEL, "--default-chat-template-kwargs", "[1]"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--default-chat-template-kwargs" in r.stderr, r.stderr


def test_other_text_parts(server):
    # vLLM reads plain strings, input_text / output_text, refusal and thinking parts as text too.
    parts = ["a", {"type": "input_text", "text": "b"}, {"type": "refusal", "refusal": "c"}]
    assert _render(server, messages=[{"role": "user", "content": parts}]) == "User: a\nb\nc\nAssistant:"
    bad = _render(server, messages=[{"role": "user", "content": [{"type": "refusal", "text": "c"}]}])
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
