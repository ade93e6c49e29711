# Speculative decoding (issue 29) as users see it: `--speculative-config` (vLLM's JSON) on generate and serve, the
# same text and ids as without it (n-gram and draft-model proposers, greedy and seeded sampling), the spec_decode_*
# Prometheus counters, and clear errors naming the field for bad configs.
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BINARY, MODEL, ROOT, Server

ENV = dict(os.environ, OMP_WAIT_POLICY="passive")
QUOTE = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
         "of a wife.\n\nRepeat: It is a truth universally acknowledged, that")
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})
SHARED = ROOT.parent / "shared" / "models"


def run(*args, stdin=None):
    return subprocess.run([str(BINARY), *map(str, args)], input=stdin, capture_output=True, text=True, env=ENV, timeout=300)


def generate_json(*flags, prompts=(QUOTE, "Once upon a time", QUOTE + " a single")):
    lines = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
    r = run("generate", "--model", MODEL, "--prompts-file", "-", "--json", "--max-tokens", "24", "--threads", "2",
            "--logprobs", "2", *flags, stdin=lines)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def strip(outs):
    return [(o["token_ids"], o["text"], o.get("logprobs")) for o in outs]


@pytest.mark.parametrize("sampling", [[], ["--temperature", "0.9", "--top-p", "0.9", "--seed", "7"]])
def test_generate_with_ngram_equals_plain(sampling):
    plain = generate_json(*sampling)
    spec = generate_json("--speculative-config", NGRAM, *sampling)
    assert strip(spec) == strip(plain)


def test_draft_model_equals_plain_and_accepts():
    draft = json.dumps({"method": "draft_model", "model": str(MODEL), "num_speculative_tokens": 3})
    plain = generate_json()
    spec = generate_json("--speculative-config", draft)
    assert strip(spec) == strip(plain)
    # A Mamba-1 draft identical to the target drafts the target's own greedy tokens: the bench reports full acceptance.
    r = run("bench", "throughput", "--model", MODEL, "--num-prompts", "2", "--input-len", "16", "--output-len", "16",
            "--threads", "2", "--speculative-config", draft)
    assert r.returncode == 0, r.stderr
    assert "speculative decoding: acceptance rate 100.0%" in r.stdout, r.stdout


def test_serve_reports_spec_decode_metrics():
    import openai

    s = Server("--speculative-config", NGRAM, "--max-num-seqs", 8)
    try:
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none", max_retries=0, timeout=120)
        got = client.completions.create(model="tiny-mamba", prompt=QUOTE, max_tokens=24, temperature=0)
        want = generate_json(prompts=(QUOTE,))[0]
        assert got.choices[0].text == want["text"]
        m = s.metrics()
        assert m["ssmserve:spec_decode_num_drafts_total"] > 0
        assert m["ssmserve:spec_decode_num_draft_tokens_total"] >= m["ssmserve:spec_decode_num_accepted_tokens_total"] >= 0
        assert m["ssmserve:spec_decode_num_draft_tokens_total"] > 0
        assert "ssmserve:spec_decode_num_accepted_tokens_per_pos_total" in m
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("config,needle", [
    ("{", "not valid JSON"),
    ('{"method": "medusa7", "num_speculative_tokens": 2}', "unknown method"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 17}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}', "unknown field \"lookahead\""),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', "\"model\""),
    ('{"method": "draft_model", "model": "/nonexistent/draft", "num_speculative_tokens": 2}', "does not exist"),
])
def test_bad_speculative_configs_are_named(config, needle):
    r = run("generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "2", "--speculative-config", config)
    assert r.returncode == 1
    assert "error:" in r.stderr and needle in r.stderr and "--speculative-config" in r.stderr, r.stderr


def test_draft_model_with_another_tokenizer_is_refused():
    other = SHARED / "tiny-qwen3_5_moe"
    if not (other / "config.json").exists():
        pytest.skip("no shared tiny-qwen3_5_moe")
    draft = json.dumps({"method": "draft_model", "model": str(other), "num_speculative_tokens": 2})
    r = run("generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "2", "--speculative-config", draft)
    assert r.returncode == 1
    assert "--speculative-config" in r.stderr and ("tokenizer" in r.stderr or "vocabulary" in r.stderr), r.stderr
