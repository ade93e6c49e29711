# Anthropic's Messages API (POST /v1/messages, as vLLM serves it) through the `anthropic` client: a Message is the chat
# completion of the same conversation (system -> a system message, text / tool_use / tool_result blocks -> messages,
# stop_sequences, tools with input_schema, tool_choice any / tool), so each test compares it with /v1/chat/completions
# on the same request: whole (messages.create), streamed (its events in order; the SDK's stream helper's text and final
# message), stop sequences, forced tool calls as tool_use blocks, an earlier tool turn, the reasoning as a thinking
# block; count_tokens; errors in Anthropic's body, and its x-api-key header under --api-key.
import json

import pytest

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

import anthropic  # scripts/test.sh installs it (a missing client is a failure, not a skip)

from conftest import MODEL_NAME, Server
from test_reasoning import ENDS_LATER, thinking_model

GREEDY = {"temperature": 0}  # in extra_body: the SDK's create() has no temperature keyword in every version
TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}]
TOOLS = [{"name": "get_weather", "input_schema": TOOLS_CHAT[0]["function"]["parameters"]}]
TIGHT = {"structured_outputs": {"disable_any_whitespace": True}}


def client_of(server, key="none"):
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def chat(server, messages, **kw):
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=120,
                   json={"model": MODEL_NAME, "messages": messages, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def ac(server):
    return client_of(server)


def test_a_message_is_the_chat_completion(server, ac):
    want = chat(server, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Call me Ishmael."}],
                max_tokens=12)
    m = ac.messages.create(model=MODEL_NAME, max_tokens=12, system="Be brief.", extra_body=GREEDY,
                           messages=[{"role": "user", "content": "Call me Ishmael."}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_") and m.model == MODEL_NAME
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == want["choices"][0]["message"]["content"]
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.input_tokens == want["usage"]["prompt_tokens"] and m.usage.output_tokens == 12
    # Text blocks and a system prompt as blocks: the same conversation.
    blocks = ac.messages.create(model=MODEL_NAME, max_tokens=12, system=[{"type": "text", "text": "Be brief."}],
                                extra_body=GREEDY,
                                messages=[{"role": "user", "content": [{"type": "text", "text": "Call me Ishmael."}]}])
    assert blocks.content[0].text == m.content[0].text and blocks.usage.input_tokens == m.usage.input_tokens


def test_streamed_events_and_the_stream_helper(ac):
    msgs = [{"role": "user", "content": "Call me Ishmael."}]
    whole = ac.messages.create(model=MODEL_NAME, max_tokens=12, messages=msgs, extra_body=GREEDY)
    types = [ev.type for ev in ac.messages.create(model=MODEL_NAME, max_tokens=12, messages=msgs, stream=True,
                                                   extra_body=GREEDY) if ev.type != "ping"]  # the SDK may drop pings
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(types[2:-3]) == {"content_block_delta"}
    with ac.messages.stream(model=MODEL_NAME, max_tokens=12, messages=msgs, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_count_tokens_is_the_messages_input(tool_server):
    c = client_of(tool_server)
    kw = dict(system="Be brief.", messages=[{"role": "user", "content": "Call me Ishmael."}], tools=TOOLS)
    m = c.messages.create(model=MODEL_NAME, max_tokens=2, tool_choice={"type": "none"}, extra_body=GREEDY, **kw)
    assert c.messages.count_tokens(model=MODEL_NAME, **kw).input_tokens == m.usage.input_tokens
    assert c.messages.count_tokens(model=MODEL_NAME, messages=kw["messages"]).input_tokens < m.usage.input_tokens
    r = httpx.post(tool_server.base_url + "/v1/messages/count_tokens", json={"model": MODEL_NAME, "messages": 3})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences(server, ac, stream):
    msgs = [{"role": "user", "content": "Call me Ishmael."}]
    text = ac.messages.create(model=MODEL_NAME, max_tokens=12, messages=msgs, extra_body=GREEDY).content[0].text
    stop = text.split()[2]  # a word the reply writes
    if stream:
        with ac.messages.stream(model=MODEL_NAME, max_tokens=12, messages=msgs, stop_sequences=[stop],
                                extra_body=GREEDY) as s:
            m = s.get_final_message()
    else:
        m = ac.messages.create(model=MODEL_NAME, max_tokens=12, messages=msgs, stop_sequences=[stop], extra_body=GREEDY)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == chat(server, msgs, max_tokens=12, stop=[stop])["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def tool_server():
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_calls_are_tool_use_blocks(tool_server, choice):
    c = client_of(tool_server)
    chat_choice = "required" if choice["type"] == "any" else {"type": "function", "function": {"name": "get_weather"}}
    msgs = [{"role": "user", "content": "Weather?"}]
    want = chat(tool_server, msgs, max_tokens=64, tools=TOOLS_CHAT, tool_choice=chat_choice, **TIGHT)
    want_calls = [(t["function"]["name"], json.loads(t["function"]["arguments"]))
                  for t in want["choices"][0]["message"]["tool_calls"]]
    m = c.messages.create(model=MODEL_NAME, max_tokens=64, messages=msgs, tools=TOOLS, tool_choice=choice,
                          extra_body={**GREEDY, **TIGHT})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert want_calls and [(u.name, u.input) for u in uses] == want_calls and all(u.id for u in uses)
    # A reply with tool_use blocks stops as "tool_use" (Anthropic's: the model invoked tools), also when the chat's
    # named call finishes as "stop".
    stop = {"tool_calls": "tool_use", "stop": "tool_use", "length": "max_tokens"}[want["choices"][0]["finish_reason"]]
    assert m.stop_reason == stop
    with c.messages.stream(model=MODEL_NAME, max_tokens=64, messages=msgs, tools=TOOLS, tool_choice=choice,
                           extra_body={**GREEDY, **TIGHT}) as s:
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == want_calls
    assert final.stop_reason == stop


def test_tool_history_reaches_the_template(tool_server):
    c = client_of(tool_server)
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
               {"role": "user", "content": "And tomorrow?"}]
    want = chat(tool_server, history, max_tokens=8, tools=TOOLS_CHAT, tool_choice="none")
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "dropped", "signature": ""},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                         {"type": "text", "text": "And tomorrow?"}]}]
    m = c.messages.create(model=MODEL_NAME, max_tokens=8, messages=msgs, tools=TOOLS, tool_choice={"type": "none"},
                          extra_body=GREEDY)
    assert m.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert m.content[0].text == want["choices"][0]["message"]["content"]


def test_reasoning_is_a_thinking_block(tmp_path_factory):
    s = Server("--reasoning-parser", "qwen3", model=thinking_model(tmp_path_factory.mktemp("messages")))
    try:
        c = client_of(s)
        msgs = [{"role": "user", "content": "Tell me a story."}]
        want = chat(s, msgs, max_tokens=24, logit_bias=ENDS_LATER)["choices"][0]["message"]
        assert want["reasoning"] and want["content"]
        extra = {**GREEDY, "logit_bias": ENDS_LATER}
        m = c.messages.create(model=MODEL_NAME, max_tokens=24, messages=msgs, extra_body=extra)
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == want["reasoning"] and m.content[1].text == want["content"]
        with c.messages.stream(model=MODEL_NAME, max_tokens=24, messages=msgs, extra_body=extra) as st:
            final = st.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"]
        assert final.content[0].thinking == want["reasoning"] and final.content[1].text == want["content"]
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("body,needle", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens is required"),
    ({"max_tokens": 4}, "messages must be"),
    ({"max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305",
                                                                                 "name": "web_search"}]}, "tools[0].type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": []}]}, "messages[0].content must hold at least one"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": ""}]},
     "tools[0].name must not be empty"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}},
     "tool_choice.type"),
    ({"max_tokens": 10 ** 6, "messages": [{"role": "user", "content": "x"}]}, "maximum context length"),
])
def test_errors_are_anthropic_bodies(server, body, needle):
    r = httpx.post(server.base_url + "/v1/messages", json={"model": MODEL_NAME, **body}, timeout=60)
    assert r.status_code == 400, r.text
    j = r.json()
    assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error" and needle in j["error"]["message"], j


def test_x_api_key():
    s = Server("--api-key", "sekret")
    try:
        ok = client_of(s, "sekret").messages.create(model=MODEL_NAME, max_tokens=2,
                                                    messages=[{"role": "user", "content": "x"}])
        assert ok.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError):
            client_of(s, "wrong").messages.create(model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "x"}])
    finally:
        assert s.stop() == 0


def test_prefill_continues_the_final_assistant_message(server, ac):
    # Anthropic's prefill: a final assistant message is the start of the reply (the chat's continue_final_message);
    # an empty one is no prefill, and an empty system prompt adds no turn.
    msgs = [{"role": "user", "content": "Call me Ishmael."}, {"role": "assistant", "content": "Some years"}]
    want = chat(server, msgs, max_tokens=8, continue_final_message=True, add_generation_prompt=False)
    m = ac.messages.create(model=MODEL_NAME, max_tokens=8, messages=msgs, extra_body=GREEDY)
    assert m.content[0].text == want["choices"][0]["message"]["content"]
    assert m.usage.input_tokens == want["usage"]["prompt_tokens"]
    plain = ac.messages.create(model=MODEL_NAME, max_tokens=8, messages=msgs[:1], extra_body=GREEDY)
    empty = ac.messages.create(model=MODEL_NAME, max_tokens=8, system="", extra_body=GREEDY,
                               messages=msgs[:1] + [{"role": "assistant", "content": ""}])
    assert (empty.content[0].text, empty.usage.input_tokens) == (plain.content[0].text, plain.usage.input_tokens)
    assert m.usage.input_tokens > plain.usage.input_tokens


def test_usage_in_message_start_and_cached_tokens(server, ac):
    # message_start carries the prompt's tokens (as Anthropic's); input_tokens excludes the tokens read from the prefix
    # cache, so input + cache_read is the prompt (Anthropic's total), a cache hit the second time.
    msgs = [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))}]
    first = ac.messages.create(model=MODEL_NAME, max_tokens=2, messages=msgs, extra_body=GREEDY)
    start = next(ev for ev in ac.messages.create(model=MODEL_NAME, max_tokens=2, messages=msgs, stream=True,
                                                 extra_body=GREEDY) if ev.type == "message_start")
    u = start.message.usage
    assert u.input_tokens + (u.cache_read_input_tokens or 0) == first.usage.input_tokens > 0
    again = ac.messages.create(model=MODEL_NAME, max_tokens=2, messages=msgs, extra_body=GREEDY)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == first.usage.input_tokens


def test_output_config_format_is_structured_output(ac):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    m = ac.messages.create(model=MODEL_NAME, max_tokens=20, messages=[{"role": "user", "content": "JSON please"}],
                           extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema", "schema": schema}},
                                       "structured_outputs": {"disable_any_whitespace": True}})
    assert set(json.loads(m.content[0].text)) == {"ok"}, m.content[0].text
    r = httpx.post(ac.base_url.__str__().rstrip("/") + "/v1/messages", json={
        "model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
        "output_config": {"format": {"type": "yaml"}}}, timeout=60)
    assert r.status_code == 400 and "output_config.format.type" in r.json()["error"]["message"], r.text
