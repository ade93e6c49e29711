# Reasoning outputs through the `openai` client, as vLLM serves them with --reasoning-parser: a chat reply's text up to
# "</think>" is the message's `reasoning` (and the old `reasoning_content`), the rest its `content` (null when empty);
# streamed deltas carry the same parts; include_reasoning false drops the reasoning (and the logprobs); a chat template
# that closes the block (enable_thinking false) makes everything content; a JSON schema applies after the reasoning
# (the content is the JSON); tool calls are parsed from the content only; /v1/completions is not split.
#
# No bundled checkpoint has think tokens: the tests copy tiny-mamba and add "<think>" (50277) and "</think>" (50278)
# to its tokenizer (non-special added tokens, as Qwen3's) and a chat template whose generation prompt ends with
# "<think>\n" (as Qwen3.5's). The model never writes "</think>" by itself; a logit bias makes it: +100 at once, +12
# after one "\n" (greedy). Each expected split is computed from the raw text that /v1/completions returns for the same
# prompt token ids and sampling fields, so the tests check the split, not the tiny model's words. The parser itself
# (every split of streamed text, both formats, every prompt state) is unit-tested in
# tests/unit/test_server_reasoning.cpp.
import json
import shutil

import pytest

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL, MODEL_NAME, Server

THINK, END = 50277, 50278
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% if enable_thinking is defined and not enable_thinking %}"
            "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")
PLAIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")
MESSAGES = [{"role": "user", "content": "Tell me a story."}]
ENDS_NOW = {str(END): 100}   # "</think>" first
ENDS_LATER = {str(END): 12}  # "\n" first, then "</think>" (tiny-mamba, greedy)
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}]


def thinking_model(root):
    """tiny-mamba with the think tokens and TEMPLATE, under `root`."""
    d = root / "tiny-mamba-think"
    shutil.copytree(MODEL, d)
    tok = json.loads((d / "tokenizer.json").read_text())
    for i, text in ((THINK, "<think>"), (END, "</think>")):
        tok["added_tokens"].append({"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                                    "normalized": False, "special": False})
    (d / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return thinking_model(tmp_path_factory.mktemp("reasoning"))


def start(model_dir, parser):
    return Server("--reasoning-parser", parser, "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                  "--trust-request-chat-template", model=model_dir)


@pytest.fixture(scope="module")
def server(model_dir):
    s = start(model_dir, "qwen3")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def raw(server, body, **kw):
    """The unsplit text of a greedy reply to chat `body`: /v1/completions on the chat prompt's token ids."""
    ids = httpx.post(server.base_url + "/tokenize", json=body).json()["tokens"]
    r = httpx.post(server.base_url + "/v1/completions", timeout=120,
                   json={"model": MODEL_NAME, "prompt": ids, "temperature": 0, **kw}).json()
    return r["choices"][0]["text"]


def split(text, reasoning_first=True):
    """The reference split (reasoning_parser.h's rules): reasoning up to the first "</think>" (or all of it), the rest
    content, no marker in either; each None when empty."""
    if reasoning_first:
        reasoning, _, content = text.partition("</think>")
    else:
        reasoning, content = "", text
    clean = lambda s: s.replace("<think>", "").replace("</think>", "") or None  # noqa: E731
    return clean(reasoning), clean(content)


def reply(client, stream, **kw):
    """(reasoning, reasoning_content, content, tool_calls [(name, arguments)], finish_reason, logprobs seen) of a
    greedy chat reply, streamed deltas joined (None for a part never sent)."""
    kw = {"model": MODEL_NAME, "messages": MESSAGES, "temperature": 0, **kw}
    if not stream:
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        extra = m.model_extra or {}
        return (extra.get("reasoning"), extra.get("reasoning_content"), m.content, calls, r.choices[0].finish_reason,
                r.choices[0].logprobs is not None)
    parts = {"reasoning": None, "reasoning_content": None, "content": None}
    calls, finish, logprobs = [], None, False
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for k in parts:
            v = getattr(d, k, None)
            if v:
                parts[k] = (parts[k] or "") + v
        for t in d.tool_calls or []:
            if t.id:
                calls.append([t.function.name, t.function.arguments or ""])
            else:
                calls[t.index][1] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
        logprobs = logprobs or chunk.choices[0].logprobs is not None
    return (parts["reasoning"], parts["reasoning_content"], parts["content"], [tuple(c) for c in calls], finish,
            logprobs)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("bias", [None, ENDS_LATER, ENDS_NOW])
def test_reasoning_and_content(server, client, stream, bias):
    kw = {"max_tokens": 10, **({"logit_bias": bias} if bias else {})}
    text = raw(server, {"messages": MESSAGES}, **kw)
    reasoning, content = split(text)
    # The cases keep their meaning: no "</think>" at all; one after some reasoning; one first.
    if bias is None:
        assert "</think>" not in text and reasoning and content is None
    elif bias is ENDS_LATER:
        assert reasoning and content and not text.startswith("</think>"), text
    else:
        assert text.startswith("</think>") and reasoning is None, text
    got = reply(client, stream, **kw)
    assert got[:3] == (reasoning, reasoning, content)
    assert got[4] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_thinking_disabled_is_all_content(server, client, stream):
    # The template writes an empty closed block: the reply is content, as vLLM's qwen3 with enable_thinking false.
    body = {"messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}
    ids = httpx.post(server.base_url + "/tokenize", json=body).json()["tokens"]
    assert ids[::-1].index(END) < ids[::-1].index(THINK), ids[-8:]  # the last marker closes the block
    text = raw(server, body, max_tokens=8)
    assert "</think>" not in text
    got = reply(client, stream, max_tokens=8, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert got[:3] == (None, None, text)


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false(server, client, stream):
    _, content = split(raw(server, {"messages": MESSAGES}, max_tokens=10, logit_bias=ENDS_LATER))
    kw = {"max_tokens": 10, "logit_bias": ENDS_LATER, "logprobs": True, "top_logprobs": 2}
    with_it = reply(client, stream, **kw)
    assert with_it[0] and with_it[2] == content and with_it[5]
    without = reply(client, stream, extra_body={"include_reasoning": False}, **kw)
    # The reasoning is gone, the content unchanged; the logprobs are dropped too (vLLM: they would show the reasoning).
    assert without[:3] == (None, None, content) and not without[5]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("bias", [ENDS_LATER, ENDS_NOW])
def test_json_schema_applies_after_the_reasoning(server, client, stream, bias):
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
    kw = {"max_tokens": 32, "logit_bias": bias, "response_format": rf}
    extra = {"structured_outputs": {"disable_any_whitespace": True}}
    # /v1/completions holds the grammar until "</think>" too (the engine reads the prompt's open block).
    ids = httpx.post(server.base_url + "/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    text = httpx.post(server.base_url + "/v1/completions", timeout=120, json={
        "model": MODEL_NAME, "prompt": ids, "temperature": 0, **kw, **extra}).json()["choices"][0]["text"]
    reasoning, content = split(text)
    assert content and json.loads(content).keys() == {"ok", "n"}, text
    got = reply(client, stream, extra_body=extra, **kw)
    assert got[:3] == (reasoning, reasoning, content)
    assert got[4] == "stop"
    if bias is ENDS_LATER:
        assert reasoning  # the model reasoned ("\n") before the JSON


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_choice_reads_the_content(server, client, stream):
    # The forced call's arguments are decoded under its schema after the reasoning; the reasoning stays apart.
    named = {"type": "function", "function": {"name": "get_weather"}}
    got = reply(client, stream, max_tokens=16, logit_bias=ENDS_LATER, tools=TOOLS, tool_choice=named,
                extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    reasoning, _, content, calls, finish, _ = got
    assert reasoning and reasoning == got[1]
    assert len(calls) == 1 and calls[0][0] == "get_weather" and set(json.loads(calls[0][1])) == {"city"}, got
    assert not content and finish in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_calls_are_parsed_from_the_content(server, client, stream):
    # A hermes call forced after the reasoning (a choice constraint): it is a call, and neither "</think>" nor the call
    # is left in the content. Without the split, "\n</think>" would remain as content.
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    got = reply(client, stream, max_tokens=64, logit_bias=ENDS_LATER, tools=TOOLS,
                extra_body={"structured_outputs": {"choice": [call]}})
    reasoning, _, content, calls, finish, _ = got
    assert reasoning and calls == [("get_weather", '{"city": "Paris"}')] and content is None, got
    assert finish == "tool_calls"


def test_completions_are_not_split(server, client):
    r = client.completions.create(model=MODEL_NAME, prompt="assistant: <think>\n", max_tokens=6, temperature=0,
                                  logit_bias=ENDS_NOW)
    assert r.choices[0].text.startswith("</think>")
    assert "reasoning" not in (r.choices[0].model_extra or {})


@pytest.fixture(scope="module")
def r1_client(model_dir):
    import openai

    s = start(model_dir, "deepseek_r1")
    yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    assert s.stop() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_without_markers(server, client, r1_client, stream):
    # A template that writes no marker: qwen3 (as vLLM's current parser) and deepseek_r1 both start in the reasoning,
    # which the model's "</think>" ends.
    kw = {"max_tokens": 10, "logit_bias": ENDS_LATER, "extra_body": {"chat_template": PLAIN_TEMPLATE}}
    text = raw(server, {"messages": MESSAGES, "chat_template": PLAIN_TEMPLATE}, max_tokens=10, logit_bias=ENDS_LATER)
    assert "<think>" not in text.replace("</think>", ""), text
    assert "</think>" in text and not text.startswith("</think>"), text  # reasoning first, then the marker
    reasoning, content = split(text)
    assert reply(client, stream, **kw)[:3] == (reasoning, reasoning, content)
    assert reply(r1_client, stream, **kw)[:3] == (reasoning, reasoning, content)

@pytest.fixture(scope="module")
def nv3_client(model_dir):
    s = start(model_dir, "nemotron_v3")
    import openai

    yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    assert s.stop() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_nemotron_v3_thinking_off_is_content_with_any_template(server, nv3_client, stream):
    # vLLM's nemotron_v3: deepseek_r1's split, and with chat_template_kwargs enable_thinking false the reply is content
    # even when the template writes no closed block (qwen3 keeps it reasoning there: no marker in the prompt).
    kw = {"max_tokens": 8, "extra_body": {"chat_template": PLAIN_TEMPLATE,
                                          "chat_template_kwargs": {"enable_thinking": False}}}
    text = raw(server, {"messages": MESSAGES, "chat_template": PLAIN_TEMPLATE}, max_tokens=8)
    assert "</think>" not in text, text
    assert reply(nv3_client, stream, **kw)[:3] == (None, None, text)
    kw["extra_body"]["chat_template_kwargs"] = {"enable_thinking": True}
    assert reply(nv3_client, stream, **kw)[:3] == (text, text, None)


@pytest.mark.parametrize("stream", [False, True])
def test_nemotron_v3_thinking_off_constrains_from_the_first_token(nv3_client, stream):
    # The reply is content from its first token (above), so a JSON schema applies from there too, not after a
    # "</think>" the prompt never opened for (the template writes no block; deepseek_r1's replies start in reasoning).
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
    kw = {"max_tokens": 32, "response_format": rf,
          "extra_body": {"chat_template": PLAIN_TEMPLATE, "chat_template_kwargs": {"enable_thinking": False},
                         "structured_outputs": {"disable_any_whitespace": True}}}
    reasoning, _, content, _, finish, _ = reply(nv3_client, stream, **kw)
    assert reasoning is None and json.loads(content).keys() == {"ok", "n"} and finish == "stop", content
