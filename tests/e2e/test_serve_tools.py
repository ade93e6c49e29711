# Tools on /v1/chat/completions (issue 32), as vLLM: `tools` reach the chat template (also with tool_choice
# "none"); tool_choice "auto" (the default with tools) needs --enable-auto-tool-choice and --tool-call-parser, and
# then the response carries `tool_calls` (a list); "required" and named choices are decoded under a JSON schema
# (tests/e2e/test_structured_outputs.py), a named tool that is not among the tools is a 400 naming tool_choice;
# assistant tool-call arguments reach the template as objects; qwen3_coder (Qwen3.5's XML calls) serves as hermes does. The parsers themselves (calls found in whole and streamed outputs) are checked in
# tests/unit/test_server_tool_calls.cpp: tiny-mamba writes no calls.
import json
import subprocess

import pytest

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import BINARY, MODEL, MODEL_NAME, ROOT, Server

QWEN_TEMPLATE = ROOT / "tests" / "data" / "tokenizers" / "chat" / "qwen3.jinja"
QWEN3_5_TEMPLATE = ROOT / "tests" / "data" / "tokenizers" / "chat" / "qwen3_5.jinja"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server():
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", QWEN_TEMPLATE)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tool_client(tool_server):
    import openai

    return openai.OpenAI(base_url=tool_server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def rendered(server, body):
    """The chat prompt the server renders for `body` (via /tokenize and /detokenize)."""
    ids = httpx.post(server.base_url + "/tokenize", json=body).json()["tokens"]
    return httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"]


def test_auto_tool_calls_with_the_openai_client(tool_server, tool_client):
    # Without a call in the output: the text is the content, tool_calls is an empty list (vLLM's shape).
    r = tool_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=12,
                                            temperature=0, seed=1)
    m = r.choices[0].message
    assert r.choices[0].finish_reason in ("length", "stop")
    assert m.tool_calls == [] and isinstance(m.content, str) and m.content
    # Streaming gives the same content (text that could start a tag is held back, then sent).
    text = ""
    finish = None
    for chunk in tool_client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=12,
                                                     temperature=0, seed=1, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            assert not chunk.choices[0].delta.tool_calls
            finish = chunk.choices[0].finish_reason or finish
    assert text == m.content and finish == r.choices[0].finish_reason
    # The tools reached the template.
    prompt = rendered(tool_server, {"messages": MESSAGES, "tools": TOOLS})
    assert "<tools>" in prompt and '"get_weather"' in prompt
    assert "<tools>" not in rendered(tool_server, {"messages": MESSAGES})


def test_tool_history_reaches_the_template(tool_server, tool_client):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    prompt = rendered(tool_server, {"messages": history, "tools": TOOLS})
    # Arguments are an object for the template (Qwen's writes them with tojson), not a doubly-encoded string.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    r = tool_client.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS, max_tokens=4)
    assert r.choices[0].message.tool_calls == []
    bad = [dict(history[1], tool_calls=[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}])]
    r = httpx.post(tool_server.base_url + "/v1/chat/completions", json={"messages": MESSAGES + bad, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


@pytest.mark.parametrize("extra,param,needle", [
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "does not match"),
    ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice", "Invalid `name`"),
    ({"tool_choice": "sometimes"}, "tool_choice", "Invalid value for `tool_choice`"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0]"),
    ({"tools": {"name": "f"}}, "tools", "must be a list"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools", "parameters"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools", "tools[0].function.name must not be empty"),
])
def test_bad_tool_choices_are_400s(tool_server, extra, param, needle):
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 2, **extra}
    r = httpx.post(tool_server.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and needle in r.json()["error"]["message"]


def test_without_the_flags_auto_is_refused_and_none_renders_the_tools():
    s = Server("--chat-template", QWEN_TEMPLATE)
    try:
        for body, param in [({"tools": TOOLS}, "tools"), ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice")]:
            r = httpx.post(s.base_url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **body})
            assert r.status_code == 400 and r.json()["error"]["param"] == param
            assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
        r = httpx.post(s.base_url + "/v1/chat/completions",
                       json={"messages": MESSAGES, "max_tokens": 2, "tools": TOOLS, "tool_choice": "none"})
        assert r.status_code == 200 and "tool_calls" not in r.json()["choices"][0]["message"]
        assert '"get_weather"' in rendered(s, {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"})
        r = httpx.post(s.base_url + "/v1/chat/completions", json={"messages": MESSAGES, "tool_choice": "auto"})
        assert r.status_code == 400 and "`tools` must be set" in r.json()["error"]["message"]
    finally:
        s.stop()


@pytest.mark.parametrize("parser", ["qwen3_coder", "qwen3_xml"])
def test_qwen3_coder_parser_with_the_qwen3_5_template(parser):
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", parser, "--chat-template", QWEN3_5_TEMPLATE)
    try:
        import openai

        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
        r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=tools, max_tokens=12,
                                           temperature=0, seed=1)
        m = r.choices[0].message
        assert m.tool_calls == [] and isinstance(m.content, str) and m.content
        text = ""
        for chunk in client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=tools, max_tokens=12,
                                                    temperature=0, seed=1, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                assert not chunk.choices[0].delta.tool_calls
        assert text == m.content
        # The template writes past calls in the XML form the parser reads (arguments as objects).
        history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
        prompt = rendered(s, {"messages": history, "tools": tools})
        assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" in prompt
        assert "<function=example_function_name>" in prompt  # the format the model is told to write
    finally:
        s.stop()


@pytest.mark.parametrize("flags,needle", [
    (["--tool-call-parser", "nope"], "unknown tool-call parser"),
    (["--enable-auto-tool-choice"], "--tool-call-parser"),
])
def test_bad_tool_flags_exit_1(flags, needle):
    p = subprocess.run([str(BINARY), "serve", "--model", str(MODEL), "--port", "0", *flags], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and needle in p.stderr, p.stderr
