# Every bad request gets the right status and an OpenAI error body, and the server keeps serving.
try:
    import httpx
except ImportError:  # openai >= 3 depends on the httpx2 fork
    import httpx2 as httpx
import pytest

from conftest import MODEL_NAME

BAD = [
    # (raw body or JSON, status, param)
    (b"{not json", 400, None),
    (b'{"prompt": "\xff\xfe bad utf-8", "max_tokens": 4}', 400, None),
    (b"[1, 2]", 400, None),
    ({"prompt": 12}, 400, "prompt"),
    ({"prompt": "hi", "max_tokens": "8x"}, 400, "max_tokens"),  # "8" is 8 (pydantic's lax mode)
    ({"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 10 ** 9}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 10 ** 30}, 400, "max_tokens"),
    ({"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "hi", "n": 0}, 400, "n"),
    ({"prompt": "hi", "n": 1025}, 400, "n"),
    ({"prompt": ["a"] * 20, "n": 1000}, 400, "n"),  # 20000 sequences, above the 16384 one request may ask for
    ({"prompt": "hi", "stop": 3}, 400, "stop"),
    ({"prompt": "hi", "stream": "sometimes"}, 400, "stream"),  # "yes" is true (pydantic's lax mode)
    ({"prompt": "hi", "logprobs": 99}, 400, "logprobs"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [[]]}, 400, "prompt"),
    ({"prompt": ["a", [1, 2]]}, 400, "prompt"),  # one kind per list (vLLM's list[str] | list[list[int]])
    ({"prompt": [[1, 2], "a"]}, 400, "prompt"),
    ({"prompt": "hi", "user": 5}, 400, "user"),  # OpenAI's user: a string
    ({"prompt": [-1, 5]}, 400, "prompt"),
    ({"prompt": [10 ** 7]}, 400, "prompt"),
    ({"prompt": [1] * 9000, "max_tokens": 1}, 400, "prompt"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "hi", "model": 5}, 400, "model"),
    ({"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    ({"prompt": "hi", "min_tokens": 9000}, 400, "min_tokens"),
    ({"prompt": "hi", "logit_bias": {"99999999": 5}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"-3": 5}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"abc": 5}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": "x"}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": [5]}, 400, "logit_bias"),
    # Structured outputs: a bad constraint names its field (tests/e2e/test_structured_outputs.py has the rest).
    ({"prompt": "hi", "response_format": {"type": "yaml"}}, 400, "response_format.type"),
    ({"prompt": "hi", "guided_json": 5}, 400, "guided_json"),
    ({"prompt": "hi", "guided_choice": []}, 400, "guided_choice"),
    # Features ssmserve lacks are refused by name, not silently ignored.
    ({"prompt": "hi", "use_beam_search": True}, 400, "use_beam_search"),
]


@pytest.mark.parametrize("body,status,param", BAD)
def test_bad_completion_request(server, body, status, param):
    url = server.base_url + "/v1/completions"
    r = httpx.post(url, content=body, headers={"content-type": "application/json"}) if isinstance(body, bytes) \
        else httpx.post(url, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] == status and err["param"] == param
    assert err["type"] == "invalid_request_error"


CHAT_BAD = [
    ({"model": MODEL_NAME}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"content": "hi"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "user": {"id": 1}}, 400, "user"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": {"function": {"name": "f"}}}]}, 400, "messages"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3}, 400, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "model": "nope"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"50280": 1}}, 400, "logit_bias"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {}}}, 400,
     "response_format.json_schema.schema"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, 400, "tool_choice"),
]


HI = [{"role": "user", "content": "hi"}]
INT_RANGE = "must be in [1, 2147483647]"
NAMED = [
    # max_tokens / max_completion_tokens: at least 1 on both endpoints, whatever the value (vLLM), under the name the
    # client sent (chat: max_completion_tokens, else the deprecated max_tokens); never SamplingParams' internal names.
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens", f"max_tokens {INT_RANGE} (got -1)"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", f"max_tokens {INT_RANGE} (got 0)"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2 ** 31}, "max_tokens", f"max_tokens {INT_RANGE} (got 2147483648)"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": -3}, "max_completion_tokens",
     f"max_completion_tokens {INT_RANGE} (got -3)"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 0}, "max_completion_tokens",
     f"max_completion_tokens {INT_RANGE} (got 0)"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens",
     f"max_completion_tokens {INT_RANGE} (got 0)"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 0}, "max_tokens", f"max_tokens {INT_RANGE} (got 0)"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": "eight"}, "max_completion_tokens",
     "max_completion_tokens must be an integer"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": "8.5"}, "max_completion_tokens",
     "max_completion_tokens must be an integer"),
    ("/v1/completions", {"prompt": "hi", "echo": "maybe"}, "echo", "echo must be a boolean"),
    ("/v1/completions", {"prompt": "hi", "echo": 2}, "echo", "echo must be a boolean"),
    ("/v1/completions", {"prompt": "hi", "temperature": "warm"}, "temperature", "temperature must be a number"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 10 ** 9}, "max_completion_tokens",
     "maximum context length"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 2, "min_tokens": 3}, "min_tokens",
     "min_tokens (3) must be less than or equal to max_completion_tokens (2)"),
    # Checked against the model's vocabulary (SamplingParams::validate): the request's field, not SamplingParams.x.
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [50280]}, "stop_token_ids",
     "stop_token_ids[0] = 50280 is out of vocabulary range [0, 50280)"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"50280": 1}}, "logit_bias",
     "logit_bias: token id 50280 is out of vocabulary range [0, 50280)"),
]


@pytest.mark.parametrize("path,body,param,message", NAMED)
def test_errors_name_the_field_the_client_sent(server, path, body, param, message):
    r = httpx.post(server.base_url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err
    assert "SamplingParams" not in err["message"], err


def test_plain_defaults_of_unsupported_features_pass(client):
    # response_format "text", tool_choice "none", empty tools and use_beam_search false are the plain behaviour.
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       response_format={"type": "text"}, tool_choice="none",
                                       tools=[{"type": "function", "function": {"name": "f"}}],
                                       extra_body={"use_beam_search": False})
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize("body,status,param", CHAT_BAD)
def test_bad_chat_request(server, body, status, param):
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_route_and_openai_client_errors(server, client):
    import openai

    r = httpx.get(server.base_url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="hi", temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi")
    # Still serving after all of the above.
    assert client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert server.proc.poll() is None


def test_values_vllm_accepts_pass(server):
    # vLLM's request validators accept these (a break test found them refused): top_logprobs 0 without logprobs,
    # prompt_logprobs 0 with stream (nothing sent), an empty stream_options without stream, any int64 seed.
    base = server.base_url
    chat = {"messages": HI, "max_tokens": 2}
    for path, body in (("/v1/chat/completions", {**chat, "top_logprobs": 0}),
                       ("/v1/chat/completions", {**chat, "stream_options": {}}),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream_options": {}}),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "seed": -1}),
                       ("/v1/chat/completions", {**chat, "seed": -2 ** 63, "temperature": 1.0})):
        r = httpx.post(base + path, json=body, timeout=60)
        assert r.status_code == 200, (body, r.text)
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}), ("/v1/chat/completions", chat)):
        with httpx.stream("POST", base + path, json={**body, "stream": True, "prompt_logprobs": 0}, timeout=60) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert lines and not any("prompt_logprobs" in line for line in lines)
    r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True, "prompt_logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"


def test_values_are_read_as_pydantic_lax_mode_reads_them(server):
    # vLLM's request models are pydantic models in lax mode: integer fields take true / false and digit strings,
    # number fields numeric strings and booleans, boolean fields 0 / 1 and yes / no words (a break test found them
    # refused here). Completions' logprobs true is 1 (the chat API's boolean sent to completions).
    base = server.base_url
    r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": " 3 ", "temperature": "0", "n": True,
                                                   "echo": "false", "logprobs": True, "seed": "-7"}, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["usage"]["completion_tokens"] == 3 and len(r.json()["choices"]) == 1
    assert len(choice["logprobs"]["tokens"]) == 3 and all(len(t) == 1 for t in choice["logprobs"]["top_logprobs"])
    r = httpx.post(base + "/v1/chat/completions", json={"messages": HI, "max_completion_tokens": "2", "logprobs": 1,
                                                        "top_logprobs": "2", "stream": "no", "top_p": True}, timeout=60)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and all(len(c["top_logprobs"]) == 2 for c in content)
    with httpx.stream("POST", base + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": "TRUE"},
                      timeout=60) as s:
        assert s.status_code == 200 and any(line.startswith("data: {") for line in s.iter_lines())


def test_completions_default_max_tokens_is_checked_against_the_context(server):
    # An omitted max_tokens is 16 on /v1/completions and is checked as a given one (vLLM): a prompt that leaves less
    # than 16 tokens of context is a 400, not a shorter completion; chat takes what the context leaves.
    max_len = httpx.get(server.base_url + "/v1/models").json()["data"][0]["max_model_len"]
    ids = [1000] * (max_len - 10)
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": ids}, timeout=120)
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"], r.text
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": ids, "max_tokens": 10}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 10, r.text
    # An explicit null is what the context leaves (vLLM's get_max_tokens), not 16.
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": ids, "max_tokens": None, "ignore_eos": True},
                   timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 10, r.text
