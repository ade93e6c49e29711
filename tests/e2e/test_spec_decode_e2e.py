# Speculative decoding (issue 29) as users see it: `--speculative-config` (vLLM's JSON) on generate and serve, the
# same text and ids as without it (n-gram and draft-model proposers, greedy and seeded sampling), the spec_decode_*
# Prometheus counters, and clear errors naming the field for bad configs; with --num-scheduler-steps too.
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


def test_generate_with_ngram_and_multi_step_equals_plain():
    # --num-scheduler-steps with speculation: a step that verifies drafts runs one model step, steps without drafts
    # (no n-gram match, or the adaptive draft length at 0) run the multi-step burst; greedy output is unchanged.
    plain = generate_json()
    spec = generate_json("--speculative-config", NGRAM, "--num-scheduler-steps", "4")
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


def test_method_left_out_is_inferred_from_the_model_as_vllm():
    # vLLM's form without "method": a folder is a draft model, "ngram" prompt lookup.
    plain = generate_json()
    for cfg in ({"model": str(MODEL), "num_speculative_tokens": 3},
                {"model": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}):
        assert strip(generate_json("--speculative-config", json.dumps(cfg))) == strip(plain), cfg


def test_hybrid_draft_model_pool_is_sized_like_the_targets():
    # A hybrid draft's KV pages: one per request plus one request at the whole context (the target's default pool),
    # not --max-num-seqs requests at the whole context (it was 17153 blocks here, min'ed with a quarter of RAM: GiBs
    # allocated and zeroed at startup for a 28M-parameter draft). Requests short of pages get no drafts: same output.
    hybrid = SHARED / "tiny-nemotron_h"
    if not (hybrid / "config.json").exists():
        pytest.skip("no shared tiny-nemotron_h")
    draft = json.dumps({"method": "draft_model", "model": str(hybrid), "num_speculative_tokens": 3})
    r = run("--log-level", "info", "generate", "--model", MODEL, "--prompt", "Hello", "--max-tokens", "2", "--threads",
            "2", "--speculative-config", draft)
    assert r.returncode == 0, r.stderr
    # 2 x 256 + 1 state blocks, 256 pages, ceil((8192 + 16) / 128) pages (tiny-mamba has no context: 8192).
    assert "(834 state blocks)" in r.stderr and "draft model gets" not in r.stderr, r.stderr
    plain = generate_json("--max-num-seqs", "2")
    spec = generate_json("--max-num-seqs", "2", "--max-model-len", "128", "--speculative-config", draft)
    assert strip(spec) == strip(plain)


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
    ('{"method": "replay", "num_speculative_tokens": 2}', "method \"replay\" is a benchmark-only drafter"),
    ('{"method": "replay", "num_speculative_tokens": 2, "acceptance_rate": 2}', "\"acceptance_rate\""),
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
    # Its tokenizer.json is tiny-mamba's, byte for byte: the message names what differs, the class transformers loads
    # each as (from config.json's model_type), and where the ids part.
    assert (other / "tokenizer.json").read_bytes() == (MODEL / "tokenizer.json").read_bytes()
    assert ('loads the draft\'s tokenizer as Qwen3_5Tokenizer (model_type "qwen3_5_moe") and the target\'s as '
            'TokenizersBackend (tokenizer.json\'s own pipeline; model_type "mamba")') in r.stderr, r.stderr
    assert "the draft has " in r.stderr and " where the target has " in r.stderr, r.stderr


REPLAY = json.dumps({"method": "replay", "num_speculative_tokens": 3, "seed": 1})


@pytest.mark.parametrize("model", ["tiny-mamba", "tiny-minimax-dummy"])
def test_bench_latency_replay_rates(model, tmp_path):
    # The benchmark-only replay drafter: a plain greedy pass records the continuations, then rate 1 accepts every
    # draft (rows of k + 1 tokens) and rate 0 none (rows of 1 token), per batch size.
    flags = ["--model", MODEL] if model == "tiny-mamba" else [
        "--model", ROOT / "tests/data/tiny-hybrids/tiny-minimax-dummy", "--load-format", "dummy"]
    out = tmp_path / "replay.json"
    r = run("bench", "latency", *flags, "--device", "cpu", "--input-len", "8", "--output-len", "24", "--batch-size", "1",
            "2", "--num-iters", "1", "--num-iters-warmup", "0", "--threads", "2", "--speculative-config", REPLAY,
            "--replay-acceptance-rates", "0", "1", "--output-json", out)
    assert r.returncode == 0, r.stderr
    assert "speculative decoding: replay drafter, k = 3" in r.stdout, r.stdout
    assert "plain:" in r.stdout and "rate 1:" in r.stdout and "acceptance rate 100.0%" in r.stdout, r.stdout
    rows = json.loads(out.read_text())["results"]
    assert [row["batch_size"] for row in rows] == [1, 2]
    for row in rows:
        assert row["plain_decode_tokens_per_s"] > 0 and row["num_speculative_tokens"] == 3
        by_rate = {x["rate"]: x for x in row["replay"]}
        assert by_rate[0]["acceptance_rate"] == 0 and by_rate[0]["mean_acceptance_length"] == 1
        assert by_rate[1]["acceptance_rate"] == 1 and by_rate[1]["mean_acceptance_length"] > 3
        assert by_rate[1]["decode_tokens_per_s"] > 0 and by_rate[1]["speedup"] > 0


def test_bench_latency_replay_rates_need_the_replay_method():
    r = run("bench", "latency", "--model", MODEL, "--replay-acceptance-rates", "1", "--num-iters", "1")
    assert r.returncode == 1 and "--replay-acceptance-rates needs --speculative-config with method replay" in r.stderr, r.stderr
    r = run("bench", "latency", "--model", MODEL, "--speculative-config", REPLAY, "--replay-acceptance-rates", "1.5",
            "--num-iters", "1")
    assert r.returncode == 1 and "[0, 1]" in r.stderr, r.stderr
