# Structured outputs through the `openai` client, as vLLM serves them: response_format json_schema / json_object, the
# extra body's structured_outputs (choice, regex, grammar, json) and the legacy guided_* fields, on /v1/completions and
# /v1/chat/completions, streamed and not; forced tool choices ("required", a named function) returned as tool_calls
# (no tool-parser flags needed); bad constraints as 400s (the server's checks, and the engine's compile errors);
# logprobs under a constraint finite (masked tokens clamped to -9999.0, as vLLM). The mapping itself is unit-tested
# in tests/unit/test_server_structured_outputs.cpp.
import json
import math
import re

import openai
import pytest

try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx

from conftest import MODEL_NAME

# Small schemas (strings with maxLength) so the tiny model finishes; compact JSON (only the ", " and ": " separators;
# xgrammar's default allows any whitespace, which the tiny model fills with newlines).
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"]}
NO_WS = {"disable_any_whitespace": True}
MESSAGES = [{"role": "user", "content": "Describe yourself as JSON."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}}, "required": ["zone"]}}}]


def chat(client, stream, **kw):
    """(content, finish_reason) of one chat choice, greedy, streamed or not."""
    kw = {"model": MODEL_NAME, "messages": MESSAGES, "temperature": 0, **kw}
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def complete(client, stream, **kw):
    """(text, finish_reason) of one completion, greedy, streamed or not."""
    kw = {"model": MODEL_NAME, "prompt": "Answer:", "temperature": 0, **kw}
    if not stream:
        r = client.completions.create(**kw)
        return r.choices[0].text, r.choices[0].finish_reason
    text, finish = "", None
    for chunk in client.completions.create(stream=True, **kw):
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def check_schema_output(text, finish):
    assert finish == "stop", text
    obj = json.loads(text)
    assert set(SCHEMA["required"]) <= obj.keys()
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 6 and isinstance(obj["ok"], bool)


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema(client, stream):
    rf = {"type": "json_schema", "json_schema": {"name": "who", "schema": SCHEMA, "strict": True}}
    # structured_outputs options without a constraint add to the constraint response_format sets.
    check_schema_output(*chat(client, stream, max_tokens=64, response_format=rf, extra_body={"structured_outputs": NO_WS}))
    check_schema_output(*complete(client, stream, max_tokens=64,
                                  extra_body={"response_format": rf, "structured_outputs": NO_WS}))
    # The same schema through structured_outputs.json (as text) and the legacy guided_json (with vLLM 0.8's whitespace
    # option of guided_decoding_backend).
    check_schema_output(*chat(client, stream, max_tokens=64,
                              extra_body={"structured_outputs": {"json": json.dumps(SCHEMA), **NO_WS}}))
    check_schema_output(*complete(client, stream, max_tokens=64, extra_body={
        "guided_json": SCHEMA, "guided_decoding_backend": "xgrammar:disable-any-whitespace"}))


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_object(client, stream):
    # Any JSON object (the engine compiles {"type": "object"}, as vLLM); the tiny model's strings can run past
    # max_tokens, so the text is an object's beginning, and a whole object when it stopped.
    for text, finish in (chat(client, stream, max_tokens=48, response_format={"type": "json_object"},
                              extra_body={"structured_outputs": NO_WS}),
                         complete(client, stream, max_tokens=48,
                                  extra_body={"response_format": {"type": "json_object"}, "structured_outputs": NO_WS})):
        assert text.startswith("{"), text
        if finish == "stop":
            assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_choice_regex_and_grammar(client, stream):
    choices = ["yes", "no", "maybe"]
    for run in (chat, complete):
        text, finish = run(client, stream, max_tokens=8, extra_body={"structured_outputs": {"choice": choices}})
        assert text in choices and finish == "stop"
        text, finish = run(client, stream, max_tokens=8, extra_body={"guided_choice": choices})
        assert text in choices and finish == "stop"
        text, finish = run(client, stream, max_tokens=12, extra_body={"structured_outputs": {"regex": "[a-z]{3,8}"}})
        assert re.fullmatch("[a-z]{3,8}", text) and finish == "stop", text
        text, finish = run(client, stream, max_tokens=12,
                           extra_body={"structured_outputs": {"grammar": 'root ::= "red" | "green" | "blue"'}})
        assert text in ("red", "green", "blue") and finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_the_eos_ending_a_constraint_is_a_stop_token(client, stream):
    # With skip_special_tokens false the EOS that completed the grammar stays out of the text (a new-user test found
    # "abc<|endoftext|>"), as an ordinary EOS stop; include_stop_str_in_output keeps it, as vLLM.
    for include, want in ((False, "abc"), (True, "abc<|endoftext|>")):
        for run in (chat, complete):
            text, finish = run(client, stream, max_tokens=8,
                               extra_body={"structured_outputs": {"regex": "abc"}, "skip_special_tokens": False,
                                           "include_stop_str_in_output": include})
            assert text == want and finish == "stop", (run.__name__, include, text)


def test_sampled_choices_and_n(client):
    # Every sampled choice of n follows the constraint.
    r = client.completions.create(model=MODEL_NAME, prompt=["Pick:", "Choose one:"], n=3, max_tokens=8, temperature=1.0,
                                  seed=3, extra_body={"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}})
    assert len(r.choices) == 6
    assert all(c.text in ("alpha", "beta", "gamma") and c.finish_reason == "stop" for c in r.choices)


def test_logprobs_under_a_constraint_are_finite(client):
    # After "yes" / "no" only EOS is allowed: the other top tokens are masked (-inf), written as -9999.0 (vLLM).
    extra = {"structured_outputs": {"choice": ["yes", "no"]}}
    r = client.completions.create(model=MODEL_NAME, prompt="Answer:", max_tokens=8, temperature=0, logprobs=5,
                                  extra_body=extra)
    lp = r.choices[0].logprobs
    values = lp.token_logprobs + [v for top in lp.top_logprobs for v in top.values()]
    assert all(isinstance(v, float) and math.isfinite(v) for v in values)
    assert min(values) == -9999.0
    for stream in (False, True):
        kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5,
                  extra_body=extra)
        if stream:
            content = [t for c in client.chat.completions.create(stream=True, **kw) if c.choices and c.choices[0].logprobs
                       for t in c.choices[0].logprobs.content]
        else:
            content = client.chat.completions.create(**kw).choices[0].logprobs.content
        values = [t.logprob for t in content] + [t2.logprob for t in content for t2 in t.top_logprobs]
        assert values and all(math.isfinite(v) for v in values) and min(values) == -9999.0


def merged_calls(client, stream, **kw):
    """(tool_calls as [(name, arguments)], content, finish_reason) of a chat reply, deltas merged by index."""
    kw = {"model": MODEL_NAME, "messages": MESSAGES, "tools": TOOLS, "temperature": 0,
          "extra_body": {"structured_outputs": NO_WS}, **kw}
    if not stream:
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        assert all(c.type == "function" and c.id for c in m.tool_calls)
        return [(c.function.name, c.function.arguments) for c in m.tool_calls], m.content, r.choices[0].finish_reason
    calls, content, finish = [], "", None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for t in d.tool_calls or []:
            if t.id:
                assert t.index == len(calls) and t.type == "function"
                calls.append([t.function.name, t.function.arguments or ""])
            else:
                calls[t.index][1] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [tuple(c) for c in calls], content, finish


def test_named_tool_choice(client):
    # The whole output is the named function's arguments (its parameters schema); finish_reason "stop" (vLLM).
    named = {"type": "function", "function": {"name": "get_time"}}
    whole = merged_calls(client, False, tool_choice=named, max_tokens=32)
    assert whole == merged_calls(client, True, tool_choice=named, max_tokens=32)
    calls, content, finish = whole
    assert len(calls) == 1 and calls[0][0] == "get_time" and json.loads(calls[0][1])["zone"] in ("utc", "cet")
    assert content == "" and finish == "stop"


def test_required_tool_choice(client):
    # A JSON list of {name, parameters}, each one call (arguments as json.dumps writes them); whole and streamed agree,
    # also when max_tokens cuts the list (then the finish reason stays "length").
    whole = merged_calls(client, False, tool_choice="required", max_tokens=80)
    assert whole == merged_calls(client, True, tool_choice="required", max_tokens=80)
    calls, content, finish = whole
    assert calls and content == "" and finish in ("tool_calls", "length")
    for name, arguments in calls:
        args = json.loads(arguments)
        assert (name, list(args)) in (("get_weather", ["city"]), ("get_time", ["zone"]))


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex"),
    ({"structured_outputs": {"disable_any_whitespace": True}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_whitespace_pattern": " ", "guided_json": SCHEMA}, "guided_whitespace_pattern"),
])
def test_bad_constraints_name_the_field(client, extra, param):
    for call in (lambda: client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, extra_body=extra),
                 lambda: client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=4, extra_body=extra)):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


BROKEN_TOOLS = TOOLS + [{"type": "function", "function": {"name": "broken", "parameters": {"type": "foo"}}}]


@pytest.mark.parametrize("extra,param", [
    ({"structured_outputs": {"json": {"type": "foo"}}}, "structured_outputs.json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
    ({"guided_regex": "("}, "guided_regex"),
    ({"guided_json": {"type": "foo"}}, "guided_json"),
    ({"guided_grammar": "root ::= nope"}, "guided_grammar"),
    ({"tools": BROKEN_TOOLS, "tool_choice": "required"}, "tools[2].function.parameters"),
    ({"tools": BROKEN_TOOLS, "tool_choice": {"type": "function", "function": {"name": "broken"}}},
     "tools[2].function.parameters"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_constraints_the_engine_cannot_compile_are_400s(server, client, extra, param, stream):
    # The server checks the constraint as the engine would (xgrammar's conversion) before submitting it; its error
    # answers the whole group (n = 3) with a 400 whose param and message name the field the client used (not the
    # engine's structured_outputs.<kind>), streamed or not, and the server keeps serving.
    with pytest.raises(openai.BadRequestError) as e:
        r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, n=3, stream=stream,
                                           extra_body=extra)
        if stream:
            list(r)
    body = e.value.body
    assert e.value.status_code == 400 and body["message"].startswith(param + " is not a valid or supported"), body
    assert body["param"] == ("tools" if param.startswith("tools[") else param), body
    text, finish = chat(client, False, max_tokens=4, extra_body={"structured_outputs": {"choice": ["ok"]}})
    assert text == "ok"
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_required_tool_choice_cut_before_a_call_has_empty_content(client):
    # max_tokens ends the list before its first item is complete: no calls, content "" (never the partial JSON),
    # finish_reason "length"; whole and streamed agree.
    whole = merged_calls(client, False, tool_choice="required", max_tokens=3)
    assert whole == merged_calls(client, True, tool_choice="required", max_tokens=3)
    assert whole == ([], "", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call(client, stream):
    # vLLM's maybe_filter_parallel_tool_calls: tool_calls[:1] (greedy, so the same output as with parallel calls).
    calls, content, finish = merged_calls(client, stream, tool_choice="required", max_tokens=160)
    assert len(calls) >= 2  # the tiny model repeats its call until max_tokens
    one = merged_calls(client, stream, tool_choice="required", max_tokens=160, parallel_tool_calls=False)
    assert one == (calls[:1], content, finish)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, max_tokens=4,
                                       extra_body={"parallel_tool_calls": "never"})  # "no" is false (lax mode)
    assert e.value.body["param"] == "parallel_tool_calls", e.value.body
