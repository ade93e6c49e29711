# The OpenAI Responses API (POST /v1/responses, as vLLM serves it) through the `openai` client: a Response is the chat
# completion of the same conversation (instructions -> a system message, input items -> messages, max_output_tokens,
# text.format -> response_format, function tools), so each test compares it with /v1/chat/completions on the same
# request: whole (responses.create), streamed (its events in order, the deltas joined, response.completed) and through
# the SDK's stream helper; the reasoning (--reasoning-parser) becomes a reasoning item and forced tool calls
# function_call items; an earlier turn's function_call / function_call_output items reach the template as the chat's
# tool calls and tool messages; unsupported and malformed requests are 400s naming the Responses field.
import json

import pytest

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME, Server
from test_reasoning import ENDS_LATER, thinking_model

TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}]
TOOLS = [{"type": "function", "name": "get_weather", "parameters": TOOLS_CHAT[0]["function"]["parameters"]}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0, **kw)


def streamed(client, **kw):
    """(event types, the Response of response.completed, output_text deltas joined, reasoning deltas joined)."""
    types, text, reasoning, final, seq = [], "", "", None, []
    for ev in client.responses.create(model=MODEL_NAME, temperature=0, stream=True, **kw):
        types.append(ev.type)
        seq.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        elif ev.type == "response.reasoning_text.delta":
            reasoning += ev.delta
        elif ev.type == "response.completed":
            final = ev.response
    assert seq == list(range(len(seq))), "sequence numbers count from 0"
    return types, final, text, reasoning


def test_a_response_is_the_chat_completion(client):
    want = chat(client, [{"role": "user", "content": "Call me Ishmael."}], max_tokens=12)
    r = client.responses.create(model=MODEL_NAME, input="Call me Ishmael.", max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL_NAME
    assert r.output_text == want.choices[0].message.content
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"  # 12 tokens, no EOS
    assert r.usage.input_tokens == want.usage.prompt_tokens and r.usage.output_tokens == 12
    assert r.usage.total_tokens == want.usage.total_tokens and r.max_output_tokens == 12 and r.store is False
    assert r.temperature == 0 and r.tools == [] and r.tool_choice == "auto"


def test_instructions_and_input_items_are_the_messages(client):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Call me Ishmael."},
                {"role": "assistant", "content": "Some years ago."}, {"role": "user", "content": "Go on."}]
    want = chat(client, messages, max_tokens=10)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Call me Ishmael."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Some years ago."}]},
             {"role": "user", "content": "Go on."}]
    r = client.responses.create(model=MODEL_NAME, instructions="Answer briefly.", input=items, max_output_tokens=10,
                                temperature=0)
    assert r.output_text == want.choices[0].message.content and r.instructions == "Answer briefly."
    assert r.usage.input_tokens == want.usage.prompt_tokens
    # A developer message is a system one.
    dev = client.responses.create(model=MODEL_NAME, input=[{"role": "developer", "content": "Answer briefly."}] + items,
                                  max_output_tokens=10, temperature=0)
    assert dev.output_text == r.output_text and dev.usage.input_tokens == r.usage.input_tokens


def test_streamed_events_and_the_stream_helper(client):
    whole = client.responses.create(model=MODEL_NAME, input="Call me Ishmael.", max_output_tokens=12, temperature=0)
    types, final, text, _ = streamed(client, input="Call me Ishmael.", max_output_tokens=12)
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert text == whole.output_text == final.output_text and final.status == "incomplete"
    assert final.usage.output_tokens == 12 and final.usage.input_tokens == whole.usage.input_tokens
    # The same items: ids, and the message cut at max_output_tokens is incomplete in both (OpenAI's item status).
    def items(resp):  # the item ids relative to the Response's own base id
        return [(o.id.replace(resp.id[len("resp_"):], "*"), o.status) for o in resp.output]

    assert items(final) == items(whole) == [("msg_*", "incomplete")]
    with client.responses.stream(model=MODEL_NAME, input="Call me Ishmael.", max_output_tokens=12, temperature=0) as s:
        deltas = "".join(ev.delta for ev in s if ev.type == "response.output_text.delta")
        helper = s.get_final_response()
    assert deltas == helper.output_text == whole.output_text


def test_text_format_json_schema(client):
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    tight = {"structured_outputs": {"disable_any_whitespace": True}}
    r = client.responses.create(model=MODEL_NAME, input="Reply in JSON.", max_output_tokens=40, temperature=0,
                                text={"format": fmt}, extra_body=tight)
    got = json.loads(r.output_text)
    assert set(got) == {"ok", "n"} and r.text.format.type == "json_schema" and r.status == "completed"
    _, final, text, _ = streamed(client, input="Reply in JSON.", max_output_tokens=40, text={"format": fmt},
                                 extra_body=tight)
    assert text == r.output_text == final.output_text


@pytest.fixture(scope="module")
def tool_server():
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def tool_client(tool_server):
    import openai
    return openai.OpenAI(base_url=tool_server.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_calls_are_function_call_items(tool_client, choice):
    chat_choice = choice if isinstance(choice, str) else {"type": "function", "function": {"name": "get_weather"}}
    tight = {"structured_outputs": {"disable_any_whitespace": True}}
    want = chat(tool_client, [{"role": "user", "content": "Weather?"}], max_tokens=64, tools=TOOLS_CHAT,
                tool_choice=chat_choice, extra_body=tight).choices[0].message.tool_calls
    r = tool_client.responses.create(model=MODEL_NAME, input="Weather?", max_output_tokens=64, temperature=0,
                                     tools=TOOLS, tool_choice=choice, extra_body=tight)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [(w.function.name, w.function.arguments) for w in want]
    assert calls and all(c.call_id and c.status == "completed" for c in calls) and r.tools[0].name == "get_weather"
    types, final, _, _ = streamed(tool_client, input="Weather?", max_output_tokens=64, tools=TOOLS, tool_choice=choice,
                                  extra_body=tight)
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    assert [(o.name, o.arguments) for o in final.output if o.type == "function_call"] == [(c.name, c.arguments) for c in calls]
    # Item ids of the same forms streamed and whole: fc_ + the Response's base id + the call's index.
    for resp in (r, final):
        base = resp.id[len("resp_"):]
        assert [o.id for o in resp.output if o.type == "function_call"] == [f"fc_{base}_{i}" for i in range(len(calls))]


def test_function_call_history_reaches_the_template(tool_client):
    args = '{"city": "Paris"}'
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    want = chat(tool_client, history, max_tokens=8, tools=TOOLS_CHAT, tool_choice="none")
    items = [{"role": "user", "content": "Weather?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": args},
             {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
             {"type": "reasoning", "id": "rs_1", "summary": []}]  # an earlier turn's reasoning is not fed back
    r = tool_client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=8, temperature=0, tools=TOOLS,
                                     tool_choice="none")
    assert r.usage.input_tokens == want.usage.prompt_tokens and r.output_text == want.choices[0].message.content


@pytest.fixture(scope="module")
def reasoning_client(tmp_path_factory):
    import openai
    s = Server("--reasoning-parser", "qwen3", model=thinking_model(tmp_path_factory.mktemp("responses")))
    yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    assert s.stop() == 0


def test_reasoning_is_a_reasoning_item(reasoning_client):
    c = reasoning_client
    want = chat(c, [{"role": "user", "content": "Tell me a story."}], max_tokens=24, logit_bias=ENDS_LATER).choices[0].message
    reasoning = (want.model_extra or {}).get("reasoning")
    assert reasoning and want.content
    kw = dict(input="Tell me a story.", max_output_tokens=24, extra_body={"logit_bias": ENDS_LATER})
    r = c.responses.create(model=MODEL_NAME, temperature=0, **kw)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == reasoning and r.output_text == want.content
    types, final, text, rtext = streamed(c, **kw)
    assert rtext == reasoning and text == want.content and [o.type for o in final.output] == ["reasoning", "message"]
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({}, "input"),
    ({"input": 3}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "web_search_call"}]}, "input[0].type"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function", "name": ""}]}, "tools[0].name"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
    ({"input": "x", "max_output_tokens": 10 ** 6}, "max_output_tokens"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
])
def test_bad_requests_name_the_field(server, body, param):
    r = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL_NAME, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_only_post(server):
    r = httpx.get(server.base_url + "/v1/responses", timeout=10)
    assert r.status_code == 405 and "POST" in r.headers.get("allow", "")


def test_request_id_is_the_response_id(server):
    # vLLM's: the request's request_id (X-Request-Id, else the body's field) is the Response's id ("resp_" prefixed).
    body = {"model": MODEL_NAME, "input": "x", "max_output_tokens": 2}
    r = httpx.post(server.base_url + "/v1/responses", json={**body, "request_id": "abc"}, timeout=60)
    assert r.status_code == 200 and r.json()["id"] == "resp_abc", r.text
    assert r.json()["output"][0]["id"] == "msg_abc"
    r = httpx.post(server.base_url + "/v1/responses", json={**body, "request_id": "resp_xyz"}, timeout=60)
    assert r.json()["id"] == "resp_xyz", r.text
    r = httpx.post(server.base_url + "/v1/responses", json=body, headers={"X-Request-Id": "hdr"}, timeout=60)
    assert r.json()["id"] == "resp_hdr", r.text


def test_unset_sampling_fields_report_the_values_used(server):
    # vLLM's ResponsesResponse.from_request: temperature, top_p and max_output_tokens as the request ran (the server's
    # defaults when it gave none; max_output_tokens: what the context left).
    r = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL_NAME, "input": "x", "max_output_tokens": 2},
                   timeout=60).json()
    assert r["temperature"] == 1.0 and r["top_p"] == 1.0 and r["max_output_tokens"] == 2, r
    r = httpx.post(server.base_url + "/v1/responses", json={"model": MODEL_NAME, "input": "x", "temperature": 0,
                                                            "top_p": 0.5, "max_output_tokens": 2}, timeout=60).json()
    assert r["temperature"] == 0 and r["top_p"] == 0.5, r
