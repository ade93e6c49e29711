# tiny-qwen3_5_moe end to end (Qwen3.5 / Qwen3.6 MoE layout in the multimodal wrapper: Gated DeltaNet and gated
# attention layers, MoE with a sigmoid-gated shared expert, text weights under model.language_model.*):
# `ssmserve generate` with no flag beyond --model and --max-tokens; `ssmserve serve` through the `openai` client
# (streaming completions and chat equal their non-streaming answers and `ssmserve generate`, also streamed
# concurrently; the checkpoint has no chat template, so chat uses the plain default one, as for the other tiny
# models); and the Python package's LLM on the same folder. A ~480-token prompt crosses the DeltaNet chunk (64) and the
# attention layers' KV block (~114 tokens). Skipped when ../shared/models (SSMSERVE_MODELS_DIR) lacks the checkpoint.
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import BINARY, ROOT, Server, cli_generate

MODELS_DIR = Path(os.environ.get("SSMSERVE_MODELS_DIR", ROOT.parent / "shared" / "models"))
NAME = "tiny-qwen3_5_moe"
MODEL = MODELS_DIR / NAME
MESSAGES = [{"role": "system", "content": "You are a scribe."}, {"role": "user", "content": "Tell me of the flood."}]
RENDERED = "System: You are a scribe.\nUser: Tell me of the flood.\nAssistant:"
PROMPTS = ["And the LORD said unto Moses,", "It is a truth universally acknowledged",
           " ".join(f"In the year {i} the rains came." for i in range(60))]

pytestmark = pytest.mark.skipif(not (MODEL / "config.json").exists(), reason=f"{MODEL} not found (set SSMSERVE_MODELS_DIR)")


@pytest.fixture(scope="module")
def expected():
    """`ssmserve generate --json` for PROMPTS, 16 greedy tokens each (the reference for everything below)."""
    out = cli_generate(PROMPTS, 16, model=MODEL)
    assert len(out[2]["prompt_token_ids"]) > 2 * 64  # past several DeltaNet chunks and a KV block
    return out


@pytest.fixture(scope="module")
def client():
    import openai

    s = Server("--max-num-seqs", 8, model=MODEL, model_name=NAME)
    yield openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
    assert s.stop() == 0, "server did not shut down cleanly"


def test_generate_needs_only_the_model(expected):
    r = subprocess.run([str(BINARY), "generate", "--model", str(MODEL), "--prompt", PROMPTS[0], "--max-tokens", "16"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert r.returncode == 0, r.stderr
    assert expected[0]["text"] and expected[0]["text"] in r.stdout
    assert len(expected[0]["token_ids"]) == 16 and all(0 <= t < 50280 for t in expected[0]["token_ids"])
    j = subprocess.run([str(BINARY), "generate", "--model", str(MODEL), "--prompt", PROMPTS[0], "--max-tokens", "16", "--json"],
                       capture_output=True, text=True, timeout=120, check=True, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    assert json.loads(j.stdout)["token_ids"] == expected[0]["token_ids"]


def _stream_completion(client, prompt, max_tokens):
    chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, finals, chunks[-1].usage


def test_streamed_completions_equal_generate(client, expected):
    for prompt, ref in zip(PROMPTS, expected):
        text, finals, usage = _stream_completion(client, prompt, 16)
        assert text == ref["text"], prompt[:40]
        assert finals == [ref["finish_reason"]]
        assert usage.prompt_tokens == len(ref["prompt_token_ids"]) and usage.completion_tokens == len(ref["token_ids"])
        r = client.completions.create(model=NAME, prompt=prompt, max_tokens=16, temperature=0)
        assert r.choices[0].text == ref["text"]


def test_concurrent_streams_equal_generate(client, expected):
    got = [None] * (2 * len(PROMPTS))
    errors = []

    def worker(i):
        try:
            got[i] = _stream_completion(client, PROMPTS[i % len(PROMPTS)], 16)[0]
        except Exception as e:  # reported below, with the others
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(got))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert got == [expected[i % len(PROMPTS)]["text"] for i in range(len(got))]


def test_streamed_chat_equals_chat_and_completion(client):
    ref = client.completions.create(model=NAME, prompt=RENDERED, max_tokens=16, temperature=0)
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == ref.choices[0].text
    chunks = list(client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert [m.id for m in client.models.list().data] == [NAME]


def test_python_llm_equals_generate(expected):
    import ssmserve  # installed by `pip install .` (scripts/test.sh does it)

    llm = ssmserve.LLM(str(MODEL), max_num_seqs=4, threads=2)
    outs = llm.generate(PROMPTS, ssmserve.SamplingParams(temperature=0, max_tokens=16))
    for out, ref in zip(outs, expected):
        assert out.prompt_token_ids == ref["prompt_token_ids"]
        c = out.outputs[0]
        assert c.text == ref["text"] and c.token_ids == ref["token_ids"] and c.finish_reason == ref["finish_reason"]
    with_logprobs = llm.generate(PROMPTS[2], ssmserve.SamplingParams(temperature=0, max_tokens=16, logprobs=1))[0].outputs[0]
    assert with_logprobs.token_ids == expected[2]["token_ids"] and len(with_logprobs.logprobs) == 16
