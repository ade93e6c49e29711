# `ssmserve serve` on the Mamba hybrid checkpoints (tiny-granitemoehybrid: Mamba-2 + attention layers with MoE FFNs;
# tiny-nemotron_h: Mamba-2, attention, MLP and MoE layers) through the `openai` client: streaming completions and
# chat equal their non-streaming answers and `ssmserve generate`, also with requests streamed concurrently (prompts
# past the attention layers' KV block, batched with each other). The checkpoints have no chat template: chat uses
# the plain default one (as for tiny-mamba, tests/e2e/test_chat.py). Skipped when ../shared/models lacks them.
import os
import threading
from pathlib import Path

import pytest

from conftest import ROOT, Server, cli_generate

MODELS_DIR = Path(os.environ.get("SSMSERVE_MODELS_DIR", ROOT.parent / "shared" / "models"))
MESSAGES = [{"role": "system", "content": "You are a scribe."}, {"role": "user", "content": "Tell me of the flood."}]
RENDERED = "System: You are a scribe.\nUser: Tell me of the flood.\nAssistant:"
PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged",
           # ~480 tokens: past Nemotron-H's 205-token and Granite's 406-token KV blocks
           " ".join(f"In the year {i} the rains came." for i in range(60))]


@pytest.fixture(scope="module", params=["tiny-granitemoehybrid", "tiny-nemotron_h"])
def hybrid(request):
    model = MODELS_DIR / request.param
    if not (model / "config.json").exists():
        pytest.skip(f"{model} not found (set SSMSERVE_MODELS_DIR)")
    import openai

    s = Server("--max-num-seqs", 8, model=model, model_name=request.param)
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    yield request.param, model, client
    assert s.stop() == 0, "server did not shut down cleanly"


def _stream_completion(client, name, prompt, max_tokens):
    chunks = list(client.completions.create(model=name, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, finals, chunks[-1].usage


def test_streamed_completions_equal_generate(hybrid):
    name, model, client = hybrid
    expected = cli_generate(PROMPTS, 16, model=model)
    assert len(expected[2]["prompt_token_ids"]) > 406
    for prompt, ref in zip(PROMPTS, expected):
        text, finals, usage = _stream_completion(client, name, prompt, 16)
        assert text == ref["text"], prompt[:40]
        assert finals == [ref["finish_reason"]]
        assert usage.prompt_tokens == len(ref["prompt_token_ids"]) and usage.completion_tokens == len(ref["token_ids"])
        r = client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0)
        assert r.choices[0].text == ref["text"]


def test_concurrent_streams_equal_generate(hybrid):
    name, model, client = hybrid
    expected = cli_generate(PROMPTS, 12, model=model)
    got = [None] * (2 * len(PROMPTS))
    errors = []

    def worker(i):
        try:
            got[i] = _stream_completion(client, name, PROMPTS[i % len(PROMPTS)], 12)[0]
        except Exception as e:  # reported below, with the others
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(got))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert got == [expected[i % len(PROMPTS)]["text"] for i in range(len(got))]


def test_streamed_chat_equals_chat_and_completion(hybrid):
    name, _, client = hybrid
    ref = client.completions.create(model=name, prompt=RENDERED, max_tokens=16, temperature=0)
    r = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref.choices[0].text
    chunks = list(client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [m.id for m in client.models.list().data] == [name]
